"""What a sink sends next: its input's changes after its position, read from the serving store as Arrow tables.

A sink's position is an upstream commit timestamp T: every change of its input with hr_timestamp <= T is in the
target. `next_batch` reads, in one transaction of the serving store (DuckDB's, or a REPEATABLE READ one on
PostgreSQL: sink/postgres_reads.py; so compaction and commits cannot slip in between), the
changes in (T, U] where U is the latest commit of the input's materialization, capped so that a batch holds about
`max_changes` changes but never splits one upstream commit (HTTP idempotency keys name upstream commits, so every
replay must cut at the same places). Position None: the input's rows as of U, as one snapshot batch.

Keyed sinks get each changed key once, consolidated over the range: the key's last change says what it is now
(+1: its row, -1: gone) and its first says whether the target holds it already (a -1 first: it existed at T, and
the target is exactly the input as of T). So `rows` are keys new to the target, `updated` keys it holds, `deleted`
keys to remove: Store with exists known without a Load. A snapshot cannot know what the target holds (a table that
already has rows), so its rows go as `rows`, for a sink to Load first where the driver can (sink/runner.py).

Delta-updates sinks get the changes themselves, consolidated per (row, upstream commit): an unchanged row rewritten
at one commit (-1/+1) cancels out. Their key is the input's key plus hr_timestamp and hr_diff."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from headrace.sink.inputs import FIRST, INPUT, SinkInput, SinkStore
from headrace.sink.postgres_reads import PostgresChangeQueries
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ChangelogCompacted, ServingStore, changelog_table, qualified_name, quote_ident

DELTA_COLUMNS = (("hr_timestamp", "BIGINT"), ("hr_diff", "INTEGER"))
DEFAULT_MAX_CHANGES = 200_000
_ROWS = "__hr_snapshot_rows__"  # where a snapshot query reads its rows from


@dataclass(frozen=True)
class ChangeBatch:
    """The changes in (after, upto] (after None: a snapshot as of upto) as Arrow tables of the sink's columns."""

    after: int | None
    upto: int
    changes: int  # changelog rows read (the snapshot's rows for a snapshot)
    rows: pa.Table | None = None  # keyed: keys the target lacks (snapshot: every row)
    updated: pa.Table | None = None  # keyed: keys the target holds, with their new values
    deleted: pa.Table | None = None  # keyed: key columns of keys to delete
    delta: pa.Table | None = None  # delta updates: hr_timestamp, hr_diff, then the sink's columns

    @property
    def snapshot(self) -> bool:
        return self.after is None

    @property
    def documents(self) -> int:
        return sum(table.num_rows for table in (self.rows, self.updated, self.deleted, self.delta)
                   if table is not None)


@dataclass(frozen=True)
class Lag:
    """How far the target is behind its input: upstream commits not yet in it, and the age of the oldest one."""

    latest: int | None  # the input's latest upstream commit timestamp
    transactions: int
    oldest_pending: int | None  # timestamp (ms) of the oldest upstream commit not in the target


class ChangeQueries(Protocol):
    """The store's side of ChangeReader: one per dialect (DuckDBChangeQueries here, PostgresChangeQueries in
    sink/postgres_reads.py), each read within `transaction()`'s one snapshot."""

    def transaction(self) -> AbstractContextManager[Any]: ...

    def latest(self, handle: Any) -> int | None: ...

    def since(self, handle: Any) -> int: ...

    def per_commit(self, handle: Any, after: int, latest: int) -> list[tuple[int, int]]: ...

    def pending(self, handle: Any, position: int, latest: int) -> tuple[int, int | None]: ...

    def snapshot(self, handle: Any, timestamp: int, undo_after: int | None) -> pa.Table: ...

    def consolidated(self, handle: Any, after: int, upto: int) -> pa.Table: ...


