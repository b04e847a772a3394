"""The serving store: one embedded DuckDB database file that SQL SELECTs read and materializations write.

Layout:
  * schema `public` for user-visible objects, schema `headrace_internal` for materialized sources;
  * `headrace_internal.checkpoints`: per materialization key range its runtime checkpoint, fence and
    `committed_at`, the commit timestamp of its latest transaction (see materialize/drivers/serving.py for how
    they commit together with the data);
  * a changelog per binding table, `changelog_table(resource_path)`, i.e. headrace_internal."changes_<schema>.<table>":
    columns hr_timestamp BIGINT (the commit timestamp), hr_diff INTEGER (+1 / -1), then the table's columns. An
    insert is +1 new row, an update -1 old row and +1 new row, a delete -1 old row, all at the commit's timestamp,
    written in the same DuckDB transaction as the data (an unchanged row rewritten shows as -1/+1 at one
    timestamp, which consolidates to nothing);
  * `headrace_internal.changelog_frontiers`: per changelog its `since` frontier: every change with
    hr_timestamp >= since is retained (compaction deletes older ones and raises `since`).

Commit timestamps are ms since the epoch, strictly increasing per store: max(previous + 1, now), handed out by
`next_commit_timestamp` (in memory: one server owns the file; restarted from the largest recorded timestamp).
SUBSCRIBE reads a consistent `snapshot` (rows and the timestamp they reflect) and then `changes_since` it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from headrace.errors import FeatureNotSupported, HeadraceError, InternalError
from headrace.materialize.protocol import Binding
from headrace.store.quarantine import ensure_quarantine_table
from headrace.store.view_errors import ERROR_ROWS_DDL
from headrace.store.table_types import is_exact_store_type  # tables' DECIMAL(p,s), DATE, TIMESTAMP, UUID, INTERVAL

INTERNAL_SCHEMA = "headrace_internal"
PUBLIC_SCHEMA = "public"
CHECKPOINTS_TABLE = f"{INTERNAL_SCHEMA}.checkpoints"
FRONTIERS_TABLE = f"{INTERNAL_SCHEMA}.changelog_frontiers"
CHANGELOG_PREFIX = "changes_"
CHANGELOG_COLUMNS = ("hr_timestamp", "hr_diff")  # reserved: a binding may not use these names
DEFAULT_RETENTION_MS = 10 * 60 * 1000

# The DuckDB column types a binding may use; anything else is refused rather than spliced into DDL.
SUPPORTED_TYPES = frozenset({"VARCHAR", "JSON", "TIMESTAMPTZ", "BIGINT", "INTEGER", "DOUBLE", "BOOLEAN",
                             "BLOB"})
# information_schema.columns.data_type spelling of each supported type
_CATALOG_TYPE_NAMES = {"TIMESTAMP WITH TIME ZONE": "TIMESTAMPTZ"}


Statement = str | tuple[str, Sequence[Any]]  # SQL, or SQL and its `?` parameters (ServingStore.execute)


class ChangelogCompacted(HeadraceError):
    """Changes older than the changelog's retention were asked for: the reader must start from a snapshot."""

    sqlstate = "55000"  # object_not_in_prerequisite_state
    http_status = 410


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _schema_and_table(resource_path: tuple[str, ...]) -> tuple[str, str]:
    if not 1 <= len(resource_path) <= 2:
        raise InternalError(f"resource path {resource_path!r} must be (table,) or (schema, table)")
    return (resource_path[0], resource_path[1]) if len(resource_path) > 1 else (PUBLIC_SCHEMA, resource_path[0])


schema_and_table = _schema_and_table  # shared with store/postgres_serving.py


def qualified_name(resource_path: tuple[str, ...]) -> str:
    """("headrace_internal", "source_u1") -> "headrace_internal"."source_u1"; a 1-part path lives in public."""
    return ".".join(quote_ident(part) for part in _schema_and_table(resource_path))


def changelog_name(resource_path: tuple[str, ...]) -> str:
    """The changelog's table name (in headrace_internal): "changes_<schema>.<table>"."""
    schema, table = _schema_and_table(resource_path)
    return f"{CHANGELOG_PREFIX}{schema}.{table}"


def changelog_table(resource_path: tuple[str, ...]) -> str:
    """The quoted, qualified changelog table of a binding table, e.g. headrace_internal."changes_public.v"."""
    return f"{INTERNAL_SCHEMA}.{quote_ident(changelog_name(resource_path))}"


