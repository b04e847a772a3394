"""Each source's pipeline state, visible in SQL as `headrace_internal.source_status` (store/system_tables.py):

    source          text         "schema.name"
    materialization text         source_<id>
    state           text         running | failing (no batch committed since its last error) | starting
    failures        bigint       failed starts and stopped queries since the pipeline process started
    last_error      text         the last failure, one line (the driver's error, or the query's exception)
    last_error_at   timestamptz  when it was seen
    last_batch_at   timestamptz  when its last batch was handed to the store
    next_retry_at   timestamptz  while failing: when the pipeline restarts the query (backoff: retry_delay_s)
    batches         bigint       micro-batches handed to the store since the pipeline process started
    rows            bigint       log records in them
    last_batch_rows bigint       records in the last one
    last_batch_seconds double    its duration, and its phases: read (Spark job collecting the log records),
    last_read_seconds, last_source_rows_seconds, last_views_seconds, last_transaction_seconds (double)
                                 source_rows (net changes), views (view documents), transaction (the runtime's
                                 Load / reduce / Store / StartCommit)

The pipeline process sends a report over its control connection whenever it changes (`report`, in the process;
`PipelineStatus.update`, in the server). Only the server's memory holds it: after a restart the pipeline reports
again within a second of starting each source. A failing source still takes webhooks (the log decouples them);
this relation is where that shows.

The pipeline process itself, as the supervisor sees it, is `headrace_internal.pipeline_status` (one row):

    spark_master    text         --spark-master (or SPARK_REMOTE)
    state           text         starting | running | restarting (it exited; restarted with backoff) | failed
                                 (it cannot start on this master: the server exits)
    restarts        bigint       times the pipeline process exited and was restarted since the server started
    last_error      text         why it last exited (its last logged error, one line)
    last_error_at   timestamptz
    started_at      timestamptz  when the running (or starting) pipeline process was started

and in /metrics: headrace_pipeline_up (1 while running), headrace_pipeline_restarts_total,
headrace_pipeline_sources{state} (sources per state of source_status), and per query (source or table)
headrace_pipeline_batches_total, headrace_pipeline_batch_rows_total, headrace_pipeline_batch_seconds (histogram)
and headrace_pipeline_batch_phase_seconds_total{phase} (docs/metrics.md).

The micro-batch figures are counted in the pipeline process (`batch_stats`, kept by pipeline/batches.py and
table_batches.py per materialization, across restarts of its query) and travel in its status report: cumulative
since that process started (a restart resets them, as a Prometheus counter
reset, which rate() handles)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

BATCH_PHASES = ("read", "source_rows", "views", "transaction")
STATUS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("source", "VARCHAR"), ("materialization", "VARCHAR"), ("state", "VARCHAR"), ("failures", "BIGINT"),
    ("last_error", "VARCHAR"), ("last_error_at", "TIMESTAMPTZ"), ("last_batch_at", "TIMESTAMPTZ"),
    ("next_retry_at", "TIMESTAMPTZ"), ("batches", "BIGINT"), ("rows", "BIGINT"), ("last_batch_rows", "BIGINT"),
    ("last_batch_seconds", "DOUBLE"), *((f"last_{phase}_seconds", "DOUBLE") for phase in BATCH_PHASES),
)
MAX_ERROR_CHARS = 500
_FIELDS = [name for name, _ in STATUS_COLUMNS]


def retry_delay_s(failures: int) -> float:
    """The pipeline's backoff before restarting a query after its n-th failure (pipeline/process.py's
    restart_failed and pipeline/batch_loop.py's _backoff: the same formula, asserted by a test)."""
    return min(10.0, 0.5 * 2 ** min(failures, 5))


