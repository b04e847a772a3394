"""`headrace_internal.materializations`: one row per source, table, materialized view and sink, as the server sees
it now: state, committed position, lag, freshness, last error, retries (docs/store.md, "System relations").

    materialization    text         source_<id> | table_<id> | view_<id> | sink_<id>
    kind               text         source | table | view | sink
    schema, name       text         the object
    transaction_of     text         the materialization whose transactions maintain it (a view: its root source's
                                    or table's; the others: their own)
    state              text         running | starting (not reported by the pipeline yet, or a sink starting) |
                                    stalled (work pending and no commit for STALL_AFTER_S) | failed (its last
                                    transaction or query failed; retried with backoff) | stopped (a sink)
    transactions       bigint       committed since the server started (the in-process drivers' count)
    failures           bigint       failed transactions since the server started
    attempts           bigint       consecutive failed attempts (0 once a transaction commits)
    restarts           bigint       the pipeline's restarts of the query (sources, tables, views), or the sink's
                                    failures since it last committed
    committed_position bigint       sources, tables, views: the log offset committed up to; sinks: the upstream
                                    commit timestamp (ms since the epoch) the target holds
    log_position       bigint       sources, tables, views: the end of the log (NULL for sinks)
    lag_bytes          bigint       log_position - committed_position
    lag_transactions   bigint       sinks: upstream commits not yet in the target (NULL otherwise)
    lag_seconds        double       0 when caught up; else how long the work has been pending: since its last
                                    commit (sinks: the age of the oldest upstream commit not sent)
    last_commit_at     timestamptz  its last commit (kept in the store: known across restarts)
    freshness_seconds  double       now - last_commit_at
    last_commit_seconds double      how long the driver took to commit the last transaction
    last_error         text         the last failure, one line, and when
    last_error_at      timestamptz
    next_retry_at      timestamptz  while failed: when the pipeline (or the sink runner) tries again"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from headrace.metrics.materializations import LEDGER, STALL_AFTER_S, MaterializationLedger
from headrace.pipeline.status import PipelineStatus
from headrace.store.serving import CHECKPOINTS_TABLE

COLUMNS: tuple[tuple[str, str], ...] = (
    ("materialization", "VARCHAR"), ("kind", "VARCHAR"), ("schema", "VARCHAR"), ("name", "VARCHAR"),
    ("transaction_of", "VARCHAR"), ("state", "VARCHAR"), ("transactions", "BIGINT"), ("failures", "BIGINT"),
    ("attempts", "BIGINT"), ("restarts", "BIGINT"), ("committed_position", "BIGINT"), ("log_position", "BIGINT"),
    ("lag_bytes", "BIGINT"), ("lag_transactions", "BIGINT"), ("lag_seconds", "DOUBLE"),
    ("last_commit_at", "TIMESTAMPTZ"), ("freshness_seconds", "DOUBLE"), ("last_commit_seconds", "DOUBLE"),
    ("last_error", "VARCHAR"), ("last_error_at", "TIMESTAMPTZ"), ("next_retry_at", "TIMESTAMPTZ"),
)
_NAMES = [name for name, _ in COLUMNS]
CHECKPOINT_CACHE_S = 1.0  # a scrape and a query in the same second read the checkpoints table once


class MaterializationStatus:
    """Builds the rows (thread-safe; blocking: reads the store's checkpoints table, at most once a second).

    `catalog`: sources(), tables(), views(), sinks(), root_materialization(view); `log_end(kind, id)`: a source's or
    table's log end; `sink_status(sink)`: its runner's SinkStatus or None."""

    def __init__(self, catalog: Any, store: Any, pipeline: PipelineStatus,
                 log_end: Callable[[str, str], int | None], sink_status: Callable[[Any], Any],
                 ledger: MaterializationLedger = LEDGER) -> None:
        self._catalog = catalog
        self._store = store
        self._pipeline = pipeline
        self._log_end = log_end
        self._sink_status = sink_status
        self._ledger = ledger
        self._lock = threading.Lock()
        self._checkpoints: tuple[float, dict[str, tuple[int | None, int | None]]] = (0.0, {})

    def _committed(self) -> dict[str, tuple[int | None, int | None]]:
        """materialization -> (log_end committed, commit timestamp in ms), from the store (cached a second)."""
        with self._lock:
            read_at, cached = self._checkpoints
            if time.monotonic() - read_at < CHECKPOINT_CACHE_S:
                return cached
            found: dict[str, tuple[int | None, int | None]] = {}
            for name, checkpoint, committed_at in self._store.execute(
                    f"SELECT materialization, checkpoint, committed_at FROM {CHECKPOINTS_TABLE}"):
                data = json.loads(checkpoint) if isinstance(checkpoint, str) else (checkpoint or {})
                log_end = data.get("log_end") if isinstance(data, dict) else None
                previous = found.get(name, (None, None))
                found[name] = (max(filter(None, (previous[0], log_end)), default=log_end),
                               max(filter(None, (previous[1], committed_at)), default=committed_at))
            self._checkpoints = (time.monotonic(), found)
            return found

    def rows(self) -> list[dict[str, Any]]:
        now = time.time()
        committed = self._committed()
        rows = []
        for kind, items in (("source", self._catalog.sources()), ("table", self._catalog.tables())):
            for item in items:
                rows.append(self._pipeline_row(kind, item, item.materialization, item.id, committed, now))
        for view in self._catalog.views():
            root = self._catalog.root_materialization(view)
            root_kind, _, root_id = root.partition("_")
            row = self._pipeline_row("view", view, root, root_id, committed, now, root_kind)
            rows.append({**row, "materialization": view.materialization})
        for sink in self._catalog.sinks():
            rows.append(self._sink_row(sink, now))
        return rows

    def _pipeline_row(self, kind: str, item: Any, transaction_of: str, log_id: str,
                      committed: dict[str, tuple[int | None, int | None]], now: float,
                      log_kind: str | None = None) -> dict[str, Any]:
        record = self._ledger.get(transaction_of)
        report = self._pipeline.get(transaction_of) or {}
        position, committed_ms = committed.get(transaction_of, (None, None))
        if record is not None and record.committed_position is not None:
            position = max(position or 0, record.committed_position)
        last_commit_at = committed_ms / 1000 if committed_ms is not None else None
        if record is not None and record.last_commit_at is not None:
            last_commit_at = max(last_commit_at or 0.0, record.last_commit_at)
        log_position = self._log_end(log_kind or kind, log_id)
        lag_bytes = None if log_position is None else max(0, log_position - (position or 0))
        pending_since = last_commit_at or self._pipeline.pipeline().get("started_at")
        lag_seconds = 0.0 if not lag_bytes else (now - pending_since if pending_since else None)
        errors = [(record.last_error_at, record.last_error)] if record is not None and record.last_error_at else []
        if report.get("last_error_at"):
            errors.append((report["last_error_at"], report.get("last_error")))
        error_at, error = max(errors, key=lambda pair: pair[0]) if errors else (None, None)
        attempts = record.consecutive_failures if record is not None else 0
        if report.get("state") == "failing":
            attempts = max(attempts, 1)
        if attempts:
            state = "failed"
        elif not report or report.get("state") == "starting":
            state = "starting"
        elif lag_seconds is not None and lag_seconds > STALL_AFTER_S:
            state = "stalled"
        else:
            state = "running"
        return {"materialization": transaction_of, "kind": kind, "schema": item.schema, "name": item.name,
                "transaction_of": transaction_of, "state": state,
                "transactions": record.transactions if record else 0, "failures": record.failures if record else 0,
                "attempts": attempts, "restarts": int(report.get("failures") or 0),
                "committed_position": position, "log_position": log_position, "lag_bytes": lag_bytes,
                "lag_transactions": None, "lag_seconds": lag_seconds, "last_commit_at": last_commit_at,
                "freshness_seconds": None if last_commit_at is None else max(0.0, now - last_commit_at),
                "last_commit_seconds": record.last_commit_seconds if record else None,
                "last_error": error, "last_error_at": error_at,
                "next_retry_at": report.get("next_retry_at") if state == "failed" else None,
                "commit_seconds": record.commit_seconds if record else None}

    def _sink_row(self, sink: Any, now: float) -> dict[str, Any]:
        from headrace.sink.runner import FENCED_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS

        record = self._ledger.get(sink.materialization)
        status = self._sink_status(sink)
        state = {"retrying": "failed", "fenced": "failed"}.get(status.state, status.state) if status else "stopped"
        lag_seconds = float(status.lag_seconds) if status else None
        if state == "running" and status.lag_transactions and (lag_seconds or 0.0) > STALL_AFTER_S:
            state = "stalled"
        next_retry_at = None
        if status is not None and state == "failed" and status.last_error_at is not None:
            delay = FENCED_BACKOFF_SECONDS if status.state == "fenced" else \
                min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** max(0, status.attempts - 1))
            next_retry_at = status.last_error_at + delay
        committed_at = status.committed_at if status else None
        return {"materialization": sink.materialization, "kind": "sink", "schema": sink.schema, "name": sink.name,
                "transaction_of": sink.materialization, "state": state,
                "transactions": status.transactions if status else 0,
                "failures": record.failures if record else (status.attempts if status else 0),
                "attempts": status.attempts if status else 0, "restarts": max(0, (record.opens if record else 1) - 1),
                "committed_position": status.position if status else None, "log_position": None,
                "lag_bytes": None, "lag_transactions": status.lag_transactions if status else None,
                "lag_seconds": lag_seconds, "last_commit_at": committed_at,
                "freshness_seconds": None if committed_at is None else max(0.0, now - committed_at),
                "last_commit_seconds": status.last_transaction_seconds if status else None,
                "last_error": status.last_error if status else None,
                "last_error_at": status.last_error_at if status else None, "next_retry_at": next_retry_at,
                "commit_seconds": record.commit_seconds if record else None}

    def relation_rows(self) -> list[tuple[Any, ...]]:
        """Rows in COLUMNS order, times in microseconds since the epoch (store/system_tables.py's convention)."""
        return [tuple(_microseconds(row[name]) if name.endswith("_at") else row[name] for name in _NAMES)
                for row in sorted(self.rows(), key=lambda row: (row["schema"], row["name"]))]


def _microseconds(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1_000_000)


STATES = ("running", "starting", "stalled", "failed", "stopped")


class MaterializationCollector(Collector):
    """headrace_materialization_* on GET /metrics (labels: kind, schema, name: one series per object)."""

    def __init__(self, status: MaterializationStatus) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        labels = ["kind", "schema", "name"]
        transactions = CounterMetricFamily("headrace_materialization_transactions",
                                           "Transactions committed (since the server started).", labels=labels)
        failures = CounterMetricFamily("headrace_materialization_failures",
                                       "Transactions that failed (since the server started).", labels=labels)
        duration = HistogramMetricFamily("headrace_materialization_commit_seconds",
                                         "How long the driver took to commit a transaction.", labels=labels)
        freshness = GaugeMetricFamily("headrace_materialization_freshness_seconds",
                                      "Seconds since its last commit.", labels=labels)
        lag_seconds = GaugeMetricFamily("headrace_materialization_lag_seconds",
                                        "0 when caught up, else how long its pending work has waited.", labels=labels)
        lag_bytes = GaugeMetricFamily("headrace_materialization_lag_bytes",
                                      "Log bytes not committed yet (sources, tables, views).", labels=labels)
        lag_transactions = GaugeMetricFamily("headrace_materialization_lag_transactions",
                                             "Upstream commits not in the target yet (sinks).", labels=labels)
        state = GaugeMetricFamily("headrace_materialization_state", "1 for its current state "
                                  "(running, starting, stalled, failed, stopped).", labels=[*labels, "state"])
        for row in self._status.rows():
            values = [row["kind"], row["schema"], row["name"]]
            transactions.add_metric(values, row["transactions"])
            failures.add_metric(values, row["failures"])
            histogram = row.get("commit_seconds")
            if histogram is not None and row["kind"] != "view":  # a view's commits are its source's
                duration.add_metric(values, histogram.buckets(), histogram.total)
            if row["freshness_seconds"] is not None:
                freshness.add_metric(values, row["freshness_seconds"])
            if row["lag_seconds"] is not None:
                lag_seconds.add_metric(values, row["lag_seconds"])
            if row["lag_bytes"] is not None:
                lag_bytes.add_metric(values, row["lag_bytes"])
            if row["lag_transactions"] is not None:
                lag_transactions.add_metric(values, row["lag_transactions"])
            for name in STATES:
                state.add_metric([*values, name], 1 if row["state"] == name else 0)
        yield from (transactions, failures, duration, freshness, lag_seconds, lag_bytes, lag_transactions, state)
