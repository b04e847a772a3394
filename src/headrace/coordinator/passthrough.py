"""Statements that are PostgreSQL's, not headrace's, run on the store PostgreSQL (issue 16).

headrace owns its DDL (sources, materialized views, sinks, indexes, secrets, connections, roles, grants), SUBSCRIBE,
the session statements (SET, BEGIN, PREPARE, DECLARE, COPY, ...), its tables and every query over its relations or
its catalog. Everything else a session sends (a SELECT without headrace relations, TEMP tables, plain views,
functions, EXPLAIN of those, any syntax headrace's parser does not know) is PostgreSQL's business: it runs on the
session's own backend connection to the store PostgreSQL (store/backend.py), as the session's role mirrored there
(never a PostgreSQL superuser), and its rows, types, notices and errors are PostgreSQL's, byte for byte.

The backend follows the session: a transaction block opened with BEGIN is opened on the backend when the backend
first serves a statement in it, and COMMIT / ROLLBACK / SAVEPOINT reach it; the session's settings that PostgreSQL
also has (DateStyle, TimeZone, extra_float_digits, statement_timeout, ...) are set on it before each statement
that changed them. A CancelRequest reaches PostgreSQL as PostgreSQL's own cancel (57014)."""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlglot import exp

from headrace.coordinator.responses import (Column, CommandComplete, CopyFrom, ExecuteResponse, SendingRows,
                                            StatementDescription)
from headrace.coordinator.row_streams import STREAM_CHUNK_ROWS, BackendRowStream
from headrace.coordinator.session import Portal, PreparedStatement, Session
from headrace.coordinator.temp_relations import TemporaryRelations, shadowed_names
from headrace.pgwire.copy_format import CopyOptions
from headrace.pgwire.types import TEXT as TEXT_OID
from headrace.pgwire.types import encode_value
from headrace.coordinator.variables import ALIASES, known_value
from headrace.sql.ast import (CopyStatement, DiscardStatement, ResetVariable, SavepointStatement, SetVariable,
                              ShowVariable)
from headrace.errors import HeadraceError
from headrace.store.postgres_roles import RoleMirrorError
from headrace.store.postgres_server import PostgresStore, StoreUnavailable
from headrace.cancel import when_set
from headrace.store.backend import BINARY_FORMAT, TEXT_FORMAT, BackendColumn, BackendConnection, BackendResult

RelationExists = Callable[[str, str], bool]

DESCRIPTIONS_KEPT = 256  # per session (BackendState.descriptions)
_DML_TAGS = ("INSERT", "UPDATE", "DELETE", "MERGE", "SELECT", "COPY", "FETCH", "MOVE")

# Schemas headrace answers for itself (its catalog emulation and its system relations), and unqualified relation
# names PostgreSQL would find in pg_catalog first.
_HEADRACE_SCHEMAS = frozenset({"pg_catalog", "information_schema", "headrace_internal", "mz_catalog",
                               "mz_internal"})
# What stays headrace's when its relations live in the store PostgreSQL (pg_catalog and information_schema are then
# PostgreSQL's own, describing the real relations).
_HEADRACE_ONLY_SCHEMAS = frozenset({"headrace_internal", "mz_catalog", "mz_internal"})
# Functions whose answer depends on headrace's catalog or session, not on PostgreSQL's.
_HEADRACE_FUNCTIONS = frozenset({
    "current_setting", "set_config", "version", "current_version", "current_database", "current_catalog", "pg_backend_pid", "pg_cancel_backend", "pg_terminate_backend",
    "obj_description", "col_description", "shobj_description", "current_schemas", "pg_relation_size",
    "pg_total_relation_size", "pg_table_size", "pg_indexes_size", "pg_postmaster_start_time",
})
_HEADRACE_FUNCTION_PATTERN = re.compile(r"^(has_\w+_privilege|pg_get_\w+|pg_\w+_is_visible|to_reg\w+)$")
# Statements headrace's parser refuses keep headrace's error when they begin with headrace's own words.
_HEADRACE_WORDS = re.compile(
    r"^\s*(create\s+(or\s+replace\s+)?(source|sink|secret|connection|materialized|default\s+index|cluster)"
    r"|(alter|drop)\s+(source|sink|secret|connection|materialized|cluster)|subscribe|show)\b",
    re.IGNORECASE)
