"""Tables on the PostgreSQL serving store (store/postgres_serving.py): their public relation, the reads writes
need, and the write statements' own queries, evaluated BY PostgreSQL (blocking: run in the executor).

The storage (headrace_internal.table_<id>) has the binding's types (text for varchar(n), integer for int2,
double precision for float4, jsonb for json, ...: the types the serving driver writes); the public relation has the
declared types (store/table_relation_postgres.py).

Rows travel to PostgreSQL (the overlay of acknowledged rows the store lacks, upsert pairs, keys) as one text[]
parameter per column, each value in PostgreSQL's input syntax for its storage type, cast back in the query.

A write's own query (INSERT ... SELECT, UPDATE's SET and WHERE, ON CONFLICT DO UPDATE's SET) runs on a connection
that logs in as `headrace_table_writes`: a role that is no superuser and may only read headrace's relations
(headrace authorizes the statement before it runs), so user expressions cannot reach what only a superuser may
(pg_read_file, lo_import, ...). Not `SET ROLE` on an admin connection: a session whose authenticated user is a
superuser can take it back (`set_config('session_authorization', ...)`, also from inside a function a user
created). Values assigned to columns go
through PostgreSQL's own assignment: they are inserted into a temporary table of the declared column types
(RETURNING them), so a varchar(3) too long is PostgreSQL's 22001, an int2 out of range 22003, a numeric rounded to
its scale and a float4 to real exactly as PostgreSQL would store them. PostgreSQL's errors come back as
HeadraceError with PostgreSQL's SQLSTATE, message, detail and hint."""

from __future__ import annotations

import base64
import secrets
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
import psycopg
from psycopg.adapt import Loader
from psycopg import sql

from headrace.catalog.roles import make_scram_verifier
from headrace.catalog.tables import Table, TableColumn
from headrace.errors import HeadraceError
from headrace.materialize.drivers.postgres_sql import interval_input
from headrace.store.backend import BackendError
from headrace.store.postgres_roles import MIRROR_LOCK_KEY, TABLE_WRITES_ROLE, login_conninfo
from headrace.store.postgres_serving import ConnectionPool, PostgresServingStore, column_type
from headrace.store.serving import CHECKPOINTS_TABLE, INTERNAL_SCHEMA, PUBLIC_SCHEMA, qualified_name, quote_ident
from headrace.store import table_types

Key = tuple[Any, ...]
Document = dict[str, Any]
WRITE_ROLE = TABLE_WRITES_ROLE
ASSIGN_TABLE = "hr_assign"  # the temporary table assigned values go through (pg_temp, dropped at rollback)
_write_pools: dict[str, ConnectionPool] = {}  # store conninfo -> the write role's connections, in this process
_roles_lock = threading.Lock()
_STARTUP_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c extra_float_digits=1"


_EPOCH_2000_MICROS = 946_684_800_000_000  # PostgreSQL's binary timestamps count from 2000-01-01
_EPOCH_2000_DAYS = 10_957


class _TimeText(Loader):
    """timestamp / timestamptz in PostgreSQL's ISO text (DateStyle ISO) as table_types.Exact microseconds."""

    def load(self, data: Any) -> table_types.Exact:
        return table_types.Exact(table_types.parse_time_text(bytes(data).decode()))


class _DateText(Loader):
    def load(self, data: Any) -> table_types.Exact:
        return table_types.Exact(table_types.parse_time_text(bytes(data).decode(), days_only=True))


class _TimeBinary(Loader):
    format = psycopg.pq.Format.BINARY

    def load(self, data: Any) -> table_types.Exact:
        number = struct.unpack("!q", bytes(data))[0]
        infinite = number in (table_types.TIME_INFINITY, table_types.TIME_MINUS_INFINITY)
        return table_types.Exact(number if infinite else number + _EPOCH_2000_MICROS)


class _DateBinary(Loader):
    format = psycopg.pq.Format.BINARY

    def load(self, data: Any) -> table_types.Exact:
        number = struct.unpack("!i", bytes(data))[0]
        infinite = number in (table_types.DATE_INFINITY, table_types.DATE_MINUS_INFINITY)
        return table_types.Exact(number if infinite else number + _EPOCH_2000_DAYS)


