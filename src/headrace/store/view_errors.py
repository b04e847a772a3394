"""The serving store's record of materialized views' errors (pipeline/view_errors.py), on DuckDB and PostgreSQL alike.

    headrace_internal.view_error_rows  view_id, row_key, sqlstate, message, since   (written by the serving driver)
    headrace_internal.view_errors      view_schema, view_name, key, sqlstate, message, since
                                       (what users read: the rows with their view's name, store/system_tables.py)

A transaction's runtime checkpoint lists the error state of each input row it changed in a view
(`ERRORS_FIELD`: [view id, row key, sqlstate, message], sqlstate None when the row's error is gone); the serving
driver applies them in the transaction that commits the checkpoint (`record_view_errors`), as absolute states: applying
one twice changes nothing. `since` is when the error first committed. The coordinator refuses a read of a view while
it holds an error (coordinator/views.py `refuse_view_errors`); `cache_key` tells it when to look again."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Sequence
from typing import Any

ERRORS_FIELD = "view_errors"  # in a runtime checkpoint (the table: created once by each serving store)
ERROR_ROWS_TABLE = "headrace_internal.view_error_rows"
ERRORS_RELATION = "view_errors"
ERROR_ROWS_DDL = (f"CREATE TABLE IF NOT EXISTS {ERROR_ROWS_TABLE} (view_id VARCHAR NOT NULL, row_key VARCHAR NOT NULL, "
                  "sqlstate VARCHAR NOT NULL, message VARCHAR NOT NULL, since TIMESTAMPTZ NOT NULL, "
                  "PRIMARY KEY (view_id, row_key))")
# headrace_internal.view_errors (store/system_tables.py): the rows with their view's name, on either serving store.
RELATION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("view_schema", "VARCHAR"), ("view_name", "VARCHAR"), ("key", "VARCHAR"), ("sqlstate", "VARCHAR"),
    ("message", "VARCHAR"), ("since", "TIMESTAMPTZ"))
_RELATION_SELECT = (f"SELECT s.schema, s.name, e.row_key, e.sqlstate, e.message, e.since FROM {ERROR_ROWS_TABLE} e "
                    "JOIN headrace_internal.view_schemas s ON s.id = e.view_id ORDER BY s.schema, s.name, e.since, "
                    "e.row_key")
_serving_store: weakref.ref[Any] | None = None  # the store the relation reads (set by coordinator/views.py)


def serve_relation_from(store: Any) -> None:
    """Read headrace_internal.view_errors from `store` (the server's serving store, DuckDB or PostgreSQL)."""
    global _serving_store
    _serving_store = weakref.ref(store)


def relation_rows() -> list[tuple[Any, ...]]:
    store = _serving_store() if _serving_store is not None else None
    return [] if store is None else store.execute(_RELATION_SELECT)


# Readers cache which views hold errors per generation; a commit that changes errors bumps it before its data becomes
# visible and again after, and marks itself in flight meanwhile, so that no reader caches what it read during it:
# once a reader sees a commit (its checkpoint), it either sees a new generation or finds the commit in flight.
_generation = itertools.count(1)
_lock = threading.Lock()
_in_flight: set[int] = set()  # ids of the drivers committing errors now
changed_generation = 0


def commit_starting(committer: object) -> None:
    """Before the commit of a transaction whose checkpoint changes views' errors becomes visible."""
    global changed_generation
    with _lock:
        _in_flight.add(id(committer))
        changed_generation = next(_generation)


def commit_ended(committer: object) -> None:
    """After that commit (or its rollback); nothing if `committer` has no such commit in flight."""
    global changed_generation
    with _lock:
        if id(committer) in _in_flight:
            changed_generation = next(_generation)
            _in_flight.discard(id(committer))


def cache_key() -> int | None:
    """The generation a reader may cache what it reads under, or None while a commit of errors is in flight."""
    with _lock:
        return None if _in_flight else changed_generation


def _entries(runtime_checkpoint: dict[str, Any]) -> Sequence[list[Any]]:
    return runtime_checkpoint.get(ERRORS_FIELD) or ()


def record_view_errors(cursor: Any, runtime_checkpoint: dict[str, Any], placeholder: str = "?") -> bool:
    """Apply the checkpoint's error states within the caller's transaction (a DuckDB cursor, or a psycopg cursor with
    placeholder "%s"); True if there were any (then call `commit_starting` before the commit, `commit_ended` after)."""
    entries = _entries(runtime_checkpoint)
    if not entries:
        return False
    p = placeholder
    for view_id, row_key, sqlstate, message in entries:
        if sqlstate is None:
            cursor.execute(f"DELETE FROM {ERROR_ROWS_TABLE} WHERE view_id = {p} AND row_key = {p}",
                           [str(view_id), str(row_key)])
        else:
            cursor.execute(f"INSERT INTO {ERROR_ROWS_TABLE} VALUES ({p}, {p}, {p}, {p}, now()) "
                           "ON CONFLICT (view_id, row_key) DO UPDATE SET sqlstate = excluded.sqlstate, "
                           "message = excluded.message", [str(view_id), str(row_key), str(sqlstate), str(message)])
    return True


def erroring_view_ids_sql() -> str:
    return f"SELECT DISTINCT view_id FROM {ERROR_ROWS_TABLE}"


def first_error_sql(count: int) -> str:
    """The first error (oldest, then by row key) of any of `count` views given as `?` parameters."""
    marks = ", ".join("?" for _ in range(count))
    return (f"SELECT view_id, row_key, sqlstate, message FROM {ERROR_ROWS_TABLE} WHERE view_id IN ({marks}) "
            "ORDER BY since, view_id, row_key LIMIT 1")


def delete_view_errors_sql() -> str:
    return f"DELETE FROM {ERROR_ROWS_TABLE} WHERE view_id = ?"
