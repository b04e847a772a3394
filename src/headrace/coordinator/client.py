"""The adapter client and session client (seed 004): the only way the protocol layers reach the
coordinator. pgwire and the HTTP SQL API both use these."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence

from headrace.coordinator.coordinator import Coordinator
from headrace.coordinator.responses import (
    Column,
    CommandComplete,
    CopyFrom,
    ExecuteResponse,
    Fetch,
    StatementDescription,
    Subscribing,
)
from headrace.coordinator.plan_cache import copy_statement
from headrace.coordinator.session_sql import fetch_rows, portal_columns
from headrace.coordinator.session import (
    REPORTED_VARIABLES,
    PreparedStatement,
    Session,
    TransactionStatus,
    default_variables,
)
from headrace.coordinator.passthrough import takes_unparsed
from headrace.errors import HeadraceError, InternalError, SyntaxError_, as_notice, io_faults_as_errors
from headrace.metrics.sessions import STATEMENTS, SessionActivity
from headrace.pgwire.types.time_zone import bind_session_variables
from headrace.catalog.items import DEFAULT_DATABASE
from headrace.sql import limits
from headrace.sql.parser import parse_client_statement, split_statements
from headrace.sql.limits import OFF_LOOP_PARSE_CHARS, off_loop


class SessionClient:
    """One connection's handle. Every command runs with exclusive possession of the session
    (seed 004 sends the whole session to the coordinator and back): a second concurrent command
    is a bug in the caller and fails loudly."""

    def __init__(self, coordinator: Coordinator, session: Session, adapter: AdapterClient) -> None:
        self._coordinator = coordinator
        self._session = session
        self._adapter = adapter
        self._busy = False
        self._cancel: asyncio.Event | None = None
        self.activity = SessionActivity()  # headrace_internal.sessions (metrics/sessions.py)

    @property
    def connection_id(self) -> int:
        return self._session.connection_id

    @property
    def secret_key(self) -> int:
        return self._session.secret_key

    @property
    def session(self) -> Session:
        return self._session

    @property
    def transaction_status(self) -> str:
        return self._session.transaction.value

    def startup_parameters(self) -> dict[str, str]:
        return {reported: self._session.variables[name] for name, reported in REPORTED_VARIABLES.items()}

    def split_statements(self, sql: str) -> list[str]:
        """Split on the calling thread: for short text (see split_statements_off_loop). Refuses text over the
        statement limits (sql/limits.py: 54000 too long, 54001 too deep)."""
        return _checked_split(sql)

    async def split_statements_off_loop(self, sql: str) -> list[str]:
        """split_statements; text of OFF_LOOP_PARSE_CHARS or more is checked and split on the parse thread."""
        if len(sql) < OFF_LOOP_PARSE_CHARS:
            return _checked_split(sql)
        limits.check_size(sql)  # refused at once, without a thread hop
        return await off_loop(_checked_split, sql)

    async def check_syntax(self, statements: Sequence[str]) -> None:
        """Each statement parsed before any runs, as PostgreSQL parses a multi-statement Query whole: the first
        syntax error is raised and nothing has run. Text headrace's parser does not know but the store
        PostgreSQL may (coordinator.prepare sends it there) is left to PostgreSQL."""
        for sql in statements:
            if self._coordinator.prepare_cached(sql, ()) is not None:
                continue
            try:
                if len(sql) >= OFF_LOOP_PARSE_CHARS:
                    limits.check_size(sql)
                    await off_loop(parse_client_statement, sql)
                else:
                    parse_client_statement(sql)
            except SyntaxError_ as refused:
                if self._coordinator.passthrough is None or refused.sqlstate != "42601" or not takes_unparsed(sql):
                    raise

    async def prepare(self, name: str, sql: str, param_types: Sequence[int], *, describe: bool = True) -> None:
        """`describe` False: the caller does not need the statement's columns before running it (the simple query
        protocol), so a statement for the store PostgreSQL is not described there first (one round trip less)."""
        if name and name in self._session.statements:
            raise HeadraceError(f'prepared statement "{name}" already exists', sqlstate="42P05")
        with self._possession():
            ast = None
            if len(sql) >= OFF_LOOP_PARSE_CHARS and self._coordinator.prepare_cached(sql, param_types) is None:
                limits.check_size(sql)
                ast = await off_loop(parse_client_statement, sql)
            try:
                statement = await self._coordinator.prepare(self._session, name, sql, param_types, ast=ast,
                                                            describe=describe)
            except RecursionError:
                raise limits.StackDepthExceeded() from None  # planning an expression sqlglot barely parsed
        self._session.statements[name] = statement

    def cached_statement(self, name: str, sql: str | None, param_types: Sequence[int]) -> PreparedStatement | None:
        """For answering a whole [Parse] Bind Execute Sync at once (pgwire/direct_lane.py): the statement a
        Parse of `sql` would prepare, if the plan cache already knows it (sql None: the prepared statement
        `name`). None when the general path must run (it then reports any error)."""
        if sql is None:
            return self._session.statements.get(name)
        if name and name in self._session.statements:
            return None  # the general path says 42P05
        if not self._coordinator.shortcuts_allowed(self._session):
            return None
        return self._coordinator.prepare_cached(sql, param_types, copy=False)

    def answer_now(self, statement: PreparedStatement, params: Sequence[object]) -> list[tuple[object, ...]] | None:
        """The rows of `statement` bound to `params`, when the coordinator has them without waiting (an index
        lookup with nothing to wait for); None otherwise. Runs no command: nothing to cancel or possess."""
        if self._busy:
            return None
        return self._coordinator.answer_now(self._session, statement, params)

    def install_statement(self, name: str, statement: PreparedStatement) -> None:
        """What Parse does once prepared: the statement is `name`'s (the unnamed one is replaced). A copy:
        cached_statement may have returned the plan cache's own object."""
        self._session.statements[name] = copy_statement(statement)

    def describe_statement(self, name: str) -> StatementDescription:
        return self._session.get_statement(name).description

    def bind(self, portal: str, statement: str, params: Sequence[object], result_formats: Sequence[int] = ()) -> None:
        """`params`: Python values, or (format code, bytes) pairs for a statement whose description says
        raw_parameters."""
        self._session.set_portal(portal, self._session.get_statement(statement), params, result_formats)

    async def declare(self, portal: str, sql: str, params: Sequence[object]) -> None:
        """Prepare and bind in one step, without naming the statement (seed 004's declare)."""
        with self._possession():
            statement = await self._coordinator.prepare(self._session, "", sql, [])
        self._session.set_portal(portal, statement, params)

    def describe_portal(self, portal: str) -> tuple[Column, ...] | None:
        return portal_columns(self._session.get_portal(portal))

    async def execute(self, portal: str, max_rows: int, cancel: asyncio.Event, *,
                      stream: bool = False) -> ExecuteResponse:
        """Run a portal. Never returns Fetch: a FETCH's inner execute (of its cursor) runs here,
        and its rows come back tagged FETCH (seed 004's outer and inner execute). `stream`: the caller
        takes a large result in pieces (SendingRows.more: execute the portal again for the next)."""
        found = self._session.get_portal(portal)
        self._cancel = cancel
        streaming = False
        resumed = found.pending_rows is not None or found.row_stream is not None  # a later piece of one result
        if not resumed:
            self.activity.begin(found.statement.sql)
        began, failed = time.perf_counter(), True
        try:
            with self._possession(), io_faults_as_errors():
                response = await self._coordinator.execute(self._session, found, max_rows, cancel, stream=stream)
                if isinstance(response, Fetch):
                    fetched = await fetch_rows(self._coordinator, self._session, response, cancel)
                    failed = False
                    return fetched
                if isinstance(response, Subscribing):
                    streaming = True  # it goes on after this returns: a CancelRequest must still reach it
                failed = False
                if isinstance(response, CommandComplete) and response.notices:
                    return shown_notices(response, self._session.variables.get("client_min_messages", "notice"))
                return response
        finally:
            if not streaming:
                self._cancel = None
            if not resumed:  # headrace_sql_statement_seconds, headrace_internal.sessions (metrics/sessions.py)
                STATEMENTS.observe(self.activity.kind or "other", time.perf_counter() - began, failed)
                self.activity.end(self._session.transaction.value)

    async def insert_rows(self, target: CopyFrom, rows: list[tuple[object, ...]],
                          cancel: asyncio.Event | None = None) -> CommandComplete:
        """The rows a COPY FROM STDIN sent, decoded by the protocol layer (seed 004's CopyRows);
        the COPY finishes here: CommandComplete("COPY n")."""
        with self._possession(), io_faults_as_errors():
            count = await self._coordinator.session_sql.targets.insert_rows(
                self._session, target.target, target.columns, rows)
        return CommandComplete(f"COPY {count}")

    async def relay_copy(self, target: CopyFrom, data: bytes | None, failure: str | None = None) -> CommandComplete:
        """A COPY FROM STDIN into a relation only the store PostgreSQL keeps (`target.relay`): the client's data as
        it sent it (None and `failure`: its CopyFail), for PostgreSQL's own COPY to parse."""
        passthrough = self._coordinator.passthrough
        assert passthrough is not None and target.relay
        with self._possession(), io_faults_as_errors():
            return await passthrough.relay_copy(self._session, data, failure)

    def cancel_running(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    def close_statement(self, name: str) -> None:
        self._session.statements.pop(name, None)

    def close_portal(self, name: str) -> None:
        self._session.close_portal(name)

    def on_sync(self) -> None:
        self._session.end_of_batch()

    def on_error(self) -> None:
        self._session.fail_transaction()

    async def terminate(self) -> None:
        self._session.close_all_cursors()  # a subscription behind a cursor stops with its session
        self._coordinator.close_session(self._session)  # its store backend connection
        self._adapter._forget(self)

    def _possession(self) -> _Possession:
        return _Possession(self)


# client_min_messages: a notice is sent when its level is at least the setting's (INFO always is), as PostgreSQL
_MESSAGE_LEVELS = {"debug5": 0, "debug4": 1, "debug3": 2, "debug2": 3, "debug1": 4, "debug": 4, "log": 5,
                   "notice": 6, "warning": 7, "error": 8}


def shown_notices(response: CommandComplete, client_min_messages: str) -> CommandComplete:
    """`response` with the notices the session's client_min_messages filters out removed."""
    threshold = _MESSAGE_LEVELS.get(client_min_messages.lower(), 6)
    kept = tuple(notice for notice in response.notices if (severity := as_notice(notice).severity.lower()) == "info"
                 or _MESSAGE_LEVELS.get(severity, 6) >= threshold)
    return response if len(kept) == len(response.notices) else dataclasses.replace(response, notices=kept)


def _checked_split(sql: str) -> list[str]:
    limits.check_statement(sql)
    return split_statements(sql)


class _Possession:
    def __init__(self, client: SessionClient) -> None:
        self._client = client

    def __enter__(self) -> None:
        if self._client._busy:
            raise InternalError("session used by two commands at once")
        self._client._busy = True

    def __exit__(self, *exc: object) -> None:
        self._client._busy = False


class AdapterClient:
    """Creates and starts sessions; routes cancel requests to the session they name."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._sessions: dict[int, SessionClient] = {}

    async def new_session(self, user: str, database: str, params: dict[str, str]) -> SessionClient:
        if database != DEFAULT_DATABASE:
            raise HeadraceError(f'database "{database}" does not exist', sqlstate="3D000")
        variables = default_variables(user, database, params.get("application_name", ""))
        privileges = getattr(self._coordinator, "privileges", None)
        if privileges is not None and privileges.roles.find(user) is None:
            # PostgreSQL refuses an unknown role even where trust lets anyone in; never a superuser by default.
            raise HeadraceError(f'role "{user}" does not exist', sqlstate="28000")
        if privileges is not None and not privileges.is_superuser(user):
            variables["is_superuser"] = "off"  # reported at startup, as PostgreSQL does (psql's prompt shows '>')
        for name, value in params.items():
            key = name.lower()
            if key in variables and key not in ("server_version", "server_version_num", "is_superuser"):
                variables[key] = value
        client = SessionClient(self._coordinator, Session(user=user, database=database, variables=variables), self)
        bind_session_variables(variables)  # timestamptz text in this session's TimeZone (this task serves it)
        self._sessions[client.connection_id] = client
        return client

    def cancel(self, connection_id: int, secret_key: int) -> None:
        client = self._sessions.get(connection_id)
        if client is not None and client.secret_key == secret_key:
            client.cancel_running()

    def sessions(self) -> list[SessionClient]:
        """The open sessions (headrace_internal.sessions, headrace_sql_sessions)."""
        return list(self._sessions.values())

    def _forget(self, client: SessionClient) -> None:
        self._sessions.pop(client.connection_id, None)


__all__ = ["AdapterClient", "SessionClient", "TransactionStatus"]