def exact_time_loaders(context: psycopg.Connection[Any] | psycopg.Cursor[Any]) -> None:
    """Read timestamp, timestamptz and date as table_types.Exact (their document values), on `context`: any year
    PostgreSQL holds (BC, beyond 9999) and +-infinity, which psycopg's datetime loaders refuse."""
    for name, text, binary in (("timestamp", _TimeText, _TimeBinary), ("timestamptz", _TimeText, _TimeBinary),
                               ("date", _DateText, _DateBinary)):
        context.adapters.register_loader(name, text)
        context.adapters.register_loader(name, binary)


def storage_types(table: Table) -> dict[str, str]:
    """Every storage column -> its PostgreSQL type (as the serving store created it)."""
    return {name: column_type(binding_type) for name, binding_type in table.store_columns().items()}


def ensure_write_role(store: PostgresServingStore) -> ConnectionPool:
    """The role write queries run as and the pool of its own connections (module docstring): a login role that
    is no superuser, reading headrace's relations (those the admin role owns in public and headrace_internal, now
    and later), with a password made at each start and kept in memory only (sent as a SCRAM verifier). Once per
    store per process."""
    with _roles_lock:
        pool = _write_pools.get(store.conninfo)
        if pool is not None:
            return pool
        password = secrets.token_urlsafe(32)
        with store.pool.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIRROR_LOCK_KEY])  # GRANTs on one object serialize
            if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", [WRITE_ROLE]).fetchone() is None:
                conn.execute(f"CREATE ROLE {WRITE_ROLE} NOINHERIT")
            conn.execute(sql.SQL(f"ALTER ROLE {WRITE_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
                                 "NOBYPASSRLS PASSWORD {}").format(sql.Literal(make_scram_verifier(password).text())))
            database = conn.execute("SELECT current_database()").fetchone()
            assert database is not None
            schemas = f"{quote_ident(PUBLIC_SCHEMA)}, {quote_ident(INTERNAL_SCHEMA)}"
            conn.execute(f"GRANT CONNECT, TEMPORARY ON DATABASE {quote_ident(str(database[0]))} TO {WRITE_ROLE}")
            conn.execute(f"GRANT USAGE ON SCHEMA {schemas} TO {WRITE_ROLE}")
            # headrace's relations only (the admin's): never a table a user created in public, which a write query
            # could otherwise read by a name headrace does not see (a function taking a query's text)
            relations = conn.execute(
                "SELECT format('%%I.%%I', n.nspname, c.relname), c.relowner = r.oid FROM pg_catalog.pg_class c "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "JOIN pg_catalog.pg_roles r ON r.rolname = current_user "
                "WHERE n.nspname IN (%s, %s) AND c.relkind IN ('r', 'v', 'm', 'p', 'f')",
                [PUBLIC_SCHEMA, INTERNAL_SCHEMA]).fetchall()
            headraces = [str(name) for name, owned in relations if owned]
            others = [str(name) for name, owned in relations if not owned]
            if headraces:
                conn.execute(f"GRANT SELECT ON {', '.join(headraces)} TO {WRITE_ROLE}")
            if others:  # what an earlier version granted on everything in the schemas
                conn.execute(f"REVOKE SELECT ON {', '.join(others)} FROM {WRITE_ROLE}")
            conn.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schemas} GRANT SELECT ON TABLES TO {WRITE_ROLE}")
            conn.commit()
        # the pool's session settings as startup options, so DISCARD ALL after each use returns to them
        pool = ConnectionPool(login_conninfo(store.conninfo, WRITE_ROLE, password, options=_STARTUP_OPTIONS))
        _write_pools[store.conninfo] = pool
        return pool



def close_write_pool(store: PostgresServingStore) -> None:
    """Close the write role's connections to `store` (at shutdown); the next write opens them again."""
    with _roles_lock:
        pool = _write_pools.pop(store.conninfo, None)
    if pool is not None:
        pool.close()


# ---------------------------------------------------------------------------------------------- values