_NOT_SYNCED = frozenset({"transaction_isolation", "default_transaction_isolation", "session_authorization",
                         "is_superuser", "server_version", "server_version_num", "server_encoding",
                         "client_encoding", "integer_datetimes", "database", "transaction_read_only"})


def mentions_headrace(ast: exp.Expr, relation_exists: RelationExists) -> bool:
    """Whether `ast` reads or names a relation, schema or function only headrace can answer for."""
    ctes = {cte.alias_or_name.lower() for cte in ast.find_all(exp.CTE)}
    for table in ast.find_all(exp.Table):
        name = table.name
        if not name:
            continue
        schema = table.db.lower() if table.db else ""
        if schema in _HEADRACE_SCHEMAS or (not schema and name.lower().startswith("pg_")):
            return True
        if not schema and name.lower() in ctes:
            continue
        if relation_exists(schema or "public", name):
            return True
    for function in ast.find_all(exp.Func):
        name = (function.name if isinstance(function, exp.Anonymous) else function.sql_name()).lower()
        if name in _HEADRACE_FUNCTIONS or _HEADRACE_FUNCTION_PATTERN.match(name):
            return True
    for cast in ast.find_all(exp.Cast):
        if cast.to.sql().lower().startswith("reg"):
            return True
    return False


def reads_headrace_only(ast: exp.Expr, mirrored: RelationExists | None = None) -> bool:
    """Whether `ast` reads a schema only headrace answers for even when the serving store is PostgreSQL (its
    system relations in headrace_internal, Materialize's mz_catalog / mz_internal); `mirrored`: the system
    relations the store also has (store/system_relations_postgres.py), which PostgreSQL may read."""
    return any(table.name and table.db and table.db.lower() in _HEADRACE_ONLY_SCHEMAS
               and not (mirrored is not None and mirrored(table.db, table.name)) for table in ast.find_all(exp.Table))


# Of _HEADRACE_FUNCTIONS, those that answer from headrace's session or process rather than from relations: they stay
# headrace's even when its relations live in the store PostgreSQL (the others, pg_get_viewdef, has_*_privilege,
# to_regclass, obj_description ..., are then PostgreSQL's, over the real relations).
_SESSION_FUNCTIONS = frozenset({"current_setting", "set_config", "version", "current_version", "current_database",
                                "current_catalog", "pg_backend_pid", "pg_cancel_backend", "pg_terminate_backend",
                                "pg_postmaster_start_time"})


# With the PostgreSQL serving store the session's database is the store's (the database its relations are in, as
# pg_database and every catalog query say), whatever name the client connected with.
_DATABASE_FUNCTIONS = frozenset({"current_database", "current_catalog"})


def calls_session_function(ast: exp.Expr, *, database_is_the_stores: bool = False) -> bool:
    """Whether `ast` calls a function whose answer is headrace's session's or process's (_SESSION_FUNCTIONS)."""
    functions = _SESSION_FUNCTIONS - _DATABASE_FUNCTIONS if database_is_the_stores else _SESSION_FUNCTIONS
    for function in ast.find_all(exp.Func):
        name = (function.name if isinstance(function, exp.Anonymous) else function.sql_name()).lower()
        if name in functions:
            return True
    return False


def reads_catalog(ast: exp.Expr) -> bool:
    """Whether `ast` reads pg_catalog or information_schema (qualified, or an unqualified pg_* relation)."""
    ctes = {cte.alias_or_name.lower() for cte in ast.find_all(exp.CTE)}
    for table in ast.find_all(exp.Table):
        schema = table.db.lower() if table.db else ""
        if schema in ("pg_catalog", "information_schema"):
            return True
        if not schema and table.name.lower().startswith("pg_") and table.name.lower() not in ctes:
            return True
    return False


