"""The fast path of SELECT: planned statements cached by their text, DuckDB cursors reused, and
constant queries run on the event loop instead of a worker thread.

Measured on a point SELECT (bench/pgwire_select.py): parsing and planning a statement costs more
than running it in DuckDB, and so does a fresh cursor (its `SET search_path` is a query); clients
that send the same text again (pgbench -M extended, psycopg, JDBC, every ORM) skip both.

A cached plan is valid while the catalog is the same: the key includes a fingerprint of every item
(id and CREATE statement). Plans that read the system catalog or in-memory system relations are
never cached (they are refreshed per execution)."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    from headrace.coordinator.session import PreparedStatement
    from headrace.sql.select import SelectPlan
    from headrace.store.serving import ServingStore

CACHE_CAPACITY = 1024
POOL_SIZE = 16


class PlanCache:
    """Statements planned from the same text, declared parameter types and catalog, reused.
    Entries are copied out, so a session never shares a mutable PreparedStatement."""

    def __init__(self, catalog_fingerprint: Callable[[], Hashable], capacity: int = CACHE_CAPACITY) -> None:
        self._fingerprint = catalog_fingerprint
        self._capacity = capacity
        self._entries: OrderedDict[tuple[str, tuple[int, ...], Hashable], PreparedStatement] = OrderedDict()
        self.hits = 0
        self.misses = 0
        # Also part of the key: e.g. the index catalog's generation (a new index makes new fast plans).
        self.also_keyed_by: Callable[[], Hashable] | None = None

    def fingerprint(self) -> Hashable:
        extra = self.also_keyed_by
        return self._fingerprint() if extra is None else (self._fingerprint(), extra())

    def _key(self, sql: str, param_types: Sequence[int],
             fingerprint: Hashable | None = None) -> tuple[str, tuple[int, ...], Hashable]:
        return (sql, tuple(param_types), self.fingerprint() if fingerprint is None else fingerprint)

    def get(self, sql: str, param_types: Sequence[int], fingerprint: Hashable | None = None, *,
            copy: bool = True) -> PreparedStatement | None:
        """`fingerprint`: the caller's self.fingerprint() of this moment, if it has one (it is not free).
        `copy=False`: the cached object itself, for a caller that only reads it (copy before keeping it)."""
        key = self._key(sql, param_types, fingerprint)
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return copy_statement(found) if copy else found

    def put(self, sql: str, param_types: Sequence[int], statement: PreparedStatement) -> None:
        plan = statement.plan
        if plan is None or plan.reads_system_catalog:
            return
        self._entries[self._key(sql, param_types)] = dataclasses.replace(statement)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)  # the least recently used; old fingerprints age out too


_SLOT_NAMES: dict[type, tuple[str, ...]] = {}


def copy_statement(statement: PreparedStatement) -> PreparedStatement:
    """A shallow copy, as dataclasses.replace(statement) makes, at a fraction of its cost (it runs per
    prepare on the point-SELECT path). The statements are slotted dataclasses: copy every slot."""
    kind = type(statement)
    names = _SLOT_NAMES.get(kind)
    if names is None:
        names = _SLOT_NAMES[kind] = tuple(field.name for field in dataclasses.fields(statement))
    fresh = object.__new__(kind)
    for name in names:
        object.__setattr__(fresh, name, getattr(statement, name))
    return fresh


class CursorPool:
    """DuckDB cursors (connections to the serving store) kept for reuse. A cursor that was
    interrupted or had relations registered on it is closed instead of returned."""

    def __init__(self, store: ServingStore, size: int = POOL_SIZE) -> None:
        self._store = store
        self._size = size
        self._idle: list[duckdb.DuckDBPyConnection] = []
        self._lock = threading.Lock()

    def acquire(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._store.cursor()

    def release(self, cursor: duckdb.DuckDBPyConnection, reusable: bool) -> None:
        if reusable:
            with self._lock:
                if len(self._idle) < self._size:
                    self._idle.append(cursor)
                    return
        cursor.close()


def runs_inline(plan: SelectPlan) -> bool:
    """A SELECT without FROM (SELECT 1, SELECT $1::int, version()) takes microseconds in DuckDB:
    cheaper on the event loop than a hop to a worker thread and back. A FROM anywhere (a string
    containing one included) sends the query to a worker thread, where it can be interrupted."""
    return " FROM " not in plan.duckdb_sql.upper() and "(SELECT" not in plan.duckdb_sql.upper()


def reusable_cursor(plan: SelectPlan) -> bool:
    """A cursor may go back to the pool unless system relations were registered on it (their
    snapshots would outlive the query) or it read the system catalog."""
    return not plan.reads_system_catalog and "__headrace_system_" not in plan.duckdb_sql