def input_text(pg_type: str, value: Any) -> str | None:
    """A document value (store/table_log.py) in PostgreSQL's input syntax for its storage type `pg_type`."""
    if value is None:
        return None
    if pg_type == "boolean":
        return "t" if value else "f"
    if pg_type == "double precision":
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(float(value))
    if pg_type == "timestamp with time zone":
        return table_types.time_text(value, with_zone=True)
    if pg_type == "timestamp without time zone":
        return table_types.time_text(value, with_zone=False)
    if pg_type == "date":
        return table_types.date_text(value)
    if pg_type == "interval":
        return interval_input(int(value))
    if pg_type == "jsonb":
        return orjson.dumps(value).decode()
    if pg_type == "bytea":
        return "\\x" + base64.b64decode(value).hex()
    return str(value)  # integers, text, numeric text, uuid text


def rows_relation(table: Table, columns: Sequence[str], rows: Sequence[Sequence[Any]], first_parameter: int,
                  extra: Mapping[str, str] | None = None) -> tuple[str, list[list[str | None]]]:
    """`SELECT casts FROM unnest($n::text[], ...)`: `rows` (document values of `columns`) as a relation with the
    columns' storage types (`extra` names further columns' PostgreSQL types), and its parameters."""
    types = {**storage_types(table), **(extra or {})}
    aliases = ", ".join(f"c{i}" for i in range(len(columns)))
    arrays = ", ".join(f"${first_parameter + i}::text[]" for i in range(len(columns)))
    casts = ", ".join(f"CAST(u.c{i} AS {types[c]}) AS {quote_ident(c)}" for i, c in enumerate(columns))
    parameters = [[input_text(types[c], row[i]) for row in rows] for i, c in enumerate(columns)]
    return f"SELECT {casts} FROM unnest({arrays}) AS u({aliases})", parameters


# ---------------------------------------------------------------------------------------------- reads

def applied_checkpoints(store: PostgresServingStore,
                        materializations: Sequence[str]) -> list[tuple[str, Any]]:
    """(materialization, checkpoint) rows of the checkpoints table (the checkpoint as jsonb's text)."""
    with store.pool.connection() as conn:
        return conn.execute(f"SELECT materialization, checkpoint FROM {CHECKPOINTS_TABLE} "
                            "WHERE materialization = ANY(%s)", [list(materializations)]).fetchall()