def unknown_relations(ast: exp.Expr, relation_exists: RelationExists) -> list[str]:
    """The relations `ast` names that are neither headrace's, nor its catalog's, nor the statement's own CTEs."""
    ctes = {cte.alias_or_name.lower() for cte in ast.find_all(exp.CTE)}
    unknown = []
    for table in ast.find_all(exp.Table):
        name, schema = table.name, table.db.lower() if table.db else ""
        if not name or schema in _HEADRACE_SCHEMAS or (not schema and name.lower() in ctes):
            continue
        if not schema and name.lower().startswith("pg_"):
            continue  # pg_catalog's, which headrace answers
        if not relation_exists(schema or "public", name):
            unknown.append(f"{schema}.{name}" if schema else name)
    return unknown


def is_temporary_table(ast: exp.Expr) -> bool:
    properties = ast.args.get("properties")
    return properties is not None and any(isinstance(p, exp.TemporaryProperty) for p in properties.expressions)


def store_setting(session: Session, ast: exp.Expr) -> bool:
    """SET / RESET / SHOW of a parameter headrace does not keep but PostgreSQL has (enable_seqscan, work_mem, ...):
    the store's, so PostgreSQL accepts, refuses (42704) or shows it."""
    if not isinstance(ast, (SetVariable, ResetVariable, ShowVariable)):
        return False
    name = str(ast.this).lower().replace(" . ", ".")
    return name != "all" and name not in ALIASES and known_value(session, name) is None and "." not in name


def takes_unparsed(sql: str) -> bool:
    """Text headrace's parser refused: PostgreSQL's to accept or refuse, unless it is meant as headrace's."""
    return _HEADRACE_WORDS.match(sql) is None


class StoreRoutes:
    """Which statement shapes went to the store PostgreSQL, so the next statement of the same shape skips headrace's
    parser (about 0.5 ms of a statement's cost). A shape is the text with its literals and numbers blanked out: the
    decision depends only on the statement's words and names, never on its literal values. Keyed by the plan cache's
    fingerprint, which every catalog change moves. Text whose literals a regular expression cannot delimit safely
    (backslashes, dollar quotes, comments) is never remembered."""

    # a quoted identifier (kept: it is a name), a string literal, a number
    _TOKENS = re.compile(r"(\"(?:[^\"]|\"\")*\")|'(?:[^']|'')*'|\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", re.IGNORECASE)
    _UNSAFE = ("\\", "$$", "--", "/*")

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        # shape -> headrace's relations it reads (the PostgreSQL serving store), checked at each execute
        self._shapes: dict[tuple[Any, str], tuple[tuple[str | None, str], ...]] = {}

    def is_postgres(self, fingerprint: Any, sql: str) -> bool:
        return self.store_reads(fingerprint, sql) is not None

    def store_reads(self, fingerprint: Any, sql: str) -> tuple[tuple[str | None, str], ...] | None:
        """None: not a shape known to be PostgreSQL's; else the headrace relations its statements read (maybe none)."""
        shape = self._shape(sql)
        return None if shape is None else self._shapes.get((fingerprint, shape))

    def remember(self, fingerprint: Any, sql: str, reads: tuple[tuple[str | None, str], ...] = ()) -> None:
        shape = self._shape(sql)
        if shape is None:
            return
        if len(self._shapes) >= self._capacity:
            self._shapes.clear()  # a client inventing shapes forever only empties it now and then
        self._shapes[(fingerprint, shape)] = reads

    def _shape(self, sql: str) -> str | None:
        if any(marker in sql for marker in self._UNSAFE) or len(sql) > 4096:
            return None
        return self._TOKENS.sub(lambda token: token.group(1) or "?", sql)


