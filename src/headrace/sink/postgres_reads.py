"""A sink's reads from the PostgreSQL serving store (store/postgres_serving.py): its column types from PostgreSQL's
description of its SELECT, and the changelog's batches as Arrow tables through COPY.

Column types: PostgreSQL's type oid (and numeric's typmod) -> the canonical DuckDB type names the drivers take
(materialize/drivers/postgres_sql.py): bool BOOLEAN, int2/int4/int8 SMALLINT/INTEGER/BIGINT, float4 FLOAT, float8
DOUBLE, numeric(p,s) DECIMAL(p,s), text/varchar/char/name VARCHAR, json/jsonb JSON, timestamptz TIMESTAMPTZ,
timestamp TIMESTAMP, date DATE, interval INTERVAL, uuid UUID, bytea BLOB. A numeric without typmod (a view's
numeric output, which the view stores as float8) is DOUBLE, as the DuckDB store describes the same view; an array
is its element's name with `[]` ("INTEGER[]"), anything else PostgreSQL's name upper-cased ("TIME"): drivers refuse
those at Validate, as they refuse them from DuckDB.

Reads: `COPY (SELECT ...) TO STDOUT (FORMAT csv)` parsed by Arrow's CSV reader with explicit types (no Python object
per value): a batch of 100,000 changes is one COPY and one C++ parse. The Arrow types are those DuckDB's
fetch_arrow_table gives for the same columns, which the drivers consume: integers and floats as such, DECIMAL(p,s)
decimal128(p,s), VARCHAR / UUID / JSON string (JSON as jsonb's text), BOOLEAN bool, TIMESTAMPTZ timestamp[us,
tz=UTC], TIMESTAMP timestamp[us], DATE date32, BLOB binary; INTERVAL int64 microseconds (1 month = 30 days: the
protocol's convention, which the POSTGRES, REDIS, HTTP and external drivers take; DuckDB's month_day_nano_interval
is taken by none of them). Times travel as integer microseconds
(exact: extract(epoch) is numeric), dates as integer days, bytea as hex, every other type as its text.

Consolidation: a keyed batch in PostgreSQL (one sort serves DISTINCT ON per key, its last change, and the window
giving its first change's diff); a delta batch read as it is and consolidated by Arrow (`consolidate_keyed_deltas`:
PostgreSQL's GROUP BY over every column, jsonb included, cost about twice the read itself), with PostgreSQL's GROUP
BY kept for an input whose key repeats within one commit. The SQL is PostgreSQL's own: no EXCLUDE, no GROUP BY ALL,
subqueries named, json compared as jsonb (json has no equality operator, so a json key could not be partitioned
nor a json value grouped)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg.postgres import types as postgres_types

from headrace.errors import HeadraceError
from headrace.materialize.drivers.postgres_sql import Column, Read, columnar_read, duckdb_type, read_csv
from headrace.sink.inputs import FIRST, INPUT, SinkInput
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import changelog_table, qualified_name, quote_ident

_NUMERIC_OID = 1700
_CANONICAL_BY_OID = {
    16: "BOOLEAN", 21: "SMALLINT", 23: "INTEGER", 20: "BIGINT", 700: "FLOAT", 701: "DOUBLE", 25: "VARCHAR",
    1043: "VARCHAR", 1042: "VARCHAR", 18: "VARCHAR", 19: "VARCHAR", 114: "JSON", 3802: "JSON",
    1184: "TIMESTAMPTZ", 1114: "TIMESTAMP", 1082: "DATE", 1186: "INTERVAL", 2950: "UUID", 17: "BLOB",
}
# Canonical types columnar_read (the POSTGRES driver's Loads) reads as DuckDB's own Arrow types.
_AS_LOADED = frozenset({"BOOLEAN", "SMALLINT", "INTEGER", "BIGINT", "FLOAT", "VARCHAR", "UUID", "DATE", "TIMESTAMP",
                        "BLOB"})


def canonical_type(column: psycopg.Column) -> str:
    """The canonical DuckDB type name of a result column PostgreSQL describes (see module docstring)."""
    oid = column.type_code
    if oid == _NUMERIC_OID:
        return "DOUBLE" if column.precision is None else f"DECIMAL({column.precision},{column.scale or 0})"
    if oid in _CANONICAL_BY_OID:
        return _CANONICAL_BY_OID[oid]
    info = postgres_types.get(oid)
    if info is not None and oid == info.array_oid:
        element = _CANONICAL_BY_OID.get(info.oid, info.name.upper())
        if info.oid == _NUMERIC_OID:
            element = "DOUBLE" if column.precision is None else f"DECIMAL({column.precision},{column.scale or 0})"
        return f"{element}[]"
    return column.type_display.upper()


def describe(store: PostgresServingStore, sql: str) -> list[tuple[str, str]]:
    """(name, canonical type) of each column of `sql`, which PostgreSQL plans but does not run (LIMIT 0 inside).
    PostgreSQL's error, should it refuse the SELECT, with its SQLSTATE (CREATE SINK reports it)."""
    try:
        with store.reading(None) as conn, conn.cursor() as cursor:
            cursor.execute(sql)
            return [(column.name, canonical_type(column)) for column in cursor.description or []]
    except psycopg.Error as exc:
        raise HeadraceError(exc.diag.message_primary or str(exc), sqlstate=exc.sqlstate or "08006",
                            detail=exc.diag.message_detail, hint=exc.diag.message_hint) from None