def rows_for_keys(store: PostgresServingStore, table: Table, keys: Sequence[Key],
                  storage: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The stored rows with these keys: (column names, rows)."""
    key_columns = list(table.store_key)
    relation, parameters = rows_relation(table, key_columns, keys, 1)
    names = ", ".join(quote_ident(c) for c in key_columns)
    with store.pool.connection() as conn, psycopg.RawCursor(conn) as cursor:
        exact_time_loaders(cursor)
        cursor.execute(f"SELECT * FROM {storage} WHERE ({names}) IN (SELECT {names} FROM ({relation}) AS k)",
                       parameters)
        assert cursor.description is not None
        return [d.name for d in cursor.description], cursor.fetchall()


def current_contents(table: Table, overlay: Mapping[Key, Document | None], storage: str,
                     first_parameter: int) -> tuple[str, list[list[str | None]]]:
    """The table's current contents as a query: the stored rows whose keys the overlay does not touch, then the
    overlay's live rows. Returns the SQL and its parameters (numbered from `first_parameter`)."""
    names = list(table.store_columns())
    column_list = ", ".join(quote_ident(c) for c in names)
    sql = f"SELECT {column_list} FROM {storage} s"
    if not overlay:
        return sql, []
    key_columns = list(table.store_key)
    touched, parameters = rows_relation(table, key_columns, list(overlay), first_parameter)
    join = " AND ".join(f"s.{quote_ident(c)} = k.{quote_ident(c)}" for c in key_columns)
    sql += f" WHERE NOT EXISTS (SELECT FROM ({touched}) AS k WHERE {join})"
    live = [row for row in overlay.values() if row is not None]
    if live:
        rows, more = rows_relation(table, names, [[row.get(c) for c in names] for row in live],
                                   first_parameter + len(parameters))
        sql += f" UNION ALL {rows}"
        parameters += more
    return sql, parameters


def declared_columns(table: Table, relation_sql: str, hidden: bool, only: Sequence[str] | None = None) -> str:
    """SELECT over `relation_sql` (storage-typed columns) giving the declared columns their declared types, as the
    public relation does, so a write's expressions compute on PostgreSQL's types (real * int is real arithmetic,
    json has no equality, ...); with `hidden`, every storage column in order (the key and version too), char(n)
    left unpadded: it may be a key, and a document's value must not change by being read. `only`: those columns."""
    items = []
    for name in (only if only is not None else table.store_columns() if hidden else table.column_names()):
        column = table.column(name)
        quoted = quote_ident(name)
        if column is None or (hidden and column.pg_type == "bpchar"):
            items.append(f"c.{quoted}")
        else:
            items.append(f"CAST(c.{quoted} AS {column.type_sql}) AS {quoted}")
    return f"SELECT {', '.join(items)} FROM ({relation_sql}) AS c"


# ---------------------------------------------------------------------------------------------- write queries

@contextmanager
def _write_transaction(store: PostgresServingStore, assigned: Sequence[TableColumn] | None,
                       settings: Mapping[str, str], inserting: bool = False) -> Iterator[psycopg.Connection[Any]]:
    """A connection of the write role in a transaction (rolled back after), with the session's settings and, when
    `assigned` is given, the temporary table of those column types: `inserting`, with their DEFAULTs (an INSERT's
    VALUES or query goes into it as into the table); else with a row number hr_n first. After use the connection
    is reset (DISCARD ALL: settings, advisory locks, temporary tables a user expression may have left behind)."""
    pool = ensure_write_role(store)
    with pool.connection() as conn:
        try:
            try:
                for name, value in settings.items():
                    conn.execute("SELECT set_config(%s, %s, true)", [name, value])
                if assigned is not None:
                    definitions = [f"c{i} {column.type_sql}{_default_clause(column) if inserting else ''}"
                                   for i, column in enumerate(assigned)]
                    if not inserting:
                        definitions.insert(0, "hr_n bigint")
                    conn.execute(f"CREATE TEMPORARY TABLE {ASSIGN_TABLE} ({', '.join(definitions)}) "
                                 "ON COMMIT DROP")
            except psycopg.Error as error:
                raise from_postgres(error) from None
            yield conn
        finally:
            _reset(conn)


def _reset(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.rollback()
        conn.autocommit = True
        conn.execute("DISCARD ALL")
        conn.autocommit = False
    except psycopg.Error:
        conn.close()  # the pool drops a closed connection


def _default_clause(column: TableColumn) -> str:
    if column.default is None:
        return ""
    from headrace.coordinator.table_defaults import default_ast  # the catalog's DEFAULT, checked at CREATE TABLE

    node = default_ast(column)
    return "" if node is None else f" DEFAULT {node.sql(dialect='postgres')}"


def insert_sql(query_sql: str, columns: Sequence[TableColumn], with_clause: str = "") -> str:
    """INSERT INTO the temporary table of `columns` (no column list: as the statement into its table, fewer
    values than columns leaving the rest to their DEFAULT, more being PostgreSQL's 42601)."""
    targets = ", ".join(f"c{i}" for i in range(len(columns)))
    return f"{with_clause} INSERT INTO {ASSIGN_TABLE} {query_sql} RETURNING {targets}"


def run_insert_query(store: PostgresServingStore, query_sql: str, params: Sequence[Any],
                     columns: Sequence[TableColumn], settings: Mapping[str, str],
                     with_clause: str = "") -> list[tuple[Any, ...]]:
    """INSERT ... SELECT / VALUES with expressions: `query_sql` (PostgreSQL, the statement's own query) inserted
    into `columns` as PostgreSQL assigns them. Returns the assigned values, in the query's order."""
    with _write_transaction(store, columns, settings, inserting=True) as conn:
        return _fetch(conn, insert_sql(query_sql, columns, with_clause), params)


def describe_parameters(store: PostgresServingStore, sql: str, declared: Sequence[int],
                        assigned: Sequence[TableColumn] | None, inserting: bool = False) -> tuple[int, ...]:
    """PostgreSQL's types of the parameters of `sql` (a write's query, as run_insert_query / run_assigning_query
    run it), given the client's `declared` ones (0: to infer): what Parse would say of the statement itself."""
    with _write_transaction(store, assigned, {}, inserting) as conn:
        result = conn.pgconn.prepare(b"", sql.encode(), list(declared) or None)
        if result.status != psycopg.pq.ExecStatus.COMMAND_OK:
            error = BackendError(result, "the statement could not be described")
            error.position = None  # it would point into the query headrace generated
            raise error
        described = conn.pgconn.describe_prepared(b"")
        return tuple(described.param_type(i) for i in range(described.nparams))


def assigning_sql(query_sql: str, assigned: Sequence[tuple[TableColumn, str]], with_clause: str = "") -> str:
    """`query_sql` with the columns `assigned` names assigned to their table columns through the temporary table:
    its rows numbered (hr_n), its columns, then the assigned values. `with_clause` (WITH ...) comes first, so the
    query's subqueries see it too."""
    if not assigned:
        return f"{with_clause} SELECT 0::bigint AS hr_n, hr_s.* FROM ({query_sql}) AS hr_s"
    picks = ", ".join(f"hr_q.{quote_ident(name)}" for _, name in assigned)
    values = ", ".join(f"hr_a.c{i}" for i in range(len(assigned)))
    return (f"{with_clause}{',' if with_clause else 'WITH'} "
            f"hr_q AS MATERIALIZED (SELECT row_number() OVER () AS hr_n, hr_s.* FROM ({query_sql}) AS hr_s), "
            f"hr_a AS (INSERT INTO {ASSIGN_TABLE} SELECT hr_q.hr_n, {picks} FROM hr_q RETURNING *) "
            f"SELECT hr_q.*, {values} FROM hr_q JOIN hr_a ON hr_a.hr_n = hr_q.hr_n ORDER BY hr_q.hr_n")


def run_assigning_query(store: PostgresServingStore, query_sql: str, params: Sequence[Any],
                        assigned: Sequence[tuple[TableColumn, str]], settings: Mapping[str, str],
                        with_clause: str = "") -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """Run assigning_sql(...): per result row (the query's row, the values assigned to the `assigned` columns as
    PostgreSQL assigns them)."""
    columns = [column for column, _ in assigned]
    with _write_transaction(store, columns if columns else None, settings) as conn:
        rows = _fetch(conn, assigning_sql(query_sql, assigned, with_clause), params)
    count = len(assigned)
    return [(row[1:len(row) - count], row[len(row) - count:]) for row in rows]


def _fetch(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    try:
        with psycopg.RawCursor(conn) as cursor:
            exact_time_loaders(cursor)
            # The extended protocol, where PostgreSQL parses exactly one statement: psycopg sends a query without
            # parameters as a simple Query, so one unused, typed parameter ($1, true) is added then.
            cursor.execute(sql, list(params) or [True])
            return cursor.fetchall() if cursor.description is not None else []
    except psycopg.Error as error:
        raise from_postgres(error) from None


def from_postgres(error: psycopg.Error) -> HeadraceError:
    """PostgreSQL's error as headrace reports it: its SQLSTATE, message, detail and hint (no position: it would
    point into the query headrace generated, not the client's statement)."""
    diag = error.diag
    sqlstate = diag.sqlstate
    if sqlstate is None:  # psycopg's own (a value Python cannot hold, e.g. a date beyond year 9999)
        return HeadraceError(str(error).splitlines()[0] if str(error) else type(error).__name__,
                             sqlstate="22008" if isinstance(error, psycopg.DataError) else "58000")
    status = 503 if sqlstate.startswith(("08", "53", "57P")) else 500 if sqlstate.startswith(("58", "XX")) else 400
    return HeadraceError(diag.message_primary or str(error), detail=diag.message_detail, hint=diag.message_hint,
                         sqlstate=sqlstate, http_status=status)


def storage_name(table: Table) -> str:
    return qualified_name((INTERNAL_SCHEMA, table.materialization))
