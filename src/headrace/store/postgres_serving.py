"""The serving store on the store PostgreSQL: the ServingStore API (store/serving.py) over real PostgreSQL relations.

Same layout and names as the DuckDB store, so `qualified_name` / `changelog_table` mean the same relation in both:
  * schema `public` for views and tables' public relations, `headrace_internal` for sources, table storage,
    changelogs, checkpoints and frontiers;
  * `headrace_internal.checkpoints` (materialization, key range, fence, checkpoint jsonb, committed_at bigint: the
    commit timestamp of the range's latest transaction), written by the PostgreSQL serving driver
    (materialize/drivers/postgres_serving.py) in the same transaction as the data;
  * `headrace_internal.quarantine`: the quarantined log records (store/quarantine.py's columns), written by the
    driver in the transaction of the batch that quarantined them;
  * per binding table a changelog headrace_internal."changes_<schema>.<table>" (hr_timestamp bigint, hr_diff
    integer, then the table's columns) and its `since` frontier in `headrace_internal.changelog_frontiers`.

Column types: the binding's (DuckDB-spelled) types map to PostgreSQL's as the POSTGRES sink maps them
(drivers/postgres_sql.py): VARCHAR text, JSON jsonb, TIMESTAMPTZ timestamptz, BIGINT bigint, INTEGER integer, DOUBLE
double precision, BOOLEAN boolean, BLOB bytea, DECIMAL(p,s) numeric(p,s), DATE date, TIMESTAMP timestamp, UUID uuid,
INTERVAL interval. JSON is jsonb, not json: json has no equality operator, so a json column could be neither a key
nor grouped, compared or made DISTINCT; `->>` answers the same on both, and the text PostgreSQL prints is jsonb's
normal form (the stored text was already orjson's normal form, never the sender's bytes).

Readers get what the DuckDB store returns: `Snapshot` / `Changes` of Python tuples (json as its text, timestamptz
as an aware UTC datetime, numeric as Decimal, bytea as bytes, uuid as UUID, interval as timedelta). Snapshots and
changes are read in one REPEATABLE READ transaction, so the timestamp (or frontier) and the rows agree.

Commit timestamps: ms since the epoch, strictly increasing, handed out in memory by `next_commit_timestamp` (one
server owns the store; restarted from the largest recorded `committed_at`), as in store/serving.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

from headrace.errors import FeatureNotSupported, HeadraceError, InternalError
from headrace.materialize.drivers.postgres_sql import MAX_IDENTIFIER_BYTES, duckdb_type, pg_type
from headrace.materialize.drivers.postgres_tables import existing_columns, primary_key
from headrace.materialize.protocol import Binding
from headrace.store.quarantine import QUARANTINE_FIELD, QUARANTINE_SOURCE_FIELD, QUARANTINE_TABLE
from headrace.store.view_errors import ERROR_ROWS_DDL
from headrace.store.serving import (
    CHANGELOG_COLUMNS,
    CHANGELOG_PREFIX,
    CHECKPOINTS_TABLE,
    DEFAULT_RETENTION_MS,
    FRONTIERS_TABLE,
    INTERNAL_SCHEMA,
    PUBLIC_SCHEMA,
    SUPPORTED_TYPES,
    Changes,
    CommitClock,
    ChangelogCompacted,
    Snapshot,
    Statement,
    changelog_name,
    changelog_table,
    qualified_name,
    quote_ident,
    schema_and_table,
)
from headrace.store.table_types import is_exact_store_type

POOL_SIZE = 4  # idle connections kept; more are opened while more threads read at once
_SESSION = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET extra_float_digits = 1"


_BINDING_TYPES = {pg_type(name): name for name in (*SUPPORTED_TYPES, "DATE", "TIMESTAMP", "UUID", "INTERVAL")}


def store_type(format_type: str) -> str:
    """PostgreSQL's spelling of a column type (format_type) -> the binding type spelling ("numeric(10,2)" ->
    "DECIMAL(10,2)", "double precision" -> "DOUBLE"); a type the store never creates comes back upper-cased."""
    if format_type.startswith("numeric("):
        return "DECIMAL" + format_type[len("numeric"):]
    return _BINDING_TYPES.get(format_type, format_type.upper())


def column_type(type_name: str) -> str:
    """The PostgreSQL column type of a binding type, or FeatureNotSupported."""
    canonical = duckdb_type(type_name)
    if canonical is None or (canonical not in SUPPORTED_TYPES and not is_exact_store_type(canonical)):
        raise FeatureNotSupported(f"column type {type_name} is not supported by the serving store",
                                  hint=f"supported: {', '.join(sorted(SUPPORTED_TYPES))}, DECIMAL(p,s), DATE, "
                                       "TIMESTAMP, UUID, INTERVAL")
    return pg_type(canonical)


def _check_name_lengths(resource_path: tuple[str, ...]) -> None:
    """PostgreSQL truncates a name beyond 63 bytes (with a NOTICE): two long names would become one relation."""
    schema, table = schema_and_table(resource_path)
    changelog = changelog_name(resource_path)
    if max(len(schema.encode()), len(changelog.encode())) > MAX_IDENTIFIER_BYTES:
        room = MAX_IDENTIFIER_BYTES - (len(changelog.encode()) - len(table.encode()))
        raise HeadraceError(f'name "{table}" is too long for the serving store: its changelog "{changelog}" would '
                            f"exceed PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes", sqlstate="42622", http_status=400,
                            hint=f"use a name of at most {room} bytes")


def record_quarantined(cursor: psycopg.Cursor[Any], materialization: str, runtime_checkpoint: dict[str, Any],
                       refused: Sequence[list[Any]] = ()) -> int:
    """store/quarantine.py's record_quarantined on PostgreSQL: the checkpoint's quarantined records and the
    driver's own `refused` entries ([log_offset, received_at_us, sqlstate, reason]) into
    headrace_internal.quarantine, a record met again ignored by its key. Within the caller's transaction."""
    entries = [*(runtime_checkpoint.get(QUARANTINE_FIELD) or ()), *refused]
    if not entries:
        return 0
    source = str(runtime_checkpoint.get(QUARANTINE_SOURCE_FIELD, materialization))
    cursor.executemany(
        f"INSERT INTO {QUARANTINE_TABLE} VALUES (%s, %s, %s, timestamptz 'epoch' + %s * interval '1 microsecond', "
        "%s, %s, now()) ON CONFLICT DO NOTHING",
        [(source, materialization, int(entry[0]), None if entry[1] is None else int(entry[1]), str(entry[2]),
          str(entry[3])) for entry in entries])
    return len(entries)