class BatchStats:
    """One query's micro-batches, counted in the pipeline process (pipeline/batches.py) and sent in its report."""

    __slots__ = ("batches", "rows", "seconds", "phase_totals", "last_rows", "last_seconds", "last_phases")

    def __init__(self) -> None:
        from headrace.metrics.histogram import Histogram

        self.batches = 0
        self.rows = 0
        self.seconds = Histogram()
        self.phase_totals = dict.fromkeys(BATCH_PHASES, 0.0)
        self.last_rows = 0
        self.last_seconds = 0.0
        self.last_phases = dict.fromkeys(BATCH_PHASES, 0.0)

    def observe(self, rows: int, phases: dict[str, float]) -> None:
        seconds = sum(phases.values())
        self.batches += 1
        self.rows += rows
        self.seconds.observe(seconds)
        for phase in BATCH_PHASES:
            self.phase_totals[phase] += phases.get(phase, 0.0)
        self.last_rows, self.last_seconds = rows, seconds
        self.last_phases = {phase: phases.get(phase, 0.0) for phase in BATCH_PHASES}

    def to_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "rows": self.rows, "seconds": self.seconds.to_json(),
                "phase_totals": dict(self.phase_totals), "last_rows": self.last_rows,
                "last_seconds": self.last_seconds, "last_phases": dict(self.last_phases)}
# The Python exception line of a traceback that crossed py4j ("headrace.materialize.runtime.DriverError: ...").
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception|Off)): (.+)$")


def one_line_error(error: BaseException | str | None) -> str | None:
    """A failure as one readable line: the innermost Python exception of a Spark query's error when there is one
    (its message carries Java and Python stack traces), else the first line; at most MAX_ERROR_CHARS."""
    if error is None:
        return None
    text = str(error)
    found = [match for line in text.splitlines() if (match := _EXCEPTION_LINE.match(line.strip()))]
    line = f"{found[-1].group(1)}: {found[-1].group(2)}" if found else (text.strip().splitlines() or [""])[0]
    return line[:MAX_ERROR_CHARS]


_BATCH_STATS: dict[str, BatchStats] = {}  # per materialization, in the pipeline process: across query restarts
_BATCH_STATS_LOCK = threading.Lock()


def batch_stats(materialization: str) -> BatchStats:
    """The pipeline process's BatchStats of one query (shared by its successive foreachBatch functions)."""
    with _BATCH_STATS_LOCK:
        stats = _BATCH_STATS.get(materialization)
        if stats is None:
            stats = _BATCH_STATS[materialization] = BatchStats()
        return stats


def status_row(source: str, materialization: str, failures: int, last_error: str | None,
               last_error_at: float | None, last_batch_at: float | None, started: bool) -> dict[str, Any]:
    """One source's report (times in seconds since the epoch), with its micro-batch figures (`batch_stats`)."""
    if not started:
        state = "failing" if last_error_at is not None else "starting"
    elif last_error_at is not None and (last_batch_at is None or last_batch_at < last_error_at):
        state = "failing"
    else:
        state = "running"
    with _BATCH_STATS_LOCK:
        stats = _BATCH_STATS.get(materialization)
    return {"source": source, "materialization": materialization, "state": state, "failures": failures,
            "last_error": last_error, "last_error_at": last_error_at, "last_batch_at": last_batch_at,
            "next_retry_at": last_error_at + retry_delay_s(failures) if state == "failing" and last_error_at else None,
            "batch": stats.to_json() if stats is not None else None}


PIPELINE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("spark_master", "VARCHAR"), ("state", "VARCHAR"), ("restarts", "BIGINT"), ("last_error", "VARCHAR"),
    ("last_error_at", "TIMESTAMPTZ"), ("started_at", "TIMESTAMPTZ"),
)