def arrow_read(type_name: str, expr: str) -> Read:
    """How a column of canonical type `type_name` is selected from PostgreSQL and parsed into its Arrow type."""
    if type_name == "TIMESTAMPTZ":
        return Read(f"(extract(epoch from {expr}) * 1000000)::bigint", pa.int64(),
                    lambda values: values.cast(pa.timestamp("us", tz="UTC")))
    if type_name == "INTERVAL":  # the protocol's integer microseconds, which every driver takes
        return Read(f"(extract(epoch from {expr}) * 1000000)::bigint", pa.int64())
    if type_name == "JSON":
        return Read(f"({expr})::jsonb::text", pa.string())  # jsonb's text, for a json column too
    if type_name == "DOUBLE":
        return Read(f"({expr})::float8", pa.float64())  # a numeric without typmod is DOUBLE (canonical_type)
    if type_name in _AS_LOADED or (type_name.startswith("DECIMAL(") and duckdb_type(type_name) == type_name):
        return columnar_read(Column("", type_name, ""), expr)
    return Read(f"({expr})::text", pa.string())  # arrays, numeric beyond 38 digits, ...: drivers refuse them


def _grouped(type_name: str, expr: str) -> str:
    """The expression a column is compared by (json has no equality operator: as jsonb)."""
    return f"({expr})::jsonb" if type_name == "JSON" else expr