@dataclass(frozen=True, slots=True)
class Changes:
    """Rows (hr_timestamp, hr_diff, *columns) of one changelog, ordered by timestamp, retractions first."""

    columns: tuple[str, ...]  # the table's columns, after hr_timestamp and hr_diff
    rows: list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A table's rows as of commit timestamp `timestamp` (None: the materialization never committed)."""

    timestamp: int | None
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]


def default_threads() -> int:
    """DuckDB's worker threads by default: a core is left to the server's event loop. DuckDB's workers run at the
    priority of the thread that opened the database, so the work of a query run at a lower priority (the
    pipeline's commits) would still compete with the loop on them; measured at 5,000 webhooks/s on 2 cores
    (pipeline at SCHED_IDLE, its commits niced), ack p99 8-18 ms with 1 thread against 17-30 ms with 2."""
    return max(1, (os.cpu_count() or 2) - 1)


def locked_down_config(threads: int) -> dict[str, Any]:
    """DuckDB settings of the serving store: no file outside the database (and its own `.tmp/` spill directory)
    can be read or written, no extension installed or loaded, and no setting changed afterwards. SQL reaches the
    store only through translated SELECTs (sql/select.py refuses DuckDB's file functions by name as well); this
    is the engine's own guarantee should a translation ever let one through: read_text / read_csv / read_json /
    read_blob / read_parquet / glob, COPY ... TO a file, ATTACH of a file, INSTALL / LOAD and SET all fail here.
    Nothing in the store needs external access: materializations hand it Arrow tables (`register`)."""
    return {
        "threads": threads,
        "enable_external_access": False,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        # PostgreSQL's integer division (int / int truncates); set here since the configuration is locked.
        "integer_division": True,
        "lock_configuration": True,
    }


