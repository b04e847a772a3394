"""The serving store's record of quarantined log records (pipeline/quarantine.py), shown in SQL as
`headrace_internal.quarantined_records` (store/system_tables.py):

    source           text         the source's "schema.name" when the record was quarantined
    materialization  text         the source's materialization (its stable id: source_<id>)
    log_offset       bigint       where the record is in the source's log (it stays there)
    received_at      timestamptz  when the request arrived
    sqlstate         text         PostgreSQL's SQLSTATE for the refusal (22P02, 22P05, 22021)
    reason           text         PostgreSQL's message and detail
    quarantined_at   timestamptz  when the batch holding it committed

The pipeline lists a batch's quarantined records in its runtime checkpoint; the serving driver calls
`record_quarantined` in the transaction that commits the batch and that checkpoint, so the record is written
exactly when the batch is, and a record met again (a replay, a backfill that carries an older checkpoint) is
ignored by its key (materialization, log_offset)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import pyarrow as pa

QUARANTINE_FIELD = "quarantined"  # in a runtime checkpoint: [[log_offset, received_at_us, sqlstate, reason], ...]
QUARANTINE_SOURCE_FIELD = "quarantined_from"  # beside it: the source's "schema.name"
QUARANTINE_TABLE = "headrace_internal.quarantine"

COLUMNS: tuple[tuple[str, str], ...] = (
    ("source", "VARCHAR"), ("materialization", "VARCHAR"), ("log_offset", "BIGINT"), ("received_at", "TIMESTAMPTZ"),
    ("sqlstate", "VARCHAR"), ("reason", "VARCHAR"), ("quarantined_at", "TIMESTAMPTZ"),
)
_SCHEMA = pa.schema([("source", pa.string()), ("materialization", pa.string()), ("log_offset", pa.int64()),
                     ("received_at", pa.timestamp("us", tz="UTC")), ("sqlstate", pa.string()),
                     ("reason", pa.string()), ("quarantined_at", pa.timestamp("us", tz="UTC"))])
_STAGED = "__headrace_quarantined"


def ensure_quarantine_table(cursor: duckdb.DuckDBPyConnection) -> None:
    """Create the table if absent (the serving driver does at each Open, outside any transaction)."""
    cursor.execute(f"CREATE TABLE IF NOT EXISTS {QUARANTINE_TABLE} ("
                   "source VARCHAR NOT NULL, materialization VARCHAR NOT NULL, log_offset BIGINT NOT NULL, "
                   "received_at TIMESTAMPTZ, sqlstate VARCHAR NOT NULL, reason VARCHAR NOT NULL, "
                   "quarantined_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (materialization, log_offset))")


def record_quarantined(cursor: duckdb.DuckDBPyConnection, materialization: str,
                       runtime_checkpoint: dict[str, Any], refused: Sequence[list[Any]] = ()) -> int:
    """Insert the checkpoint's quarantined records and the driver's own `refused` entries (same form); nothing when
    there are none. Within the caller's transaction."""
    entries = [*(runtime_checkpoint.get(QUARANTINE_FIELD) or ()), *refused]
    if not entries:
        return 0
    source = str(runtime_checkpoint.get(QUARANTINE_SOURCE_FIELD, materialization))
    now_us = time.time_ns() // 1000
    table = pa.table({
        "source": [source] * len(entries), "materialization": [materialization] * len(entries),
        "log_offset": [int(entry[0]) for entry in entries],
        "received_at": [None if entry[1] is None else int(entry[1]) for entry in entries],
        "sqlstate": [str(entry[2]) for entry in entries], "reason": [str(entry[3]) for entry in entries],
        "quarantined_at": [now_us] * len(entries),
    }, schema=_SCHEMA)
    cursor.register(_STAGED, table)
    try:
        cursor.execute(f"INSERT OR IGNORE INTO {QUARANTINE_TABLE} SELECT * FROM {_STAGED}")
    finally:
        cursor.unregister(_STAGED)
    return len(entries)


def refused_rows(convert: Callable[[pa.Table], Any], table: pa.Table,
                 refusals: tuple[type[BaseException], ...]) -> dict[int, str]:
    """Row index -> the store's error, for every row of `table` that `convert` refuses, found by bisection: a part
    that converts holds none; a refused part is halved until single rows remain (about 2 log2(n) conversions per
    refused row). The fallback for refusals the rules of webhook/store_rules.py did not predict."""
    refused: dict[int, str] = {}

    def bisect(start: int, length: int) -> None:
        try:
            convert(table.slice(start, length))
        except refusals as exc:
            if length == 1:
                refused[start] = str(exc).splitlines()[0][:500]
                return
            half = length // 2
            bisect(start, half)
            bisect(start + half, length - half)

    if table.num_rows:
        bisect(0, table.num_rows)
    return refused


def quarantine_entries(table: pa.Table, refused: dict[int, str]) -> list[list[Any]]:
    """Quarantine entries ([log_offset, received_at_us, sqlstate, reason]) of a source's rows refused by the store."""
    offsets = table["log_offset"].to_pylist()
    arrivals = table["received_at"].cast(pa.int64()).to_pylist() if "received_at" in table.column_names \
        else [None] * table.num_rows
    return [[offsets[index], arrivals[index], "22P02", f"invalid input syntax for type json: {message}"]
            for index, message in sorted(refused.items())]


def quarantine_snapshot(cursor: duckdb.DuckDBPyConnection) -> pa.Table:
    """Every quarantined record, in (source, log offset) order; empty when nothing was ever quarantined."""
    exists = cursor.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'headrace_internal' "
                            "AND table_name = 'quarantine'").fetchone()
    if not exists or not exists[0]:
        return _SCHEMA.empty_table()
    return cursor.execute(f"SELECT * FROM {QUARANTINE_TABLE} ORDER BY materialization, log_offset") \
        .fetch_arrow_table().cast(_SCHEMA)


def postgres_quarantine_rows(store: Any) -> list[tuple[Any, ...]]:
    """quarantine_snapshot's rows from the PostgreSQL serving store (store/postgres_serving.py), where its driver
    records them in the table of the same name and columns (blocking)."""
    names = ", ".join(name for name, _ in COLUMNS)
    return store.execute(f"SELECT {names} FROM {QUARANTINE_TABLE} ORDER BY materialization, log_offset")