class PostgresChangeQueries:
    """ChangeReader's queries (sink/changes.py) on the PostgreSQL serving store, each batch in ONE REPEATABLE READ,
    READ ONLY transaction (`transaction()`), so timestamps, frontiers and rows come from one snapshot."""

    def __init__(self, store: PostgresServingStore, sink_input: SinkInput, columns: list[tuple[str, str]],
                 delta: bool) -> None:
        self._store = store
        self._input = sink_input
        self._delta = delta
        self._changelog = changelog_table(sink_input.resource_path)
        self._table = qualified_name(sink_input.resource_path)
        types = dict(columns)
        key = ", ".join(_grouped(types[name], f"c.{quote_ident(name)}") for name in sink_input.key)
        self._sink_reads = [(name, arrow_read(type_name, f"c.{quote_ident(name)}")) for name, type_name in columns]
        if delta:
            self._raw_reads = [("hr_timestamp", Read("c.hr_timestamp", pa.int64())),
                               ("hr_diff", Read("c.hr_diff", pa.int32())), *self._sink_reads]
            self._raw_from = f"FROM ({sink_input.select_sql}) AS c"
            self._consolidate_reads = [("hr_timestamp", Read("c.hr_timestamp", pa.int64())),
                                       ("hr_diff", Read("sum(c.hr_diff)::integer", pa.int32())), *self._sink_reads]
            grouped = ", ".join(["c.hr_timestamp", *(_grouped(t, f"c.{quote_ident(n)}") for n, t in columns)])
            self._consolidate_from = (f"FROM ({sink_input.select_sql}) AS c GROUP BY {grouped} "
                                      f"HAVING sum(c.hr_diff) <> 0 ORDER BY c.hr_timestamp, {key}, sum(c.hr_diff)")
        else:
            # Per key its last change (what it is now) and the diff of its first (did the target hold it?): one
            # sort serves DISTINCT ON and the window, both ordered by key, then newest first. (The inner `c` is
            # the input's rows, the outer `c` one row per key.)
            self._consolidate_reads = [("hr_diff", Read("c.hr_diff", pa.int32())), *self._sink_reads,
                                       (FIRST, Read(f"c.{FIRST}", pa.int32()))]
            self._consolidate_from = (
                f"FROM (SELECT DISTINCT ON ({key}) c.*, last_value(c.hr_diff) OVER (PARTITION BY {key} "
                "ORDER BY c.hr_timestamp DESC, c.hr_diff DESC ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED "
                f"FOLLOWING) AS {FIRST} FROM ({sink_input.select_sql}) AS c "
                f"ORDER BY {key}, c.hr_timestamp DESC, c.hr_diff DESC) AS c")

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        with self._store.reading(None) as conn:
            yield conn

    def latest(self, conn: psycopg.Connection[Any]) -> int | None:
        return self._store.latest_timestamp(self._input.materialization, conn)

    def since(self, conn: psycopg.Connection[Any]) -> int:
        return self._store.changelog_since(self._input.resource_path, conn)

    def per_commit(self, conn: psycopg.Connection[Any], after: int, latest: int) -> list[tuple[int, int]]:
        """(commit timestamp, changes up to and including it) of each commit in (after, latest], in order."""
        rows = conn.execute(
            f"SELECT hr_timestamp, sum(count(*)) OVER (ORDER BY hr_timestamp) FROM {self._changelog} "
            "WHERE hr_timestamp > %s AND hr_timestamp <= %s GROUP BY hr_timestamp ORDER BY hr_timestamp",
            [after, latest]).fetchall()
        return [(int(timestamp), int(running)) for timestamp, running in rows]

    def pending(self, conn: psycopg.Connection[Any], position: int, latest: int) -> tuple[int, int | None]:
        """(commits, oldest commit timestamp) of the changes in (position, latest]."""
        row = conn.execute(f"SELECT count(DISTINCT hr_timestamp), min(hr_timestamp) FROM {self._changelog} "
                           "WHERE hr_timestamp > %s AND hr_timestamp <= %s", [position, latest]).fetchone()
        count, oldest = row if row is not None else (0, None)
        return int(count or 0), None if oldest is None else int(oldest)

    def snapshot(self, conn: psycopg.Connection[Any], timestamp: int, undo_after: int | None) -> pa.Table:
        """The sink's columns over the table's rows, stamped `timestamp`; with `undo_after`, the rows as of that
        commit: today's rows with the changes since undone."""
        rows = self._table
        if undo_after is not None:
            stored = ", ".join(quote_ident(name) for name in self._store.columns(self._input.resource_path) or {})
            rows = (f"(SELECT {stored} FROM (SELECT {stored}, 1 AS __hr_d FROM {self._table} UNION ALL "
                    f"SELECT {stored}, -hr_diff FROM {self._changelog} WHERE hr_timestamp > {int(undo_after)}) AS u "
                    f"GROUP BY {stored} HAVING sum(__hr_d) > 0)")
        cte = (f"WITH {INPUT} AS (SELECT {int(timestamp)}::bigint AS hr_timestamp, 1::integer AS hr_diff, r.* "
               f"FROM {rows} AS r)")
        return self._copy(conn, cte, self._sink_reads, f"FROM ({self._input.select_sql}) AS c")

    def consolidated(self, conn: psycopg.Connection[Any], after: int, upto: int) -> pa.Table:
        """The changes in (after, upto] consolidated: per key (keyed) hr_diff, the columns, __hr_first; per row and
        commit (delta) hr_timestamp, hr_diff, the columns."""
        cte = (f"WITH {INPUT} AS (SELECT * FROM {self._changelog} WHERE hr_timestamp > {int(after)} "
               f"AND hr_timestamp <= {int(upto)})")
        if self._delta:
            # The changes as they are, consolidated by Arrow: PostgreSQL's GROUP BY over every column (jsonb
            # included) cost about twice the read itself. Should a key change twice the same way in one commit
            # (not a keyed input), PostgreSQL's GROUP BY answers instead.
            consolidated = consolidate_keyed_deltas(self._copy(conn, cte, self._raw_reads, self._raw_from),
                                                    self._input.key)
            if consolidated is not None:
                return consolidated
        return self._copy(conn, cte, self._consolidate_reads, self._consolidate_from)

    @staticmethod
    def _copy(conn: psycopg.Connection[Any], cte: str, reads: list[tuple[str, Read]], rest: str) -> pa.Table:
        """`cte SELECT <reads> rest` as COPY ... TO STDOUT (FORMAT csv), parsed by Arrow."""
        selects = ", ".join(read.select for _, read in reads)
        statement = f"COPY ({cte} SELECT {selects} {rest}) TO STDOUT (FORMAT csv)"
        data = bytearray()
        with conn.cursor() as cursor, cursor.copy(statement) as copy:
            for chunk in copy:
                data += chunk
        return read_csv(bytes(data), reads)