class ConnectionPool:
    """A small pool of psycopg connections (autocommit off, UTC, json/jsonb loaded as text like DuckDB's). A
    connection is handed back rolled back, or closed when broken; at most `size` idle ones are kept."""

    def __init__(self, conninfo: str, size: int = POOL_SIZE) -> None:
        self._conninfo = conninfo
        self._size = size
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.opened = 0  # connections opened, and those handed out now: headrace_store_pool_* (metrics/store.py)
        self.in_use = 0

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    def _open(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self._conninfo, autocommit=False, application_name="headrace-serving")
        self.opened += 1
        for name in ("json", "jsonb"):
            conn.adapters.register_loader(name, TextLoader)
        conn.execute(_SESSION)
        conn.commit()
        return conn

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self._lock:
            if self._closed:
                raise InternalError("the serving store is closed")
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = self._open()
        self.in_use += 1
        try:
            yield conn
        finally:
            self.in_use -= 1
            self._give_back(conn)

    def _give_back(self, conn: psycopg.Connection[Any]) -> None:
        if not conn.closed:
            try:
                conn.rollback()
            except psycopg.Error:
                conn.close()
        with self._lock:
            if not conn.closed and not self._closed and len(self._idle) < self._size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class PostgresServingStore(CommitClock):
    """The serving store in the store PostgreSQL's database `conninfo` names. Thread-safe."""

    dialect = "postgres"  # the SQL its readers write (ServingStore: "duckdb")

    def __init__(self, conninfo: str, pool_size: int = POOL_SIZE) -> None:
        self.conninfo = conninfo
        self.pool = ConnectionPool(conninfo, pool_size)
        self._ddl_lock = threading.Lock()  # apply / drop of one process never interleave
        self._clock_lock = threading.Lock()
        with self.pool.connection() as conn:
            for schema in (INTERNAL_SCHEMA, PUBLIC_SCHEMA):
                if conn.execute("SELECT FROM pg_namespace WHERE nspname = %s", [schema]).fetchone() is None:
                    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {CHECKPOINTS_TABLE} (materialization text NOT NULL, "
                         "key_begin bigint NOT NULL, key_end bigint NOT NULL, fence bigint NOT NULL, "
                         "checkpoint jsonb, committed_at bigint, PRIMARY KEY (materialization, key_begin, key_end))")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {FRONTIERS_TABLE} (changelog text PRIMARY KEY, "
                         "since bigint NOT NULL)")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {QUARANTINE_TABLE} (source text NOT NULL, "
                         "materialization text NOT NULL, log_offset bigint NOT NULL, received_at timestamptz, "
                         "sqlstate text NOT NULL, reason text NOT NULL, quarantined_at timestamptz NOT NULL, "
                         "PRIMARY KEY (materialization, log_offset))")
            conn.execute(ERROR_ROWS_DDL)  # views' errors (store/view_errors.py)
            row = conn.execute(f"SELECT max(committed_at) FROM {CHECKPOINTS_TABLE}").fetchone()
            conn.commit()
        self._last_timestamp = int(row[0]) if row and row[0] is not None else 0
        self.commit_count = 0  # data commits so far (note_committed), as store/serving.py keeps it
        self._commit_listeners: list[Callable[[], None]] = []

    def execute(self, *statements: Statement) -> list[tuple[Any, ...]]:
        """Run `statements` (SQL, or SQL and its `?` parameters, as ServingStore.execute takes them) in one
        transaction; the last one's rows. A PostgreSQL error is a HeadraceError with PostgreSQL's SQLSTATE."""
        with self.pool.connection() as conn:
            rows: list[tuple[Any, ...]] = []
            try:
                for statement in statements:
                    sql, parameters = (statement, ()) if isinstance(statement, str) else statement
                    if parameters:  # `?` as psycopg spells it; a literal % must then be doubled
                        sql = sql.replace("%", "%%").replace("?", "%s")
                    with conn.cursor() as cursor:
                        cursor.execute(sql, list(parameters) or None)
                        rows = cursor.fetchall() if cursor.description else []
                conn.commit()
            except psycopg.Error as exc:
                conn.rollback()
                raise HeadraceError(str(exc.diag.message_primary or exc),
                                    sqlstate=exc.sqlstate or "XX000") from exc
            return rows

    # ------------------------------------------------------------------------------------------ resources

    def apply(self, binding: Binding) -> list[str]:
        """Create the binding's table and changelog, or migrate them (idempotent), as ServingStore.apply does:
        a new value column is added, nullable; a column no longer selected is made nullable; a changed key or a
        changed column type is refused. Returns what was done."""
        missing = [c for c in binding.columns if c not in binding.column_types]
        if missing:
            raise InternalError(f"binding {binding.resource_path} has no type for columns {missing}")
        if len(set(binding.columns)) != len(binding.columns):
            raise InternalError(f"binding {binding.resource_path} names a column twice: {binding.columns}")
        _check_name_lengths(binding.resource_path)
        types: dict[str, str] = {}
        for column in binding.columns:
            if column in CHANGELOG_COLUMNS:
                raise FeatureNotSupported(f"column name {column!r} is reserved for the changelog")
            types[column] = column_type(binding.column_types[column])
        with self._ddl_lock, self.pool.connection() as conn:
            schema, table = schema_and_table(binding.resource_path)
            existing = existing_columns(conn, schema, table)
            if existing:
                actions = self._migrate(conn, binding, types, existing)
            else:
                actions = self._create(conn, binding, types)
            conn.commit()
            return actions

    def _create(self, conn: psycopg.Connection[Any], binding: Binding, types: dict[str, str]) -> list[str]:
        table = qualified_name(binding.resource_path)
        keyed = bool(binding.key) and not binding.delta_updates  # delta updates append, so keys repeat
        definitions = [f"{quote_ident(c)} {types[c]}{' NOT NULL' if keyed and c in binding.key else ''}"
                       for c in binding.columns]
        if keyed:
            definitions.append(f"PRIMARY KEY ({', '.join(quote_ident(c) for c in binding.key)})")
        schema, _ = schema_and_table(binding.resource_path)
        if conn.execute("SELECT FROM pg_namespace WHERE nspname = %s", [schema]).fetchone() is None:
            conn.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        conn.execute(f"CREATE TABLE {table} ({', '.join(definitions)})")
        self._ensure_changelog(conn, binding.resource_path, [(c, types[c]) for c in binding.columns])
        return [f"created table {table} and its changelog"]

    def _migrate(self, conn: psycopg.Connection[Any], binding: Binding, types: dict[str, str],
                 existing: dict[str, str]) -> list[str]:
        table = qualified_name(binding.resource_path)
        schema, name = schema_and_table(binding.resource_path)
        for column in binding.columns:
            if column in existing and existing[column] != types[column]:
                raise InternalError(f"table {table} has column {column!r} of type {existing[column]}, the binding "
                                    f"expects {types[column]}; drop it first")
            if column in binding.key and column not in existing:
                raise InternalError(f"table {table} lacks key column {column!r}; a key cannot change, drop it first")
        oid = conn.execute("SELECT to_regclass(%s)::oid", [table]).fetchone()
        assert oid is not None and oid[0] is not None
        keys = primary_key(conn, int(oid[0]))
        expected_keys = [] if binding.delta_updates else list(binding.key)
        if keys != expected_keys:
            raise InternalError(f"table {table} has primary key {keys}, the binding needs {expected_keys}"
                                f"{' (delta updates append: no key)' if binding.delta_updates else ''}; "
                                "drop it first")
        actions = []
        for column in binding.columns:
            if column not in existing:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {quote_ident(column)} {types[column]}")
                actions.append(f"added column {column!r} {types[column]} to {table}")
        not_null = {row[0] for row in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attnotnull",
            [int(oid[0])]).fetchall()}
        for column in existing:
            if column not in binding.columns and column in not_null:
                conn.execute(f"ALTER TABLE {table} ALTER COLUMN {quote_ident(column)} DROP NOT NULL")
                actions.append(f"made column {column!r} of {table} nullable (no longer selected)")
        columns = existing_columns(conn, schema, name)
        actions += self._ensure_changelog(conn, binding.resource_path, list(columns.items()))
        return actions

    def _ensure_changelog(self, conn: psycopg.Connection[Any], resource_path: tuple[str, ...],
                          columns: list[tuple[str, str]]) -> list[str]:
        """Create the changelog (or add the table's new columns to it) and its frontier row."""
        changelog = changelog_table(resource_path)
        existing = existing_columns(conn, INTERNAL_SCHEMA, changelog_name(resource_path))
        if not existing:
            definitions = ["hr_timestamp bigint NOT NULL", "hr_diff integer NOT NULL"]
            definitions += [f"{quote_ident(column)} {type_name}" for column, type_name in columns]
            conn.execute(f"CREATE TABLE {changelog} ({', '.join(definitions)})")
            conn.execute(f"CREATE INDEX ON {changelog} (hr_timestamp)")  # changes_since and compaction range on it
            # A table that already holds rows has no history before now.
            has_rows = conn.execute(f"SELECT EXISTS (SELECT FROM {qualified_name(resource_path)})").fetchone()
            since = self.next_commit_timestamp() if has_rows and has_rows[0] else 0
            conn.execute(f"INSERT INTO {FRONTIERS_TABLE} VALUES (%s, %s) ON CONFLICT (changelog) DO UPDATE "
                         "SET since = excluded.since", [changelog_name(resource_path), since])
            return [f"created changelog {changelog}"] if has_rows and has_rows[0] else []
        added = []
        for column, type_name in columns:
            if column not in existing:
                conn.execute(f"ALTER TABLE {changelog} ADD COLUMN {quote_ident(column)} {type_name}")
                added.append(f"added column {column!r} to {changelog}")
        return added

    def columns(self, resource_path: tuple[str, ...]) -> dict[str, tuple[str, bool]] | None:
        """The table's columns (name -> (binding type spelling, nullable)), or None if it does not exist."""
        schema, table = schema_and_table(resource_path)
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                [f"{quote_ident(schema)}.{quote_ident(table)}"]).fetchall()
        if not rows:
            return None
        return {name: (store_type(type_name), bool(nullable)) for name, type_name, nullable in rows}

    def drop(self, resource_path: tuple[str, ...]) -> None:
        with self._ddl_lock, self.pool.connection() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {qualified_name(resource_path)}")
            conn.execute(f"DROP TABLE IF EXISTS {changelog_table(resource_path)}")
            conn.execute(f"DELETE FROM {FRONTIERS_TABLE} WHERE changelog = %s", [changelog_name(resource_path)])
            conn.commit()

    # ------------------------------------------------------------------------------------------ readers

    @contextmanager
    def reading(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        """`conn` as given (the caller's transaction), or a pooled one in a REPEATABLE READ transaction."""
        if conn is not None:
            yield conn
            return
        with self.pool.connection() as own:
            own.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield own

    def latest_timestamp(self, materialization: str, conn: psycopg.Connection[Any] | None = None) -> int | None:
        """The commit timestamp the store has applied `materialization` up to (None: never committed)."""
        with self.reading(conn) as reader:
            row = reader.execute(f"SELECT max(committed_at) FROM {CHECKPOINTS_TABLE} WHERE materialization = %s",
                                 [materialization]).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def changelog_since(self, resource_path: tuple[str, ...], conn: psycopg.Connection[Any] | None = None) -> int:
        """The changelog's `since` frontier: every change with hr_timestamp >= since is retained."""
        with self.reading(conn) as reader:
            row = reader.execute(f"SELECT since FROM {FRONTIERS_TABLE} WHERE changelog = %s",
                                 [changelog_name(resource_path)]).fetchone()
        if row is None:
            raise InternalError(f"{qualified_name(resource_path)} has no changelog")
        return int(row[0])

    def changes_since(self, resource_path: tuple[str, ...], timestamp: int, upto: int | None = None,
                      conn: psycopg.Connection[Any] | None = None) -> Changes:
        """Changes committed after `timestamp` (and at or before `upto`), ordered by timestamp, retractions
        first. ChangelogCompacted if some were compacted away (timestamp + 1 < since)."""
        with self.reading(conn) as reader:
            since = self.changelog_since(resource_path, reader)
            if timestamp + 1 < since:
                raise ChangelogCompacted(
                    f"changes of {qualified_name(resource_path)} after {timestamp} were compacted "
                    f"(retained from {since})", hint="read a snapshot first, then the changes after it")
            bound, parameters = ("", [timestamp]) if upto is None else (" AND hr_timestamp <= %s", [timestamp, upto])
            with reader.cursor() as cursor:
                cursor.execute(f"SELECT * FROM {changelog_table(resource_path)} WHERE hr_timestamp > %s{bound} "
                               "ORDER BY hr_timestamp, hr_diff", parameters)
                assert cursor.description is not None
                names = tuple(d.name for d in cursor.description)[len(CHANGELOG_COLUMNS):]
                return Changes(names, cursor.fetchall())

    def snapshot(self, resource_path: tuple[str, ...], materialization: str) -> Snapshot:
        """The table's rows and the commit timestamp they reflect, read in one transaction."""
        with self.reading(None) as reader:
            timestamp = self.latest_timestamp(materialization, reader)
            with reader.cursor() as cursor:
                cursor.execute(f"SELECT * FROM {qualified_name(resource_path)}")
                assert cursor.description is not None
                return Snapshot(timestamp, tuple(d.name for d in cursor.description), cursor.fetchall())

    def compact_changelogs(self, retention_ms: int = DEFAULT_RETENTION_MS, now_ms: int | None = None,
                           holds: Mapping[str, int] | None = None) -> dict[str, int]:
        """Delete changes older than `retention_ms` from every changelog and raise its `since` frontier to the
        cutoff; `holds` (per changelog name, a position a reader still needs) keeps the cutoff at or below
        position + 1 there. Returns the rows deleted per changelog name (each changelog its own transaction)."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        retention_cutoff = now_ms - retention_ms
        holds = holds or {}
        deleted: dict[str, int] = {}
        with self.pool.connection() as conn:
            names = [row[0] for row in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r' AND starts_with(c.relname, %s)",
                [INTERNAL_SCHEMA, CHANGELOG_PREFIX]).fetchall()]
            conn.commit()
            for name in names:
                cutoff = min(retention_cutoff, holds[name] + 1) if name in holds else retention_cutoff
                table = f"{INTERNAL_SCHEMA}.{quote_ident(name)}"
                try:
                    count = conn.execute(f"DELETE FROM {table} WHERE hr_timestamp < %s", [cutoff]).rowcount
                    conn.execute(f"INSERT INTO {FRONTIERS_TABLE} AS f VALUES (%s, %s) ON CONFLICT (changelog) "
                                 "DO UPDATE SET since = greatest(f.since, excluded.since)", [name, cutoff])
                    conn.commit()
                except psycopg.errors.UndefinedTable:
                    conn.rollback()  # dropped meanwhile
                    continue
                deleted[name] = max(count, 0)
        return deleted

    def close(self) -> None:
        self.pool.close()
