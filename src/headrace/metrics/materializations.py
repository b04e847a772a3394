"""Every materialization's transactions as the server's drivers see them (the serving store's driver and the sinks'
built-in drivers run in the server process: materialize/driver.py records here), and the per-materialization
relation `headrace_internal.materializations` built from them, the pipeline's report, the sinks' status and the
logs' ends.

Why the driver side: the pipeline commits pipelined (foreachBatch returns once StartCommit is sent), so a commit
that fails is only noticed by the pipeline at its next batch, which may never come while nothing arrives. The
driver sees the failure the moment it happens."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from headrace.metrics.histogram import Histogram

# A materialization with work pending (its log ahead of its commits) and no commit for this long is "stalled".
STALL_AFTER_S = 30.0


@dataclass
class MaterializationRecord:
    """One materialization's transactions since the server started (mutated under the ledger's lock)."""

    transactions: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    opens: int = 0  # Open calls: a (re)start of the pipeline's query or a sink's runtime
    commit_seconds: Histogram = field(default_factory=Histogram)
    last_commit_at: float | None = None  # wall clock, s since the epoch
    last_commit_seconds: float | None = None
    committed_position: int | None = None  # the runtime checkpoint's log_end (sources and tables)
    last_error: str | None = None
    last_error_at: float | None = None


class MaterializationLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, MaterializationRecord] = {}

    def _record(self, name: str) -> MaterializationRecord:
        record = self._records.get(name)
        if record is None:
            record = self._records[name] = MaterializationRecord()
        return record

    def opened(self, name: str) -> None:
        with self._lock:
            self._record(name).opens += 1

    def committed(self, name: str, seconds: float, runtime_checkpoint: dict[str, Any] | None) -> None:
        with self._lock:
            record = self._record(name)
            record.transactions += 1
            record.consecutive_failures = 0
            record.commit_seconds.observe(seconds)
            record.last_commit_at = time.time()
            record.last_commit_seconds = seconds
            log_end = (runtime_checkpoint or {}).get("log_end")
            if isinstance(log_end, int):
                record.committed_position = log_end

    def failed(self, name: str, error: str) -> None:
        with self._lock:
            record = self._record(name)
            record.failures += 1
            record.consecutive_failures += 1
            record.last_error = error[:500]
            record.last_error_at = time.time()

    def get(self, name: str) -> MaterializationRecord | None:
        with self._lock:
            record = self._records.get(name)
            if record is None:
                return None
            copy = MaterializationRecord(**{**record.__dict__})
            copy.commit_seconds = Histogram.from_json(record.commit_seconds.to_json())
            return copy

    def names(self) -> list[str]:
        with self._lock:
            return list(self._records)

    def forget(self, name: str) -> None:
        with self._lock:
            self._records.pop(name, None)


LEDGER = MaterializationLedger()  # one per server process: its drivers record here
