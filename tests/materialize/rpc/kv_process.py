"""A headrace Transactor in its own process, served over gRPC by run_grpc_driver on $HEADRACE_DRIVER_ADDRESS:
the KvTransactor of tests/materialize/kv_driver.py over a directory.

    python -m tests.materialize.rpc.kv_process DIRECTORY
"""

from __future__ import annotations

import sys
from pathlib import Path

from headrace.materialize.rpc.server import run_grpc_driver
from tests.materialize.kv_driver import KvStore, KvTransactor

if __name__ == "__main__":
    store = KvStore(Path(sys.argv[1]))
    run_grpc_driver(lambda _open: KvTransactor(store))
