"""A runtime process for the kill -9 recovery test: commits batches through a recovery log, then hangs.

    python recovery_worker.py HOST PORT LOG_PATH EPOCH BATCHES

After each committed transaction it prints "committed <batch id>"; after the last it never sends the next
Acknowledge (it sleeps), so a kill -9 lands between StartedCommit and Acknowledged."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from headrace.materialize.protocol import Binding, MaterializationSpec
from headrace.materialize.recovery import RecoveryLog
from headrace.materialize.runtime import RpcDriverConnection, Runtime

SPEC = MaterializationSpec("counts", (Binding(("counts",), ("key",), ("count",),
                                              {"key": "VARCHAR", "count": "BIGINT"}),))
KEYS = [f"k{i}" for i in range(5)]


def add_counts(older: dict[str, Any] | None, newer: dict[str, Any]) -> dict[str, Any]:
    return {**newer, "count": newer["count"] + (older["count"] if older else 0)}


def batch(batch_id: int) -> list[tuple[int, list[Any], dict[str, Any]]]:
    return [(0, [key], {"key": key, "count": batch_id + 1}) for key in KEYS]


def runtime_for(host: str, port: int, log: Path) -> Runtime:
    return Runtime(RpcDriverConnection(host, port, io_timeout=30), SPEC, reducers=[add_counts],
                   recovery_log=RecoveryLog(log))


def main() -> None:
    host, port, log, epoch, batches = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    runtime = runtime_for(host, port, log)
    runtime.open()
    for batch_id in range(batches):
        runtime.transact(batch(batch_id), {"epoch": epoch, "batch_id": batch_id})
        print(f"committed {batch_id}", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    main()