class DuckDBChangeQueries:
    """ChangeReader's queries on the DuckDB serving store, each batch in one DuckDB transaction."""

    def __init__(self, store: ServingStore, sink_input: SinkInput, columns: list[tuple[str, str]],
                 delta: bool) -> None:
        self._store = store
        self._input = sink_input
        self._changelog = changelog_table(sink_input.resource_path)
        selected = ", ".join(quote_ident(name) for name, _ in columns)
        key = ", ".join(quote_ident(name) for name in sink_input.key)
        if delta:
            self._consolidate = (f"SELECT hr_timestamp, CAST(sum(hr_diff) AS INTEGER) AS hr_diff, {selected} "
                                 f"FROM ({sink_input.select_sql}) GROUP BY ALL HAVING sum(hr_diff) <> 0 "
                                 f"ORDER BY hr_timestamp, {key}")
        else:
            # Per key: its last change (what it is now) and the diff of its first (did the target hold it?).
            self._consolidate = (
                f"SELECT * EXCLUDE (__hr_rank) FROM (SELECT hr_diff, {selected}, "
                f"row_number() OVER (PARTITION BY {key} ORDER BY hr_timestamp DESC, hr_diff DESC) AS __hr_rank, "
                f"first_value(hr_diff) OVER (PARTITION BY {key} ORDER BY hr_timestamp, hr_diff) AS {FIRST} "
                f"FROM ({sink_input.select_sql})) WHERE __hr_rank = 1")
        self._table = qualified_name(sink_input.resource_path)
        stored = store.columns(sink_input.resource_path) or {}
        self._stored = ", ".join(quote_ident(name) for name in stored)
        self._snapshot_sql = (f"SELECT {selected} FROM (WITH {INPUT} AS (SELECT CAST(? AS BIGINT) AS hr_timestamp, "
                              f"CAST(1 AS INTEGER) AS hr_diff, * FROM {_ROWS}) {sink_input.select_sql})")

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._store.cursor() as cursor:
            cursor.begin()
            try:
                yield cursor
            finally:
                cursor.rollback()

    def latest(self, cursor: duckdb.DuckDBPyConnection) -> int | None:
        return self._store.latest_timestamp(self._input.materialization, cursor)

    def since(self, cursor: duckdb.DuckDBPyConnection) -> int:
        return self._store.changelog_since(self._input.resource_path, cursor)

    def per_commit(self, cursor: duckdb.DuckDBPyConnection, after: int, latest: int) -> list[tuple[int, int]]:
        rows = cursor.execute(
            f"SELECT hr_timestamp, sum(count(*)) OVER (ORDER BY hr_timestamp) FROM {self._changelog} "
            "WHERE hr_timestamp > ? AND hr_timestamp <= ? GROUP BY hr_timestamp ORDER BY hr_timestamp",
            [after, latest]).fetchall()
        return [(int(timestamp), int(running)) for timestamp, running in rows]

    def pending(self, cursor: duckdb.DuckDBPyConnection, position: int, latest: int) -> tuple[int, int | None]:
        count, oldest = cursor.execute(
            f"SELECT count(DISTINCT hr_timestamp), min(hr_timestamp) FROM {self._changelog} "
            "WHERE hr_timestamp > ? AND hr_timestamp <= ?", [position, latest]).fetchone() or (0, None)
        return int(count or 0), None if oldest is None else int(oldest)

    def snapshot(self, cursor: duckdb.DuckDBPyConnection, timestamp: int, undo_after: int | None) -> pa.Table:
        if undo_after is None:
            return protocol_intervals(cursor.execute(self._snapshot_sql.replace(_ROWS, self._table), [timestamp]).fetch_arrow_table())
        # The rows as of `undo_after`: today's rows with the changes since undone.
        rows = (f"(SELECT {self._stored} FROM (SELECT {self._stored}, 1 AS __hr_d FROM {self._table} UNION ALL "
                f"SELECT {self._stored}, -hr_diff FROM {self._changelog} WHERE hr_timestamp > {int(undo_after)}) "
                "GROUP BY ALL HAVING sum(__hr_d) > 0)")
        return protocol_intervals(cursor.execute(self._snapshot_sql.replace(_ROWS, rows), [timestamp]).fetch_arrow_table())

    def consolidated(self, cursor: duckdb.DuckDBPyConnection, after: int, upto: int) -> pa.Table:
        sql = (f"WITH {INPUT} AS (SELECT * FROM {self._changelog} WHERE hr_timestamp > ? AND hr_timestamp <= ?) "
               f"{self._consolidate}")
        return protocol_intervals(cursor.execute(sql, [after, upto]).fetch_arrow_table())


