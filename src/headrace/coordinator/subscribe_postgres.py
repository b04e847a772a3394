"""SUBSCRIBE's reads on the PostgreSQL serving store (store/postgres_serving.py): column types from PostgreSQL's own
description, values as PostgreSQL prints them, PostgreSQL's errors with their own fields.

Values: a SUBSCRIBE's rows are Python values that pgwire, HTTP and COPY encode through headrace's type codecs
(pgwire/types), which print them back as PostgreSQL printed them (numeric scale, float digits, jsonb's normal form,
timestamptz). The serving store's own types are psycopg's values (the ones the codecs would decode); any other type
headrace has a codec for (arrays, interval, time, ...) is read as PostgreSQL's text and decoded by that codec; a type
it has none for stays PostgreSQL's text (pgwire sends unknown types as text). A value the codecs cannot hold exactly
(an infinite timestamp, an interval with months) is refused (0A000), never sent altered.

Privileges: the store's connections are its admin's (a superuser when embedded), so SUBSCRIBE's reads run on
connections of their own that log in as `headrace_subscribe_reader` (`reading`, with `search_path` pg_catalog only): a
role that is never a superuser and may only SELECT the serving relations SUBSCRIBE and indexes read (granted as each
is first described: `allow_reading`) and the commit bookkeeping (checkpoints, changelog frontiers). Not `SET ROLE` on
an admin connection: a session whose authenticated user is a superuser can take that back
(`set_config('session_authorization', ...)`). Its password is made at each start, kept in memory only and sent as a
SCRAM verifier. So `pg_read_file`, `COPY ... PROGRAM` through a user's
function, `pg_terminate_backend` of others and the like get PostgreSQL's 42501, and a function or operator a user
created is not found unless schema-qualified, which `check_functions` refuses, as it refuses the built-ins that run a
query given as text (`query_to_xml`, `ts_stat`, ...), which could read other relations the role may read, and
session-level advisory locks (the pooled connection would keep them).

The subscriber's own `SUBSCRIBE (SELECT ... FROM object [WHERE ...])` runs as its text was written
(`subscriber_select`): its projections and WHERE are spliced verbatim around the object's rows, not regenerated from
sqlglot's tree, whose round trip can change a statement (`interval '3 days 04:05:06'` came back as `INTERVAL '3
DAYS'`)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.string import TextLoader
from sqlglot import exp
from sqlglot.tokens import TokenType

from headrace.coordinator.responses import Column
from headrace.errors import FeatureNotSupported, HeadraceError
from headrace.pgwire import types as pg
from headrace.sql.parser import Headrace
from headrace.store.backend import BackendError
from headrace.store.postgres_roles import MIRROR_LOCK_KEY as ROLES_LOCK_KEY  # GRANTs on one object serialize
from headrace.store.postgres_roles import SUBSCRIBE_READER_ROLE, login_conninfo
from headrace.catalog.roles import make_scram_verifier
from headrace.store.postgres_serving import ConnectionPool, PostgresServingStore
from headrace.store.serving import CHECKPOINTS_TABLE, FRONTIERS_TABLE, quote_ident

Row = tuple[Any, ...]
Decoder = Callable[[Any], Any]

# psycopg's value (its C loaders: about 3x faster than decoding text in Python) is the one the codec would decode,
# so it prints back the same: int, bool, str (json/jsonb: the store's pool loads them as text), Decimal with its
# scale, float, date, datetime (timestamptz aware, from the offset PostgreSQL printed), UUID, bytes.
_PSYCOPG_VALUES = frozenset({pg.INT2, pg.INT4, pg.INT8, pg.BOOL, pg.TEXT, pg.VARCHAR, pg.BPCHAR, pg.NAME, pg.JSON,
                             pg.JSONB, pg.NUMERIC, pg.FLOAT4, pg.FLOAT8, pg.DATE, pg.TIMESTAMP, pg.TIMESTAMPTZ,
                             pg.UUID, pg.BYTEA})
_INTERVALS = frozenset({pg.INTERVAL, pg.pg_type(pg.INTERVAL).array_oid})
READER_ROLE = SUBSCRIBE_READER_ROLE
READER_MARK = "headrace: SUBSCRIBE reader"
_AS_READER = "SET LOCAL search_path = pg_catalog"  # the reader's connections log in as READER_ROLE (`reading`)
INPUT = "__hr_input"  # the CTE of changelog rows a target's SELECT reads (coordinator/subscribe.py)
# Built-ins refused in a subscriber's SELECT: those that run a query (or read a relation) named in their arguments
# would read past the FROM item; a session-level advisory lock would outlive the read on the pooled connection.
_READS_BY_NAME = "it reads relations other than the one subscribed to"
_OUTLIVES_THE_READ = "its lock would outlive the read"
REFUSED_FUNCTIONS = {
    **{f"{prefix}_to_{suffix}": _READS_BY_NAME for prefix in ("query", "cursor", "table", "schema", "database")
       for suffix in ("xml", "xmlschema", "xml_and_xmlschema")},
    "ts_stat": _READS_BY_NAME, "ts_rewrite": _READS_BY_NAME,
    **{name: _OUTLIVES_THE_READ for name in ("pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock",
                                             "pg_try_advisory_lock_shared")}}
_reader_pools: dict[str, ConnectionPool] = {}  # store conninfo -> READER_ROLE's connections, in this process
_readers_lock = threading.Lock()
_OPENING = frozenset({TokenType.L_PAREN, TokenType.L_BRACKET})
_CLOSING = frozenset({TokenType.R_PAREN, TokenType.R_BRACKET})
_NAME_PARTS = frozenset({TokenType.DOT, TokenType.VAR, TokenType.IDENTIFIER})  # `x.`, `"X".`, `schema.x.`


def subscriber_select(query_sql: str, alias: str, input_select: str, data_columns: Sequence[str]) -> str | None:
    """`SELECT <alias>.hr_timestamp, <alias>.hr_diff, <the subscriber's projections> FROM (<input_select>) AS
    <alias> [WHERE <the subscriber's condition>]`, the projections and condition as the subscriber wrote them (a
    `*` or `x.*` becomes the object's data columns: hr_timestamp and hr_diff stay out of it). None if the text
    is not the one SELECT ... FROM ... [WHERE ...] shape (the caller checked the tree for refused clauses)."""
    try:
        tokens = Headrace().tokenize(query_sql)
    except Exception:  # noqa: BLE001 - sqlglot's tokenizer errors: the caller falls back to the tree
        return None
    if not tokens or tokens[0].token_type != TokenType.SELECT:
        return None
    depth = 0
    commas: list[int] = []
    from_at = where_at = None
    for i, token in enumerate(tokens):
        if token.token_type in _OPENING:
            depth += 1
        elif token.token_type in _CLOSING:
            depth -= 1
        elif depth == 0 and from_at is None and token.token_type == TokenType.COMMA:
            commas.append(i)
        elif depth == 0 and from_at is None and token.token_type == TokenType.FROM:
            from_at = i
        elif depth == 0 and from_at is not None and token.token_type == TokenType.WHERE:
            where_at = i
            break
    if from_at is None or from_at == 1:
        return None
    quoted = quote_ident(alias)
    items = [f"{quoted}.hr_timestamp", f"{quoted}.hr_diff"]
    bounds = [0, *commas, from_at]
    for first, last in zip(bounds, bounds[1:], strict=False):
        item = tokens[first + 1:last]
        if not item:
            return None
        kinds = [token.token_type for token in item]
        qualifier = kinds[:-1]
        if kinds[-1] == TokenType.STAR and (not qualifier or qualifier[-1] == TokenType.DOT) \
                and all(kind in _NAME_PARTS for kind in qualifier):
            items += [f"{quoted}.{quote_ident(column)}" for column in data_columns]
        else:
            items.append(query_sql[item[0].start:item[-1].end + 1])
    where = f" WHERE {query_sql[tokens[where_at].end + 1:].strip()}\n" if where_at is not None else ""
    return f"SELECT {', '.join(items)} FROM ({input_select}) AS {quoted}{where}"


def check_functions(query: exp.Expr) -> None:
    """Refuse what would let the subscriber's SELECT reach past its FROM item or its read on PostgreSQL: a function
    named with a schema other than pg_catalog (the reader's search_path finds only PostgreSQL's own), and
    REFUSED_FUNCTIONS."""
    for node in query.walk():
        if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func) \
                and node.this.name.lower() != "pg_catalog":
            raise FeatureNotSupported("SUBSCRIBE (SELECT ...) may call PostgreSQL's built-in functions only, not "
                                      f"{node.sql(dialect='postgres')}")
        if isinstance(node, exp.Func):
            name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
            reason = REFUSED_FUNCTIONS.get(name.lower())
            if reason is not None:
                raise FeatureNotSupported(f"SUBSCRIBE (SELECT ...) cannot call {name.lower()}: {reason}")


@contextmanager
def reading(store: PostgresServingStore) -> Iterator[psycopg.Connection[Any]]:
    """A connection logged in as READER_ROLE in a REPEATABLE READ, READ ONLY transaction (rolled back after)."""
    with _reader_pool(store).connection() as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield conn


def _reader_pool(store: PostgresServingStore) -> ConnectionPool:
    with _readers_lock:
        pool = _reader_pools.get(store.conninfo)
        if pool is not None:
            return pool
        password = secrets.token_urlsafe(32)
        with store.pool.connection() as conn:
            _set_up_reader(conn, password)
            conn.commit()
        pool = ConnectionPool(login_conninfo(store.conninfo, READER_ROLE, password))
        _reader_pools[store.conninfo] = pool
        return pool


def close_reader_pool(store: PostgresServingStore) -> None:
    with _readers_lock:
        pool = _reader_pools.pop(store.conninfo, None)
    if pool is not None:
        pool.close()


def allow_reading(store: PostgresServingStore, relations: Sequence[str]) -> None:
    """Let READER_ROLE SELECT these relations (qualified names) of the store: the role is set up once per process
    and store, then each relation it cannot read yet is granted (a table dropped and created again loses it)."""
    _reader_pool(store)
    with store.pool.connection() as conn:
        try:
            checks = ", ".join(["has_table_privilege(%s, %s, 'SELECT')"] * len(relations))
            allowed = conn.execute(f"SELECT {checks}", [v for r in relations for v in (READER_ROLE, r)]).fetchone()
            missing = [relation for relation, ok in zip(relations, allowed or (), strict=True) if not ok]
            if missing:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [ROLES_LOCK_KEY])
                conn.execute(f"GRANT SELECT ON {', '.join(missing)} TO {READER_ROLE}")
                conn.commit()
        except psycopg.Error as error:  # e.g. 42P01: the relation's table is gone
            raise postgres_error(error) from None


def _set_up_reader(conn: psycopg.Connection[Any], password: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s)", [ROLES_LOCK_KEY])
    found = conn.execute("SELECT shobj_description(oid, 'pg_authid'), rolsuper OR rolcreatedb OR rolcreaterole OR "
                         "rolreplication OR rolbypassrls FROM pg_roles WHERE rolname = %s", [READER_ROLE]).fetchone()
    if found is None:
        conn.execute(f"CREATE ROLE {READER_ROLE} NOINHERIT")
        conn.execute(f"COMMENT ON ROLE {READER_ROLE} IS '{READER_MARK}'")
    elif found[0] != READER_MARK:
        raise HeadraceError(f'role "{READER_ROLE}" exists in the store PostgreSQL and is not headrace\'s',
                            sqlstate="42710", hint="SUBSCRIBE reads as this role: drop or rename the other one")
    elif found[1]:  # never more than a reader, whatever was done to it meanwhile (only a superuser admin may say
        # NOSUPERUSER, so only when needed: a CREATEROLE admin could not have made it one)
        conn.execute(f"ALTER ROLE {READER_ROLE} NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS")
    # a new password for this process's connections
    conn.execute(sql.SQL(f"ALTER ROLE {READER_ROLE} LOGIN PASSWORD {{}}").format(
        sql.Literal(make_scram_verifier(password).text())))
    database = conn.execute("SELECT current_database()").fetchone()
    assert database is not None
    conn.execute(f"GRANT CONNECT ON DATABASE {quote_ident(str(database[0]))} TO {READER_ROLE}")
    conn.execute(f"GRANT USAGE ON SCHEMA headrace_internal, public TO {READER_ROLE}")
    conn.execute(f"GRANT SELECT ON {CHECKPOINTS_TABLE}, {FRONTIERS_TABLE} TO {READER_ROLE}")  # the read's frontiers


def postgres_error(error: psycopg.Error) -> HeadraceError:
    """PostgreSQL's error as the passthrough reports it (SQLSTATE, message, detail, hint), without its position:
    that points into the SQL headrace composed around the subscriber's SELECT, not into what the client sent."""
    reported = BackendError(error.pgresult, str(error).strip() or type(error).__name__)
    reported.position = None
    return reported


# The statements that hold the subscriber's text (describe_columns, fetch_rows) carry a parameter ($1, true): psycopg
# then sends them with the extended protocol, in which PostgreSQL parses exactly one statement. Were sqlglot to lex
# the text differently from PostgreSQL (quoting, comments), a second statement hidden in it (`...; COMMIT; ...`,
# which would end the read's transaction and its settings) is PostgreSQL's 42601 instead of run. RawCursor: `%` in the text is
# not psycopg's placeholder syntax.

def describe_columns(conn: psycopg.Connection[Any], changelog: str, select_sql: str) -> tuple[Column, ...]:
    """Every output column of `select_sql` over no rows of `changelog` (as READER_ROLE, to the end of the caller's
    transaction) with PostgreSQL's type oid, size and modifier, as PostgreSQL's RowDescription gives them."""
    sql = f"WITH {INPUT} AS (SELECT * FROM {changelog} LIMIT 0) SELECT * FROM ({select_sql}) AS __hr_output WHERE $1"
    try:
        with psycopg.RawCursor(conn) as cursor:
            cursor.execute(_AS_READER)
            cursor.execute(sql, [True])
            result = cursor.pgresult
            assert result is not None
            return tuple(Column((result.fname(i) or b"?column?").decode(), result.ftype(i), result.fsize(i),
                                result.fmod(i)) for i in range(result.nfields))
    except psycopg.Error as error:
        raise postgres_error(error) from None


def fetch_rows(conn: psycopg.Connection[Any], input_sql: str, select_sql: str, columns: Sequence[Column],
               skip: int) -> list[Row]:
    """The rows of `select_sql` over `input_sql`'s, by hr_timestamp and hr_diff (as READER_ROLE, to the end of the
    caller's transaction); their first `skip` columns are plain integers (hr_timestamp, hr_diff), the others
    `columns`, each value decoded as the module docstring says."""
    sql = f"WITH {INPUT} AS ({input_sql}) SELECT * FROM ({select_sql}) AS __hr_output WHERE $1 ORDER BY 1, 2"
    decoders = [_decoder(column) for column in columns]
    try:
        with psycopg.RawCursor(conn) as cursor:
            cursor.execute(_AS_READER)
            for column in columns:
                if column.type_oid not in _PSYCOPG_VALUES:
                    cursor.adapters.register_loader(column.type_oid, TextLoader)
            rows = cursor.execute(sql, [True]).fetchall()
    except psycopg.Error as error:
        if error.sqlstate is None and isinstance(error, psycopg.DataError):  # psycopg's loader, not PostgreSQL
            raise FeatureNotSupported(f"SUBSCRIBE cannot send a value PostgreSQL printed: {error}",
                                      hint="cast it to text in the SUBSCRIBE's SELECT") from None
        raise postgres_error(error) from None
    if all(decoder is None for decoder in decoders):
        return rows
    return [(*row[:skip], *(value if decoder is None or value is None else decoder(value)
                            for value, decoder in zip(row[skip:], decoders, strict=True))) for row in rows]


def _decoder(column: Column) -> Decoder | None:
    """None: psycopg's value is the one to send."""
    if column.type_oid in _PSYCOPG_VALUES or column.type_oid not in pg.TYPES:
        return None
    known = pg.TYPES[column.type_oid]
    decode_text, encode_text = known.codec.decode_text, known.codec.encode_text
    # headrace's interval value is a timedelta: no months, and days and time share one sign ('-3 days +04:00:00'
    # would come back as '-2 days -20:00:00'), so an interval goes only if it prints back as PostgreSQL printed it
    exact_only = column.type_oid in _INTERVALS

    def decode(text: str) -> Any:
        try:
            value = decode_text(text)
        except (ValueError, ArithmeticError, IndexError) as error:  # infinity, BC dates, ...
            raise _cannot_send(known.name, text) from error
        if exact_only and encode_text(value) != text.encode():
            raise _cannot_send(known.name, text)
        return value

    return decode


def _cannot_send(type_name: str, text: str) -> FeatureNotSupported:
    return FeatureNotSupported(f'SUBSCRIBE cannot send the {type_name} value "{text}"',
                               hint="cast it to text in the SUBSCRIBE's SELECT")