class PipelineStatus:
    """The server's copy of the pipeline's latest report, and of the pipeline process's own state (thread-safe:
    read by queries on other threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._process: dict[str, Any] = {"spark_master": None, "state": "starting", "restarts": 0,
                                         "last_error": None, "last_error_at": None, "started_at": None}

    def pipeline_starting(self, spark_master: str) -> None:
        with self._lock:
            if self._process["state"] != "restarting":
                self._process["state"] = "starting"
            self._process.update(spark_master=spark_master, started_at=time.time())

    def pipeline_ready(self) -> None:
        with self._lock:
            self._process["state"] = "running"

    def pipeline_exited(self, code: int | None, error: str | None, fatal: bool = False) -> None:
        with self._lock:
            self._process.update(state="failed" if fatal else "restarting", last_error=error,
                                 last_error_at=time.time())
            if not fatal:
                self._process["restarts"] += 1

    def pipeline(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._process)

    def pipeline_rows(self) -> list[tuple[Any, ...]]:
        row = self.pipeline()
        return [tuple(_microseconds(row[name]) if name.endswith("_at") else row[name] for name, _ in PIPELINE_COLUMNS)]

    def update(self, rows: Iterable[dict[str, Any]]) -> None:
        with self._lock:
            self._rows = [dict(row) for row in rows]

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._rows]

    def get(self, materialization: str) -> dict[str, Any] | None:
        with self._lock:
            return next((dict(row) for row in self._rows if row.get("materialization") == materialization), None)

    def rows(self) -> list[tuple[Any, ...]]:
        with self._lock:
            rows = sorted(self._rows, key=lambda row: str(row.get("source")))
        return [tuple(_microseconds(row.get(name)) if name.endswith("_at") else row.get(name) for name in _FIELDS)
                for row in map(_with_batch_columns, rows)]


def _with_batch_columns(row: dict[str, Any]) -> dict[str, Any]:
    batch = row.get("batch") or {}
    phases = batch.get("last_phases") or {}
    return {**row, "batches": batch.get("batches", 0), "rows": batch.get("rows", 0),
            "last_batch_rows": batch.get("last_rows"), "last_batch_seconds": batch.get("last_seconds"),
            **{f"last_{phase}_seconds": phases.get(phase) for phase in BATCH_PHASES}}


def _microseconds(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1_000_000)


class PipelineCollector(Collector):
    """The pipeline's state on GET /metrics, read at scrape time."""

    def __init__(self, status: PipelineStatus) -> None:
        self._status = status

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        process = self._status.pipeline()
        yield GaugeMetricFamily("headrace_pipeline_up", "1 while the pipeline process runs and has a Spark session.",
                                value=1 if process["state"] == "running" else 0)
        yield CounterMetricFamily("headrace_pipeline_restarts", "Times the pipeline process exited and was restarted.",
                                  value=process["restarts"])
        sources = GaugeMetricFamily("headrace_pipeline_sources", "Sources and tables by pipeline state "
                                    "(headrace_internal.source_status).", labels=["state"])
        counts = {"running": 0, "failing": 0, "starting": 0}
        for row in self._status.snapshot():
            counts[str(row.get("state"))] = counts.get(str(row.get("state")), 0) + 1
        for state, count in sorted(counts.items()):
            sources.add_metric([state], count)
        yield sources
        yield from batch_families(self._status.snapshot())


def batch_families(rows: Iterable[dict[str, Any]]) -> Iterator[Any]:
    """Each query's micro-batch families, from the rows the pipeline reported (labels: source, materialization)."""
    from prometheus_client.core import HistogramMetricFamily

    from headrace.metrics.histogram import Histogram

    labels = ["source", "materialization"]
    batches = CounterMetricFamily("headrace_pipeline_batches", "Micro-batches handed to the store.", labels=labels)
    records = CounterMetricFamily("headrace_pipeline_batch_rows", "Log records in those micro-batches.", labels=labels)
    seconds = HistogramMetricFamily("headrace_pipeline_batch_seconds", "Duration of a micro-batch, from the "
                                    "query's call to StartCommit sent.", labels=labels)
    phases = CounterMetricFamily("headrace_pipeline_batch_phase_seconds", "Seconds spent per phase of the "
                                 "micro-batches (read, source_rows, views, transaction).", labels=[*labels, "phase"])
    for row in rows:
        batch = row.get("batch")
        if not batch:
            continue
        values = [str(row.get("source")), str(row.get("materialization"))]
        batches.add_metric(values, batch.get("batches", 0))
        records.add_metric(values, batch.get("rows", 0))
        histogram = Histogram.from_json(batch.get("seconds") or {})
        seconds.add_metric(values, histogram.buckets(), histogram.total)
        for phase in BATCH_PHASES:
            phases.add_metric([*values, phase], (batch.get("phase_totals") or {}).get(phase, 0.0))
    yield from (batches, records, seconds, phases)
