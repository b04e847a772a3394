"""Deliberately broken drivers for the conformance kit's tests: the PARQUET driver with one rule of its pattern
broken, served over gRPC as an external driver (`command:python tests/materialize/broken_driver.py <mode>`).

Modes:
  apply-at-commit  applies each transaction at StartCommit, before the runtime's recovery log holds it, and claims
                   nothing pending: after a crash between StartedCommit and the log's commit the runtime replays a
                   transaction that already landed, so it lands twice (scenario 3 must FAIL).
  ignore-fence     bumps the fence at Open but never checks it: a zombie runtime's commit is staged and applied
                   (scenario 4 must FAIL).
The endpoint config is PARQUET's: {"path": "/an/absolute/directory"}."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from headrace.materialize.drivers.parquet import ParquetConnector, ParquetTransactor, _read_manifest
from headrace.materialize.protocol import Open, StartedCommit
from headrace.materialize.rpc.server import run_grpc_driver


class ApplyAtCommit(ParquetTransactor):
    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit:
        super().start_commit(runtime_checkpoint)
        self.acknowledge()  # the bug: applied before the runtime's log committed the transaction
        return StartedCommit(state=None)


class IgnoreFence(ParquetTransactor):
    def _check_fence(self, directory: Path) -> dict[str, Any]:
        manifest = _read_manifest(directory)  # the bug: the fence is not compared with ours
        assert manifest is not None
        return manifest


MODES = {"apply-at-commit": ApplyAtCommit, "ignore-fence": IgnoreFence}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in MODES:
        raise SystemExit(f"usage: broken_driver.py {{{'|'.join(MODES)}}}")
    transactor = MODES[sys.argv[1]]

    def factory(_open: Open) -> ParquetTransactor:
        return transactor()

    run_grpc_driver(factory, ParquetConnector())


if __name__ == "__main__":
    main()
