"""SQL sessions (pgwire and the HTTP SQL API alike: both are AdapterClient sessions) and their statements:
`headrace_internal.sessions` and headrace_sql_* on /metrics.

    headrace_internal.sessions (one row per open session; columns named as in PostgreSQL's pg_stat_activity)
    pid              integer      the session's process id as the client knows it (BackendKeyData,
                                  pg_backend_pid()): headrace's connection id
    datname, usename, application_name  text
    backend_start    timestamptz  when the session started
    xact_start       timestamptz  when its open transaction block began (NULL outside one)
    query_start      timestamptz  when its current (or last) statement started
    state_change     timestamptz  when `state` last changed
    state            text         active | idle | idle in transaction | idle in transaction (aborted)
    query            text         the current (or last) statement; a statement naming a SECRET or a PASSWORD is
                                  cut before its value (`CREATE SECRET s AS <redacted>`); on the PostgreSQL store
                                  another role's is `<insufficient privilege>`, as pg_stat_activity shows it
    statement_kind   text         select | insert | update | delete | copy | subscribe | fetch | transaction |
                                  ddl | show | set | other
    store_pid        integer      the pid of its backend in the store PostgreSQL (NULL before its first
                                  statement there): join with pg_stat_activity, which is the store's own

Statement latency is measured around the coordinator's execute (plan, wait for read-your-writes, run, first
rows); an index point lookup answered in pgwire's read callback (pgwire/direct_lane.py) skips it and is counted by
headrace_index_lookups_total instead."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from headrace.metrics.histogram import Histogram

KINDS = ("select", "insert", "update", "delete", "copy", "subscribe", "fetch", "transaction", "ddl", "show", "set",
         "other")
_KIND_OF_WORD = {
    "select": "select", "with": "select", "values": "select", "table": "select", "explain": "select",
    "insert": "insert", "update": "update", "delete": "delete", "merge": "update", "truncate": "delete",
    "copy": "copy", "subscribe": "subscribe", "fetch": "fetch", "move": "fetch", "declare": "fetch",
    "close": "fetch", "begin": "transaction", "start": "transaction", "commit": "transaction",
    "end": "transaction", "rollback": "transaction", "abort": "transaction", "savepoint": "transaction",
    "release": "transaction", "prepare": "other", "execute": "other", "deallocate": "other",
    "create": "ddl", "drop": "ddl", "alter": "ddl", "grant": "ddl", "revoke": "ddl", "comment": "ddl",
    "show": "show", "set": "set", "reset": "set", "discard": "set",
}
_FIRST_WORD = re.compile(r"\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*\(*\s*([A-Za-z]+)", re.S)
_CREDENTIAL = re.compile(r"\b(SECRET|PASSWORD)\b", re.I)
MAX_QUERY_CHARS = 1024


def statement_kind(sql: str) -> str:
    match = _FIRST_WORD.match(sql)
    return _KIND_OF_WORD.get(match.group(1).lower(), "other") if match else "other"


def redacted(sql: str) -> str:
    """The statement as others may see it: cut after the first SECRET or PASSWORD (whose value follows)."""
    match = _CREDENTIAL.search(sql)
    text = sql if match is None else sql[:match.end()] + " <redacted>"
    return text[:MAX_QUERY_CHARS]


class SessionActivity:
    """What one session is doing (set by coordinator/client.py around each execute)."""

    __slots__ = ("backend_start", "query", "query_start", "state", "state_change", "xact_start", "kind")

    def __init__(self) -> None:
        self.backend_start = time.time()
        self.query: str | None = None
        self.query_start: float | None = None
        self.state = "idle"
        self.state_change = self.backend_start
        self.xact_start: float | None = None
        self.kind: str | None = None

    def begin(self, sql: str) -> None:
        now = time.time()
        self.query, self.kind, self.query_start = redacted(sql), statement_kind(sql), now
        self.state, self.state_change = "active", now

    def end(self, transaction_status: str) -> None:
        """`transaction_status`: pgwire's ReadyForQuery status, I (idle), T (in a block) or E (failed block)."""
        now = time.time()
        state = {"T": "idle in transaction", "E": "idle in transaction (aborted)"}.get(transaction_status, "idle")
        if transaction_status == "I":
            self.xact_start = None
        elif self.xact_start is None:
            self.xact_start = self.query_start or now
        self.state, self.state_change = state, now


class StatementStats:
    """Statement latency by kind, and failures (process-wide)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latency = {kind: Histogram() for kind in KINDS}
        self.errors = dict.fromkeys(KINDS, 0)

    def observe(self, kind: str, seconds: float, failed: bool) -> None:
        with self._lock:
            self.latency[kind].observe(seconds)
            if failed:
                self.errors[kind] += 1


STATEMENTS = StatementStats()

SESSION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("pid", "INTEGER"), ("datname", "VARCHAR"), ("usename", "VARCHAR"), ("application_name", "VARCHAR"),
    ("backend_start", "TIMESTAMPTZ"), ("xact_start", "TIMESTAMPTZ"), ("query_start", "TIMESTAMPTZ"),
    ("state_change", "TIMESTAMPTZ"), ("state", "VARCHAR"), ("query", "VARCHAR"), ("statement_kind", "VARCHAR"),
    ("store_pid", "INTEGER"),
)


def _microseconds(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1_000_000)


def session_rows(clients: Callable[[], Iterable[Any]],
                 store_pid: Callable[[int], int | None] = lambda _connection_id: None) -> list[tuple[Any, ...]]:
    """One row per session (`clients()`: the AdapterClient's SessionClients), in SESSION_COLUMNS order;
    `store_pid(connection id)`: its backend's pid in the store PostgreSQL (coordinator/passthrough.py)."""
    rows = []
    for client in clients():
        session = client.session
        activity: SessionActivity = client.activity
        rows.append((session.connection_id, session.database, session.user,
                     session.variables.get("application_name", ""), _microseconds(activity.backend_start),
                     _microseconds(activity.xact_start), _microseconds(activity.query_start),
                     _microseconds(activity.state_change), activity.state, activity.query, activity.kind,
                     store_pid(session.connection_id)))
    return sorted(rows, key=lambda row: row[0])


class SessionCollector(Collector):
    """headrace_sql_sessions{state}, headrace_sql_statement_seconds{kind}, headrace_sql_statement_errors_total{kind}."""

    def __init__(self, clients: Callable[[], Iterable[Any]], stats: StatementStats = STATEMENTS) -> None:
        self._clients = clients
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        states: dict[str, int] = dict.fromkeys(("active", "idle", "idle in transaction",
                                                "idle in transaction (aborted)"), 0)
        for client in self._clients():
            states[client.activity.state] = states.get(client.activity.state, 0) + 1
        sessions = GaugeMetricFamily("headrace_sql_sessions", "Open SQL sessions (pgwire and the HTTP SQL API), by "
                                     "state.", labels=["state"])
        for state, count in states.items():
            sessions.add_metric([state], count)
        yield sessions
        latency = HistogramMetricFamily("headrace_sql_statement_seconds", "Statement latency, from execute to its "
                                        "first rows or its completion.", labels=["kind"])
        errors = CounterMetricFamily("headrace_sql_statement_errors", "Statements that ended in an error.",
                                     labels=["kind"])
        for kind in KINDS:
            histogram = self._stats.latency[kind]
            latency.add_metric([kind], histogram.buckets(), histogram.total)
            errors.add_metric([kind], self._stats.errors[kind])
        yield latency
        yield errors