class ChangeReader:
    """Reads one sink's input (see module docstring). `columns`: the sink's columns and DuckDB types, key first
    (SinkInput.columns); `delta`: delta updates. Either serving store: its `dialect` picks the queries."""

    def __init__(self, store: SinkStore, sink_input: SinkInput, columns: list[tuple[str, str]],
                 delta: bool, max_changes: int = DEFAULT_MAX_CHANGES) -> None:
        self._store = store
        self._input = sink_input
        self._names = [name for name, _ in columns]
        self._delta = delta
        self._max_changes = max_changes
        self._queries: ChangeQueries
        if store.dialect == "postgres":
            assert isinstance(store, PostgresServingStore)
            self._queries = PostgresChangeQueries(store, sink_input, columns, delta)
        else:
            assert isinstance(store, ServingStore)
            self._queries = DuckDBChangeQueries(store, sink_input, columns, delta)

    def latest(self) -> int | None:
        """The input's latest upstream commit timestamp (None: it never committed)."""
        return self._store.latest_timestamp(self._input.materialization)

    def next_batch(self, after: int | None, snapshot_at: int | None = None) -> ChangeBatch | None:
        """The changes after position `after`, or None when there are none yet. `after` None: the snapshot of
        the input as of `snapshot_at` (a commit timestamp whose later changes the changelog still holds), so a
        replayed snapshot is the same snapshot; without it, as of the latest commit."""
        with self._queries.transaction() as handle:
            latest = self._queries.latest(handle)
            if after is None:
                return None if latest is None else self._snapshot(handle, latest, snapshot_at)
            if latest is None or latest <= after:
                return None
            return self._changes(handle, after, latest)

    def lag(self, position: int | None) -> Lag:
        with self._queries.transaction() as handle:
            latest = self._queries.latest(handle)
            if latest is None:
                return Lag(None, 0, None)
            if position is None:
                return Lag(latest, 1, latest)
            count, oldest = self._queries.pending(handle, position, latest)
            return Lag(latest, count, oldest)

    # ---------------------------------------------------------------------------------------------- reading

    def _snapshot(self, handle: Any, latest: int, at: int | None) -> ChangeBatch:
        if at is None or at >= latest:
            table = self._queries.snapshot(handle, latest, None)
            # Nothing was committed after `latest`, so this is also the state just before the changelog's frontier:
            # start after it (a quiet input's frontier may have moved past its last commit).
            position = max(latest, self._queries.since(handle) - 1)
        else:
            self._check_retained(handle, at)
            table = self._queries.snapshot(handle, at, at)
            position = at
        if self._delta:
            stamps = pa.array([position if at is None else at] * table.num_rows, pa.int64())
            diffs = pa.array([1] * table.num_rows, pa.int32())
            delta = table.add_column(0, "hr_diff", diffs).add_column(0, "hr_timestamp", stamps)
            return ChangeBatch(None, position, table.num_rows, delta=delta)
        return ChangeBatch(None, position, table.num_rows, rows=table)

    def _check_retained(self, handle: Any, after: int) -> None:
        since = self._queries.since(handle)
        if after + 1 < since:
            raise ChangelogCompacted(f"the changes of {self._input.relation} after {after} were compacted "
                                     f"(retained from {since})",
                                     hint="drop the sink and create it again to start from a snapshot")

    def _changes(self, handle: Any, after: int, latest: int) -> ChangeBatch | None:
        self._check_retained(handle, after)
        upto, count = self._cut(handle, after, latest)
        if count == 0:
            return None
        table = self._queries.consolidated(handle, after, upto)
        if self._delta:
            return ChangeBatch(after, upto, count, delta=table)
        now_present = pc.equal(table["hr_diff"], 1)
        held_before = pc.equal(table[FIRST], -1)
        values = table.select(self._names)
        key_columns = values.select(list(self._input.key))
        return ChangeBatch(
            after, upto, count,
            rows=_nonempty(values.filter(pc.and_(now_present, pc.invert(held_before)))),
            updated=_nonempty(values.filter(pc.and_(now_present, held_before))),
            deleted=_nonempty(key_columns.filter(pc.and_(pc.invert(now_present), held_before))))

    def _cut(self, handle: Any, after: int, latest: int) -> tuple[int, int]:
        """The last upstream commit of this batch (whole commits, about max_changes changes) and the changes."""
        per_commit = self._queries.per_commit(handle, after, latest)
        if not per_commit:
            return latest, 0
        upto, total = per_commit[0]
        for timestamp, running in per_commit[1:]:
            if running > self._max_changes:
                break
            upto, total = timestamp, running
        if total == per_commit[-1][1]:
            upto = latest  # every change up to the latest commit: the position may move past quiet commits too
        return int(upto), int(total)


_MICROS_PER_DAY = 86_400_000_000


def protocol_intervals(table: pa.Table) -> pa.Table:
    """DuckDB's INTERVAL columns (month_day_nano_interval) as the protocol's int64 microseconds, 1 month = 30 days,
    as the PostgreSQL serving store's reads give them (sink/postgres_reads.py) and the drivers take them."""
    for index, field in enumerate(table.schema):
        if field.type == pa.month_day_nano_interval():
            micros = [None if value is None
                      else (value.months * 30 + value.days) * _MICROS_PER_DAY + value.nanoseconds // 1000
                      for value in table.column(index).to_pylist()]
            table = table.set_column(index, pa.field(field.name, pa.int64()), pa.array(micros, pa.int64()))
    return table


def _nonempty(table: pa.Table) -> pa.Table | None:
    return table if table.num_rows else None