class CommitClock:
    """What both serving stores (DuckDB here, PostgreSQL in store/postgres_serving.py) keep the same way: commit
    timestamps, strictly increasing per store, and the count and listeners of data commits. Subclasses set
    `_clock_lock`, `_last_timestamp`, `commit_count` and `_commit_listeners` in their __init__."""

    _clock_lock: threading.Lock
    _last_timestamp: int
    commit_count: int
    _commit_listeners: list[Callable[[], None]]

    def note_committed(self) -> None:
        """Called by every writer right after a data commit became visible."""
        with self._clock_lock:
            self.commit_count += 1
        for listener in self._commit_listeners:
            listener()

    def add_commit_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (cheap, non-blocking) after every data commit."""
        self._commit_listeners.append(listener)

    def next_commit_timestamp(self) -> int:
        """A commit timestamp: ms since the epoch, strictly greater than every one handed out before."""
        with self._clock_lock:
            self._last_timestamp = max(self._last_timestamp + 1, time.time_ns() // 1_000_000)
            return self._last_timestamp


class ServingStore(CommitClock):
    """Owns the DuckDB database. Thread-safe: each thread or unit of work takes its own `cursor()`."""

    dialect = "duckdb"  # the SQL its readers write (PostgresServingStore: "postgres")

    def __init__(self, path: Path, threads: int | None = None) -> None:
        self.path = path
        self._connection = duckdb.connect(str(path), config=locked_down_config(threads or default_threads()))
        self._lock = threading.Lock()  # guards cursor creation and DDL on the shared root connection
        self._clock_lock = threading.Lock()
        self._connection.execute(f"CREATE SCHEMA IF NOT EXISTS {INTERNAL_SCHEMA}")
        self._connection.execute(f"CREATE SCHEMA IF NOT EXISTS {PUBLIC_SCHEMA}")
        self._connection.execute(
            f"CREATE TABLE IF NOT EXISTS {CHECKPOINTS_TABLE} ("
            "materialization VARCHAR NOT NULL, key_begin BIGINT NOT NULL, key_end BIGINT NOT NULL, "
            "fence BIGINT NOT NULL, checkpoint VARCHAR, PRIMARY KEY (materialization, key_begin, key_end))"
        )
        # Added after the first release: databases made before it gain the column here.
        self._connection.execute(f"ALTER TABLE {CHECKPOINTS_TABLE} ADD COLUMN IF NOT EXISTS committed_at BIGINT")
        self._connection.execute(f"CREATE TABLE IF NOT EXISTS {FRONTIERS_TABLE} ("
                                 "changelog VARCHAR PRIMARY KEY, since BIGINT NOT NULL)")
        # Here, once, not at each driver Open: concurrent Opens racing on its CREATE conflict in DuckDB's catalog.
        ensure_quarantine_table(self._connection)
        self._connection.execute(ERROR_ROWS_DDL)  # views' errors (store/view_errors.py), likewise
        row = self._connection.execute(f"SELECT max(committed_at) FROM {CHECKPOINTS_TABLE}").fetchone()
        self._last_timestamp = int(row[0]) if row and row[0] is not None else 0
        # Data commits so far (note_committed): in-memory readers (store/arrangements.py) compare it to
        # the count they caught up to, an O(1) "has anything been committed since?".
        self.commit_count = 0
        self._commit_listeners: list[Callable[[], None]] = []  # sinks wake up on commits (sink/manager.py)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to the same database, resolving unqualified names in `public`. Close it after use."""
        with self._lock:
            cursor = self._connection.cursor()
        cursor.execute(f"SET search_path = '{PUBLIC_SCHEMA}'")
        return cursor

    def execute(self, *statements: Statement) -> list[tuple[Any, ...]]:
        """Run `statements` (SQL, or SQL and its `?` parameters) in one transaction; the last one's rows.
        PostgresServingStore.execute takes the same statements: headrace's own DDL and bookkeeping use SQL both
        dialects share (CREATE OR REPLACE VIEW, INSERT ... ON CONFLICT, DELETE)."""
        with self.cursor() as cursor:
            cursor.begin()
            rows: list[tuple[Any, ...]] = []
            try:
                for statement in statements:
                    sql, parameters = (statement, ()) if isinstance(statement, str) else statement
                    cursor.execute(sql, list(parameters))
                    rows = cursor.fetchall() if cursor.description else []
                cursor.commit()
            except BaseException:
                cursor.rollback()
                raise
            return rows

    # ------------------------------------------------------------------------------------------ resources

    def apply(self, binding: Binding) -> list[str]:
        """Create the binding's table and changelog, or migrate them (idempotent: an unchanged binding changes
        nothing). Migrations: a new value column is added, nullable; a column the binding no longer selects
        stays, made nullable. Refused: a changed key, or a column whose type changed. Returns what was done."""
        missing = [c for c in binding.columns if c not in binding.column_types]
        if missing:
            raise InternalError(f"binding {binding.resource_path} has no type for columns {missing}")
        if len(set(binding.columns)) != len(binding.columns):
            raise InternalError(f"binding {binding.resource_path} names a column twice: {binding.columns}")
        types = {column: binding.column_types[column].upper() for column in binding.columns}
        for column, type_name in types.items():
            if type_name not in SUPPORTED_TYPES and not is_exact_store_type(type_name):
                raise FeatureNotSupported(f"column type {type_name} of {column!r} is not supported",
                                          hint=f"supported: {', '.join(sorted(SUPPORTED_TYPES))}")
            if column in CHANGELOG_COLUMNS:
                raise FeatureNotSupported(f"column name {column!r} is reserved for the changelog")
        table = qualified_name(binding.resource_path)
        with self._lock:
            existing = self._columns_of(binding.resource_path)
            if existing is None:
                return self._create(binding, types)
            return self._migrate(binding, types, existing, table)

    def _create(self, binding: Binding, types: dict[str, str]) -> list[str]:
        table = qualified_name(binding.resource_path)
        definitions = []
        for column in binding.columns:
            not_null = " NOT NULL" if column in binding.key and not binding.delta_updates else ""
            definitions.append(f"{quote_ident(column)} {types[column]}{not_null}")
        if binding.key and not binding.delta_updates:  # delta updates append, so keys repeat
            definitions.append(f"PRIMARY KEY ({', '.join(quote_ident(c) for c in binding.key)})")
        self._connection.execute(f"CREATE TABLE {table} ({', '.join(definitions)})")
        self._ensure_changelog(binding.resource_path, [(c, types[c]) for c in binding.columns])
        return [f"created table {table} and its changelog"]

    def _migrate(self, binding: Binding, types: dict[str, str], existing: dict[str, tuple[str, bool]],
                 table: str) -> list[str]:
        actions: list[str] = []
        keys = self._primary_key_of(binding.resource_path)
        for column in binding.columns:
            if column in existing and existing[column][0] != types[column]:
                raise InternalError(f"table {table} has column {column!r} of type {existing[column][0]}, the "
                                    f"binding expects {types[column]}; drop it first")
            if column in binding.key and column not in existing:
                raise InternalError(f"table {table} lacks key column {column!r}; a key cannot change, drop it first")
        expected_keys = [] if binding.delta_updates else list(binding.key)
        if keys != expected_keys:
            raise InternalError(f"table {table} has primary key {keys}, the binding needs {expected_keys}"
                                f"{' (delta updates append: no key)' if binding.delta_updates else ''}; "
                                "drop it first")
        for column in binding.columns:
            if column not in existing:
                self._connection.execute(f"ALTER TABLE {table} ADD COLUMN {quote_ident(column)} {types[column]}")
                actions.append(f"added column {column!r} {types[column]} to {table}")
        for column, (_, nullable) in existing.items():
            if column not in binding.columns and not nullable:
                self._connection.execute(f"ALTER TABLE {table} ALTER COLUMN {quote_ident(column)} DROP NOT NULL")
                actions.append(f"made column {column!r} of {table} nullable (no longer selected)")
        columns = self._columns_of(binding.resource_path)
        assert columns is not None
        actions += self._ensure_changelog(binding.resource_path, [(c, t) for c, (t, _) in columns.items()])
        return actions

    def _ensure_changelog(self, resource_path: tuple[str, ...], columns: list[tuple[str, str]]) -> list[str]:
        """Create the changelog (or add the table's new columns to it) and its frontier row."""
        changelog = changelog_table(resource_path)
        existing = self._columns_of((INTERNAL_SCHEMA, changelog_name(resource_path)))
        if existing is None:
            definitions = ["hr_timestamp BIGINT NOT NULL", "hr_diff INTEGER NOT NULL"]
            definitions += [f"{quote_ident(column)} {type_name}" for column, type_name in columns]
            self._connection.execute(f"CREATE TABLE {changelog} ({', '.join(definitions)})")
            # A table that already holds rows (made before changelogs existed) has no history before now.
            has_rows = self._connection.execute(
                f"SELECT count(*) > 0 FROM {qualified_name(resource_path)}").fetchone()
            since = self.next_commit_timestamp() if has_rows and has_rows[0] else 0
            self._connection.execute(f"INSERT OR REPLACE INTO {FRONTIERS_TABLE} VALUES (?, ?)",
                                     [changelog_name(resource_path), since])
            return [f"created changelog {changelog}"] if has_rows and has_rows[0] else []
        added = []
        for column, type_name in columns:
            if column not in existing:
                self._connection.execute(f"ALTER TABLE {changelog} ADD COLUMN {quote_ident(column)} {type_name}")
                added.append(f"added column {column!r} to {changelog}")
        return added

    def _columns_of(self, resource_path: tuple[str, ...]) -> dict[str, tuple[str, bool]] | None:
        """column -> (type, nullable) in table order, or None if the table does not exist. Lock held."""
        schema, table = _schema_and_table(resource_path)
        rows = self._connection.execute(
            "SELECT column_name, data_type, is_nullable = 'YES' FROM information_schema.columns "
            "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position", [schema, table]).fetchall()
        if not rows:
            return None
        return {name: (_CATALOG_TYPE_NAMES.get(type_name, type_name), nullable) for name, type_name, nullable in rows}

    def _primary_key_of(self, resource_path: tuple[str, ...]) -> list[str]:
        schema, table = _schema_and_table(resource_path)
        row = self._connection.execute(
            "SELECT constraint_column_names FROM duckdb_constraints() WHERE schema_name = ? AND table_name = ? "
            "AND constraint_type = 'PRIMARY KEY'", [schema, table]).fetchone()
        return list(row[0]) if row else []

    def columns(self, resource_path: tuple[str, ...]) -> dict[str, tuple[str, bool]] | None:
        """The table's columns (name -> (DuckDB type, nullable)), or None if it does not exist."""
        with self._lock:
            return self._columns_of(resource_path)

    def drop(self, resource_path: tuple[str, ...]) -> None:
        with self._lock:
            self._connection.execute(f"DROP TABLE IF EXISTS {qualified_name(resource_path)}")
            self._connection.execute(f"DROP TABLE IF EXISTS {changelog_table(resource_path)}")
            self._connection.execute(f"DELETE FROM {FRONTIERS_TABLE} WHERE changelog = ?",
                                     [changelog_name(resource_path)])

    # ------------------------------------------------------------------------------------------ readers

    def latest_timestamp(self, materialization: str, cursor: duckdb.DuckDBPyConnection | None = None) -> int | None:
        """The commit timestamp the store has applied `materialization` up to (None: never committed)."""
        row = self._read(cursor, f"SELECT max(committed_at) FROM {CHECKPOINTS_TABLE} WHERE materialization = ?",
                         [materialization])
        return None if not row or row[0][0] is None else int(row[0][0])

    def changelog_since(self, resource_path: tuple[str, ...],
                        cursor: duckdb.DuckDBPyConnection | None = None) -> int:
        """The changelog's `since` frontier: every change with hr_timestamp >= since is retained."""
        row = self._read(cursor, f"SELECT since FROM {FRONTIERS_TABLE} WHERE changelog = ?",
                         [changelog_name(resource_path)])
        if not row:
            raise InternalError(f"{qualified_name(resource_path)} has no changelog")
        return int(row[0][0])

    def changes_since(self, resource_path: tuple[str, ...], timestamp: int, upto: int | None = None,
                      cursor: duckdb.DuckDBPyConnection | None = None) -> Changes:
        """Changes committed after `timestamp` (and at or before `upto`). ChangelogCompacted if some of them were
        compacted away (timestamp + 1 < since): start again from a snapshot."""
        own = cursor is None
        cursor = cursor or self.cursor()
        try:
            if own:
                cursor.begin()  # frontier and rows from one snapshot, so compaction cannot slip in between
            since = self.changelog_since(resource_path, cursor)
            if timestamp + 1 < since:
                raise ChangelogCompacted(
                    f"changes of {qualified_name(resource_path)} after {timestamp} were compacted "
                    f"(retained from {since})", hint="read a snapshot first, then the changes after it")
            bound, parameters = ("", [timestamp]) if upto is None else (" AND hr_timestamp <= ?", [timestamp, upto])
            result = cursor.execute(f"SELECT * FROM {changelog_table(resource_path)} WHERE hr_timestamp > ?{bound} "
                                    "ORDER BY hr_timestamp, hr_diff", parameters)
            names = tuple(d[0] for d in result.description)[len(CHANGELOG_COLUMNS):]
            return Changes(names, result.fetchall())
        finally:
            if own:
                cursor.rollback()
                cursor.close()

    def snapshot(self, resource_path: tuple[str, ...], materialization: str) -> Snapshot:
        """The table's rows and the commit timestamp they reflect, read in one transaction."""
        cursor = self.cursor()
        try:
            cursor.begin()
            timestamp = self.latest_timestamp(materialization, cursor)
            result = cursor.execute(f"SELECT * FROM {qualified_name(resource_path)}")
            columns = tuple(d[0] for d in result.description)
            return Snapshot(timestamp, columns, result.fetchall())
        finally:
            cursor.rollback()
            cursor.close()

    def compact_changelogs(self, retention_ms: int = DEFAULT_RETENTION_MS, now_ms: int | None = None,
                           holds: Mapping[str, int] | None = None) -> dict[str, int]:
        """Delete changes older than `retention_ms` from every changelog and raise its `since` frontier to the
        cutoff. `holds`: per changelog name, a position whose later changes a reader (a sink) still needs: the
        cutoff stays at or below position + 1 there. Returns the rows deleted per changelog name."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        retention_cutoff = now_ms - retention_ms
        holds = holds or {}
        cursor = self.cursor()
        deleted: dict[str, int] = {}
        try:
            names = [row[0] for row in cursor.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = ? AND starts_with(table_name, ?)",
                [INTERNAL_SCHEMA, CHANGELOG_PREFIX]).fetchall()]
            for name in names:
                cutoff = min(retention_cutoff, holds[name] + 1) if name in holds else retention_cutoff
                cursor.begin()
                try:
                    table = f"{INTERNAL_SCHEMA}.{quote_ident(name)}"
                    count = cursor.execute(f"DELETE FROM {table} WHERE hr_timestamp < ?", [cutoff]).fetchone()
                    cursor.execute(f"INSERT INTO {FRONTIERS_TABLE} VALUES (?, ?) ON CONFLICT (changelog) DO UPDATE "
                                   "SET since = greatest(since, excluded.since)", [name, cutoff])
                    cursor.commit()
                except BaseException:
                    cursor.rollback()
                    raise
                deleted[name] = int(count[0]) if count else 0
        finally:
            cursor.close()
        return deleted

    def _read(self, cursor: duckdb.DuckDBPyConnection | None, sql: str,
              parameters: Sequence[Any]) -> list[tuple[Any, ...]]:
        if cursor is not None:
            return cursor.execute(sql, parameters).fetchall()
        own = self.cursor()
        try:
            return own.execute(sql, parameters).fetchall()
        finally:
            own.close()

    def close(self) -> None:
        with self._lock:
            self._connection.close()