@dataclass(slots=True)
class BackendState:
    """A session's backend: the connection, the settings it was given, the savepoints it knows."""

    connection: BackendConnection
    settable: frozenset[str]
    connection_id: int
    synced: dict[str, str] = field(default_factory=dict)
    savepoints: list[str] = field(default_factory=list)
    # Parse's descriptions by (SQL, declared parameter types): a client re-sending the same unnamed statement (the
    # extended protocol, statement after statement) costs one round trip, not two. Dropped when the backend ran
    # anything that may change them (a setting, DDL); a result whose columns differ from its description (DDL of
    # another session) is PostgreSQL's "cached plan must not change result type" (0A000), and is described anew.
    descriptions: OrderedDict[tuple[str, tuple[int, ...]], StatementDescription] = field(default_factory=OrderedDict)
    # its temporary relations, which shadow headrace's of the same name (coordinator/temp_relations.py)
    temporary: TemporaryRelations = field(default_factory=TemporaryRelations)

    def remember_description(self, key: tuple[str, tuple[int, ...]], description: StatementDescription) -> None:
        self.descriptions[key] = description
        if len(self.descriptions) > DESCRIPTIONS_KEPT:
            self.descriptions.popitem(last=False)


class Passthrough:
    """Runs PostgreSQL's statements on each session's backend (see the module docstring)."""

    def __init__(self, store: PostgresStore, is_superuser: Callable[[str], bool]) -> None:
        self.store = store
        self._is_superuser = is_superuser
        # What still blocks (a connection's start, mirroring a role, sending a cancel) runs here, never on the
        # coordinator's shared executor; statements themselves are waited on by the event loop (store/backend.py).
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="store-backend")
        self._backends: dict[int, BackendState] = {}
        self.routes = StoreRoutes()

    def backend_pid(self, connection_id: int) -> int | None:
        """The pid of a session's backend in the store PostgreSQL, if it has one (headrace_internal.sessions)."""
        backend = self._backends.get(connection_id)
        return None if backend is None or backend.connection.closed else backend.connection.backend_pid

    def backend_count(self) -> int:
        """Sessions' backend connections open now (headrace_store_session_backends)."""
        return len(self._backends)

    # ---- prepare / execute ------------------------------------------------------------------
    async def prepare(self, session: Session, sql: str, param_types: Sequence[int], ast: exp.Expr | None,
                      *, describe: bool = True) -> PreparedStatement:
        """A statement for the backend; `describe`: ask PostgreSQL for its parameter and result types now (the
        extended protocol's Parse; the simple protocol learns the columns from the rows)."""
        if not describe:
            return PreparedStatement(sql, ast, StatementDescription(tuple(param_types), None, raw_parameters=True),
                                     backend=True)
        backend = await self._backend(session)
        await self._sync(session, backend)
        key = (sql, tuple(param_types))
        known = backend.descriptions.get(key)
        if known is not None:
            backend.descriptions.move_to_end(key)
            return PreparedStatement(sql, ast, known, backend=True)
        description = await backend.connection.describe(sql, param_types)
        columns = None if description.columns is None else tuple(_column(c) for c in description.columns)
        known = StatementDescription(description.param_types, columns, raw_parameters=True)
        backend.remember_description(key, known)
        return PreparedStatement(sql, ast, known, backend=True)

    async def execute(self, session: Session, portal: Portal, cancel: asyncio.Event, *,
                      stream: bool = False) -> ExecuteResponse:
        """`stream`: a large result is read in pieces (portal.row_stream, coordinator/row_streams.py)."""
        backend = await self._backend(session)
        await self._sync(session, backend)
        if session.in_block and not backend.connection.in_transaction:
            await backend.connection.run("BEGIN")
        statement = portal.statement
        if isinstance(statement.ast, CopyStatement):  # COPY <a relation of the store's> FROM STDIN
            format_code, column_count = await backend.connection.start_copy_in(statement.sql)
            portal.finished = True
            table = statement.ast.args.get("table") or (None, "")
            return CopyFrom((table[0] or "public", table[1]), tuple(Column(f"column{i + 1}", TEXT_OID)
                                                                   for i in range(column_count)),
                            CopyOptions(format="binary" if format_code == BINARY_FORMAT else "text"), relay=True)
        pairs = [_wire_parameter(value, oid) for value, oid
                 in zip(portal.params, statement_param_types(portal.statement), strict=True)]
        params = [data for _, data in pairs]
        formats = [format_code for format_code, _ in pairs]
        result_format = BINARY_FORMAT if portal.binary or (
            portal.result_formats and all(code == BINARY_FORMAT for code in portal.result_formats)) else TEXT_FORMAT
        statement = portal.statement
        result: BackendResult = await self._cancellable(backend, cancel, backend.connection.execute(
            statement.sql, params, statement.description.param_types if params else (), formats, result_format,
            chunk_rows=STREAM_CHUNK_ROWS if stream else 0))
        notices = (*result.notices, *([statement.notice] if statement.notice else []))
        backend.temporary.note(statement.sql, result.columns is None and not result.tag.startswith(_DML_TAGS))
        _check_description(backend, statement, result)
        if result.columns is None:
            portal.finished = True
            return CommandComplete(result.tag, notices=notices)
        columns = tuple(_column(c, raw_format=result.result_format) for c in result.columns)
        portal.columns, portal.pending_rows = columns, result.rows
        if result.more:  # the rest comes in pieces; the tag with the last one
            portal.row_stream = BackendRowStream(
                backend.connection, "SELECT", lambda cancel, work: self._cancellable(backend, cancel, work),
                lambda: self._abandon(backend))
            return SendingRows(columns, [])
        if result.tag[-1:].isdigit():  # "SELECT 3", "INSERT 0 3": the count follows the rows paged out
            return SendingRows(columns, [], result.tag.rsplit(" ", 1)[0])  # the coordinator pages (max_rows)
        return SendingRows(columns, [], tag=result.tag)

    async def relay_copy(self, session: Session, data: bytes | None, failure: str | None) -> CommandComplete:
        """The client's data for the COPY FROM STDIN `execute` started (None and `failure`: its CopyFail)."""
        backend = await self._backend(session, settle=False)
        result = await backend.connection.finish_copy_in(data, failure)
        return CommandComplete(result.tag, notices=tuple(result.notices))

    async def refuse_mixed(self, session: Session, ast: exp.Expr, relation_exists: RelationExists) -> None:
        """A statement headrace runs (it reads headrace's relations) that also names relations only the store
        PostgreSQL has cannot run yet: 0A000 saying so, rather than headrace's 42P01 for a relation that exists."""
        unknown = unknown_relations(ast, relation_exists)
        if not unknown:
            return
        backend = await self._backend(session)
        literal = "ARRAY[" + ", ".join(_literal(name) for name in unknown) + "]::text[]"
        found = await backend.connection.execute(f"SELECT n FROM unnest({literal}) AS n WHERE to_regclass(n) IS NOT NULL")
        kept = [row[0].decode() for row in found.rows if row[0] is not None]
        if kept:
            raise HeadraceError(
                f'relation "{kept[0]}" is kept by the store PostgreSQL only and cannot be used together with '
                "headrace's sources, tables and views yet", sqlstate="0A000",
                hint="query it on its own, or create the table so that headrace keeps it (docs/store.md)")

    def may_shadow(self, session: Session) -> bool:
        """Whether the session's backend may hold temporary relations, which could shadow headrace's: its statements
        are then routed afresh, never by a shape remembered without them (plan cache, fast path, StoreRoutes)."""
        backend = self._backends.get(session.connection_id)
        return backend is not None and backend.temporary.possible and backend.temporary.names != frozenset()

    async def temporary_names(self, session: Session, ast: exp.Expr) -> frozenset[str]:
        """The names `ast` uses that are the session's temporary relations on its backend (which PostgreSQL
        resolves before headrace's relations of the same name); empty without a backend."""
        backend = self._backends.get(session.connection_id)
        if backend is None or backend.connection.closed or backend.connection.copying_in \
                or not backend.temporary.possible:
            return frozenset()
        return shadowed_names(ast, await backend.temporary.current(backend.connection))

    # ---- the session's transaction and settings ----------------------------------------------
    async def after_session_statement(self, session: Session, ast: exp.Expr) -> None:
        """BEGIN ... COMMIT / ROLLBACK / SAVEPOINT as headrace ran them: the backend follows when it is open."""
        backend = self._backends.get(session.connection_id)
        if backend is None:
            return
        backend.temporary.note("", changed_relations=True)  # COMMIT / ROLLBACK / DISCARD may drop temporary tables
        connection = backend.connection
        if isinstance(ast, DiscardStatement) and str(ast.this).lower() == "all" and not connection.in_transaction:
            await connection.run("DISCARD ALL")  # temporary tables, prepared plans, settings go
            backend.synced.clear()
            return
        if not connection.in_transaction:
            if isinstance(ast, (exp.Commit, exp.Rollback)):
                backend.savepoints.clear()
            return
        if isinstance(ast, (exp.Commit, exp.Rollback)) and not session.in_block:
            await connection.run("COMMIT" if isinstance(ast, exp.Commit) else "ROLLBACK")
            backend.savepoints.clear()
            backend.synced.clear()  # a rolled back (or failed) block took its settings back: set them again
        elif isinstance(ast, SavepointStatement):
            name = str(ast.this)
            action = ast.args["action"]
            quoted = '"' + name.replace('"', '""') + '"'
            if action == "savepoint":
                await connection.run(f"SAVEPOINT {quoted}")
                backend.savepoints.append(name)
            elif name in backend.savepoints:
                verb = "ROLLBACK TO SAVEPOINT" if action == "rollback_to" else "RELEASE SAVEPOINT"
                backend.synced.clear()
                await connection.run(f"{verb} {quoted}")
                index = backend.savepoints.index(name)
                del backend.savepoints[index + (1 if action == "rollback_to" else 0):]

    def _abandon(self, backend: BackendState) -> None:
        """A backend left mid-result (its client went away while rows streamed): cancelled and closed; the
        session's next statement gets a new one."""
        if self._backends.get(backend.connection_id) is backend:
            del self._backends[backend.connection_id]
        _close_soon(backend.connection, self._executor)

    def close(self, session: Session) -> None:
        backend = self._backends.pop(session.connection_id, None)
        if backend is not None:
            _close_soon(backend.connection, self._executor)

    def shutdown(self) -> None:
        for backend in self._backends.values():
            _close_soon(backend.connection, self._executor)
        self._backends.clear()
        self._executor.shutdown(wait=True, cancel_futures=False)

    # ---- helpers --------------------------------------------------------------------------------
    async def _backend(self, session: Session, *, settle: bool = True) -> BackendState:
        """The session's backend, opened at its first use. `settle`: a relayed COPY FROM STDIN its client left
        (an error or a disconnect mid-COPY) is ended first, as PostgreSQL ends it."""
        backend = self._backends.get(session.connection_id)
        if backend is not None and not backend.connection.closed:
            if settle and backend.connection.copying_in:
                try:
                    await backend.connection.finish_copy_in(None, "COPY from stdin ended by the client")
                except HeadraceError:
                    pass  # PostgreSQL's 57014 for that COPY: already reported to the client by headrace
            return backend
        role = session.user
        await self._run(self._ensure_role, role, False)
        try:
            connection = await BackendConnection.open(self.store.conninfo_for(role))
        except HeadraceError:  # the mirrored role went away behind this process's back: mirror it again, once
            await self._run(self._ensure_role, role, True)
            connection = await BackendConnection.open(self.store.conninfo_for(role))
        settable = await _settable_names(connection)
        backend = self._backends[session.connection_id] = BackendState(connection, settable, session.connection_id)
        return backend

    def _ensure_role(self, role: str, recheck: bool) -> None:
        """The session's role mirrored in the store (never a PostgreSQL superuser: store/postgres_roles.py)."""
        try:
            self.store.ensure_role(role, superuser=self._is_superuser(role), recheck=recheck)
        except StoreUnavailable as exc:
            raise HeadraceError(str(exc), sqlstate="57P03", http_status=503) from None
        except RoleMirrorError as exc:
            raise HeadraceError(str(exc), sqlstate=exc.sqlstate, http_status=403) from None
        except psycopg.Error as exc:
            raise HeadraceError(f"the store PostgreSQL refused role {role!r}: {exc}",
                                sqlstate=exc.sqlstate or "08006", http_status=503) from None

    async def _sync(self, session: Session, backend: BackendState) -> None:
        changed = {name: value for name, value in session.variables.items()
                   if name in backend.settable and name not in _NOT_SYNCED and backend.synced.get(name) != value}
        if not changed:
            return
        assignments = ", ".join(f"set_config({_literal(name)}, {_literal(value)}, false)"
                                for name, value in changed.items())
        await backend.connection.run(f"SELECT {assignments}")
        backend.synced.update(changed)
        backend.descriptions.clear()  # search_path, DateStyle ...: names and types may resolve otherwise now

    async def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def _cancellable(self, backend: BackendState, cancel: asyncio.Event, work: Awaitable[Any]) -> Any:
        loop = asyncio.get_running_loop()
        # PostgreSQL ends the statement with its own 57014, which `work` then raises
        stop_watching = when_set(cancel, lambda: loop.run_in_executor(self._executor, backend.connection.cancel))
        try:
            return await work
        except asyncio.CancelledError:  # the client went away: the statement must not run on, nor the backend stay
            self._backends.pop(backend.connection_id, None)
            self._executor.submit(_cancel_and_close, backend.connection)
            raise
        finally:
            stop_watching()