def consolidate_keyed_deltas(changes: pa.Table, key: tuple[str, ...]) -> pa.Table | None:
    """Delta changes (hr_timestamp, hr_diff, columns) of a keyed input consolidated per row and commit, as
    GROUP BY every column with sum(hr_diff) <> 0 gives them, ordered by commit, key, then retraction first: at one
    commit a key has at most one retraction (its old row) and one addition (its new row), which cancel when the
    rows are equal. None when some key changes twice the same way in one commit (then this does not hold)."""
    place = ["hr_timestamp", *key]
    ordered = changes.take(pc.sort_indices(changes, [(name, "ascending") for name in (*place, "hr_diff")]))
    if ordered.num_rows < 2:
        return ordered
    head, tail = ordered.slice(0, ordered.num_rows - 1), ordered.slice(1)
    same_place = _all_equal(head, tail, place)
    if pc.any(pc.and_(same_place, pc.equal(head["hr_diff"], tail["hr_diff"]))).as_py():
        return None
    values = [name for name in ordered.column_names if name not in ("hr_diff", *place)]
    # A retraction followed by an equal addition at the same commit and key: both go.
    cancels = pc.and_(pc.and_(same_place, _all_equal(head, tail, values)),
                      pc.and_(pc.equal(head["hr_diff"], -1), pc.equal(tail["hr_diff"], 1)))
    if not pc.any(cancels).as_py():
        return ordered
    retracted = pa.concat_arrays([cancels.combine_chunks() if isinstance(cancels, pa.ChunkedArray) else cancels,
                                  pa.array([False])])
    added = pa.concat_arrays([pa.array([False]), retracted.slice(0, ordered.num_rows - 1)])
    return ordered.filter(pc.invert(pc.or_(retracted, added)))


def _all_equal(head: pa.Table, tail: pa.Table, names: list[str]) -> pa.ChunkedArray | pa.Array:
    """Per row, whether head and tail hold equal values in every named column (NULL equals NULL, NaN NaN, as
    GROUP BY compares them)."""
    result: pa.ChunkedArray | pa.Array = pa.array([True] * head.num_rows)
    for name in names:
        left, right = head[name], tail[name]
        same = pc.or_(pc.fill_null(pc.equal(left, right), False), pc.and_(pc.is_null(left), pc.is_null(right)))
        if pa.types.is_floating(left.type):
            same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(left), pc.is_nan(right)), False))
        result = pc.and_(result, same)
    return result