def _close_soon(connection: BackendConnection, executor: ThreadPoolExecutor) -> None:
    """Close at once when idle; a statement still running is cancelled first, on a thread (cancel blocks)."""
    if connection.busy:
        executor.submit(_cancel_and_close, connection)
    else:
        connection.close()


def _cancel_and_close(connection: BackendConnection) -> None:
    connection.cancel()
    connection.close()


def statement_param_types(statement: PreparedStatement) -> tuple[int, ...]:
    return statement.description.param_types


def _wire_parameter(value: Any, type_oid: int) -> tuple[int, bytes | None]:
    """A bound parameter as (format code, bytes): as the client sent it, or (EXECUTE of a PREPAREd statement, whose
    arguments headrace evaluated) a Python value in PostgreSQL's text form."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], int):
        return value
    return TEXT_FORMAT, encode_value(type_oid, TEXT_FORMAT, value)


async def _settable_names(connection: BackendConnection) -> frozenset[str]:
    result = await connection.execute("SELECT name FROM pg_settings WHERE context = 'user'")
    return frozenset(row[0].decode().lower() for row in result.rows if row[0] is not None)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _check_description(backend: BackendState, statement: PreparedStatement, result: BackendResult) -> None:
    """Forget the session's descriptions after DDL (or any command but DML); refuse a result whose columns are not
    the ones its Parse described (the client may hold the RowDescription already), as PostgreSQL refuses a cached
    plan whose result type changed."""
    if result.columns is None:
        if not result.tag.startswith(_DML_TAGS):
            backend.descriptions.clear()
        return
    described = statement.description.columns
    if described is None:
        return
    if [(c.name, c.type_oid) for c in described] != [(c.name, c.type_oid) for c in result.columns]:
        backend.descriptions.clear()
        raise HeadraceError("cached plan must not change result type", sqlstate="0A000")


def _column(column: BackendColumn, raw_format: int = -1) -> Column:
    return Column(column.name, column.type_oid, column.type_size, column.type_modifier, raw_format)


__all__ = ["Passthrough", "StoreRoutes", "is_temporary_table", "mentions_headrace", "store_setting", "takes_unparsed",
           "unknown_relations"]
