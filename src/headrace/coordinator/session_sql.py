"""The session-level statements in the coordinator: prepared statements, cursors and FETCH,
transaction blocks, session variables, DISCARD and COPY (seed 004's "these concepts are also
exposed in SQL").

PREPARE / DECLARE / EXECUTE / COPY each wrap another statement, which the coordinator prepares and
executes like any other; FETCH answers seed 004's Fetch, and SessionClient runs the inner execute
(`fetch_rows`). Portals and SQL cursors share the session's one namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlglot import exp

from headrace.coordinator.copy import CopyTargets, copy_to
from headrace.coordinator.cursors import FORWARD, ScrollRows, SubscriptionBuffer, parse_timeout
from headrace.coordinator.responses import (
    CommandComplete,
    CopyFrom,
    ExecuteResponse,
    Fetch,
    SendingRows,
    StatementDescription,
    Subscribing,
)
from headrace.coordinator.session import REPORTED_VARIABLES, Portal, PreparedStatement, Session, TransactionStatus
from headrace.coordinator.variables import (
    execute_reset,
    execute_set,
    execute_set_transaction,
    execute_show,
    reported,
    show_columns,
)
from headrace.errors import FeatureNotSupported, HeadraceError, Notice, SyntaxError_, UndefinedCursor
from headrace.pgwire import types as pg
from headrace.pgwire.copy_format import CopyOptions
from headrace.sql.ast import (
    CloseCursor,
    CopyStatement,
    DeallocateStatement,
    DeclareCursor,
    DiscardStatement,
    ExecuteStatement,
    FetchCursor,
    PrepareStatement,
    ResetVariable,
    SavepointStatement,
    SetTransaction,
    SetVariable,
    ShowVariable,
)
from headrace.sql.select import PG_TYPE_NAMES
from headrace.sql.types import OID_BY_TYPE_NAME

SESSION_STATEMENTS = (PrepareStatement, ExecuteStatement, DeallocateStatement, DeclareCursor, FetchCursor,
                      CloseCursor, SetVariable, SetTransaction, ResetVariable, DiscardStatement, CopyStatement,
                      ShowVariable, exp.Transaction, exp.Commit, exp.Rollback, SavepointStatement)
DEFAULT_SCHEMA = "public"


class StatementRunner(Protocol):
    """What this module needs of the coordinator: prepare and execute wrapped statements."""

    async def prepare(self, session: Session, name: str, sql: str, param_types: Sequence[int]) -> PreparedStatement: ...

    async def execute(self, session: Session, portal: Portal, max_rows: int, cancel: asyncio.Event) -> ExecuteResponse: ...


class SessionStatements:
    def __init__(self, runner: StatementRunner, targets: CopyTargets) -> None:
        self._runner = runner
        self.targets = targets  # COPY FROM's destinations; the tables issue replaces this

    # --- prepare ------------------------------------------------------------------------------
    def describe(self, session: Session, ast: exp.Expr, param_types: Sequence[int]) -> StatementDescription:
        """Parameter types and result columns; a FETCH or EXECUTE returns what its target returns."""
        columns = None
        if isinstance(ast, ShowVariable):
            columns = show_columns(ast.this)
        elif isinstance(ast, ExecuteStatement):
            columns = session.get_statement(ast.this).description.columns
        elif isinstance(ast, FetchCursor) and not ast.args.get("move"):
            portal = session.portals.get(ast.this)
            if portal is not None:
                columns = portal_columns(portal)
        return StatementDescription(tuple(param_types), columns)

    # --- execute ------------------------------------------------------------------------------
    async def execute(self, session: Session, ast: exp.Expr, cancel: asyncio.Event) -> ExecuteResponse:
        if isinstance(ast, SavepointStatement):
            return await execute_savepoint(session, ast, self.targets)
        if isinstance(ast, exp.Transaction):
            return self._begin(session, ast)
        if isinstance(ast, exp.Commit):
            return await self._end(session, commit=True)
        if isinstance(ast, exp.Rollback):
            return await self._end(session, commit=False)
        if isinstance(ast, SetVariable):
            return execute_set(session, ast)
        if isinstance(ast, SetTransaction):
            return execute_set_transaction(session, ast)
        if isinstance(ast, ResetVariable):
            return execute_reset(session, ast)
        if isinstance(ast, ShowVariable):
            return execute_show(session, ast.this)
        if isinstance(ast, DiscardStatement):
            return self._discard(session, ast)
        if isinstance(ast, PrepareStatement):
            return await self._prepare(session, ast)
        if isinstance(ast, ExecuteStatement):
            return await self._execute_prepared(session, ast, cancel)
        if isinstance(ast, DeallocateStatement):
            return self._deallocate(session, ast)
        if isinstance(ast, DeclareCursor):
            return await self._declare(session, ast)
        if isinstance(ast, FetchCursor):
            session.get_portal(ast.this)  # 34000 now rather than in the inner execute
            return Fetch(ast.this, ast.args.get("count"), parse_timeout(ast.args.get("timeout")),
                         ast.args.get("direction") or FORWARD, bool(ast.args.get("move")))
        if isinstance(ast, CloseCursor):
            return self._close(session, ast)
        if isinstance(ast, CopyStatement):
            return await self._copy(session, ast, cancel)
        raise FeatureNotSupported(f"{ast.key.upper()} is not supported")

    # --- transaction blocks -------------------------------------------------------------------
    def _begin(self, session: Session, ast: exp.Transaction) -> CommandComplete:
        if not session.begin():
            return CommandComplete("BEGIN", (Notice("there is already a transaction in progress", "25001", "WARNING"),))
        _savepoints(session).clear()
        for mode in ast.args.get("modes") or []:
            if isinstance(mode, str) and mode.startswith("isolation level "):
                execute_set_transaction(session, SetTransaction(modes=[mode]))
        return CommandComplete("BEGIN")

    async def _end(self, session: Session, *, commit: bool) -> CommandComplete:
        if session.transaction is TransactionStatus.IDLE:
            return CommandComplete("COMMIT" if commit else "ROLLBACK",
                                   (Notice("there is no transaction in progress", "25P01", "WARNING"),))
        committed = commit and session.transaction is TransactionStatus.IN_BLOCK
        end_writes = getattr(self.targets, "end_transaction", None)  # tables: COMMIT appends the block's writes
        if end_writes is not None:
            await end_writes(session, committed)  # a failed COMMIT ends the block rolled back, then raises
        _savepoints(session).clear()
        session.end_transaction(committed=committed)
        return CommandComplete("COMMIT" if committed else "ROLLBACK")

    def _discard(self, session: Session, ast: DiscardStatement) -> CommandComplete:
        what = str(ast.this)
        if what == "all":
            if session.in_block:
                raise HeadraceError("DISCARD ALL cannot run inside a transaction block", sqlstate="25001")
            session.reset()
            return CommandComplete("DISCARD ALL", parameters=reported(session, list(REPORTED_VARIABLES)))
        return CommandComplete(f"DISCARD {what.upper()}")

    # --- prepared statements ------------------------------------------------------------------
    async def _prepare(self, session: Session, ast: PrepareStatement) -> CommandComplete:
        name = str(ast.this)
        if name in session.statements:
            raise HeadraceError(f'prepared statement "{name}" already exists', sqlstate="42P05")
        oids = [type_oid(type_name) for type_name in ast.args["param_types"]]
        statement = await self._runner.prepare(session, name, ast.args["statement_sql"], oids)
        session.statements[name] = statement
        return CommandComplete("PREPARE")

    async def _execute_prepared(self, session: Session, ast: ExecuteStatement, cancel: asyncio.Event) -> ExecuteResponse:
        name = str(ast.this)
        statement = session.get_statement(name)
        expected = statement.description.param_types
        given: list[exp.Expr] = ast.args.get("params") or []
        if len(given) != len(expected):
            raise SyntaxError_(f'wrong number of parameters for prepared statement "{name}"',
                               detail=f"Expected {len(expected)} parameters but got {len(given)}.")
        values = [parameter_value(expression, oid) for expression, oid in zip(given, expected, strict=True)]
        return await self._runner.execute(session, Portal(statement=statement, params=tuple(values)), 0, cancel)

    def _deallocate(self, session: Session, ast: DeallocateStatement) -> CommandComplete:
        name = ast.this
        if name is None:
            session.statements.clear()
            return CommandComplete("DEALLOCATE ALL")
        if name not in session.statements:
            raise HeadraceError(f'prepared statement "{name}" does not exist', sqlstate="26000")
        del session.statements[name]
        return CommandComplete("DEALLOCATE")

    # --- cursors ------------------------------------------------------------------------------
    async def _declare(self, session: Session, ast: DeclareCursor) -> CommandComplete:
        name = str(ast.this)
        hold = bool(ast.args.get("hold"))
        if not hold and not session.in_block:
            raise HeadraceError("DECLARE CURSOR can only be used in transaction blocks", sqlstate="25P01")
        if name in session.portals:
            raise HeadraceError(f'cursor "{name}" already exists', sqlstate="42P03")
        statement = await self._runner.prepare(session, "", ast.args["statement_sql"], ())
        if statement.description.columns is None:
            raise SyntaxError_("DECLARE CURSOR can only be used with a query that returns rows")
        if statement.description.param_types:
            raise HeadraceError(f"there is no parameter ${1}", sqlstate="42P02")
        portal = session.set_portal(name, statement, ())
        portal.cursor, portal.hold, portal.binary = True, hold, bool(ast.args.get("binary"))
        portal.scroll = ast.args.get("scroll")
        portal.declared_in_block = session.in_block
        return CommandComplete("DECLARE CURSOR")

    def _close(self, session: Session, ast: CloseCursor) -> CommandComplete:
        if ast.this is None:
            for name, portal in list(session.portals.items()):
                if portal.cursor:
                    session.close_portal(name)
            return CommandComplete("CLOSE CURSOR ALL")
        session.get_portal(ast.this)
        session.close_portal(ast.this)
        return CommandComplete("CLOSE CURSOR")

    # --- COPY ---------------------------------------------------------------------------------
    async def _copy(self, session: Session, ast: CopyStatement, cancel: asyncio.Event) -> ExecuteResponse:
        direction = ast.args["direction"]
        options = CopyOptions.parse(ast.args.get("options") or {}, direction=direction)
        table: tuple[str, str] | None = ast.args.get("table")
        columns: list[str] = ast.args.get("columns") or []
        if direction == "from":
            assert table is not None
            schema, name = table[0] or DEFAULT_SCHEMA, table[1]
            privileges = getattr(self._runner, "privileges", None)  # INSERT on the table, before any row is sent
            if privileges is not None:
                privileges.require_relations(session.user, [(schema, name)], "a")
            return CopyFrom((schema, name), self.targets.copy_columns(schema, name, columns), options)
        if table is not None:
            projection = ", ".join(_quote(column) for column in columns) or "*"
            source = f"{_quote(table[0])}.{_quote(table[1])}" if table[0] else _quote(table[1])
            query_sql = f"SELECT {projection} FROM {source}"
        else:
            query_sql = ast.args["query_sql"]
        statement = await self._runner.prepare(session, "", query_sql, ())
        if statement.description.columns is None:
            raise FeatureNotSupported("COPY TO STDOUT needs a query that returns rows")
        inner = await self._runner.execute(session, Portal(statement=statement, params=()), 0, cancel)
        if not isinstance(inner, (SendingRows, Subscribing)):
            raise FeatureNotSupported("COPY TO STDOUT needs a query that returns rows")
        return copy_to(options, inner)


@dataclass
class Savepoint:
    name: str
    variables: dict[str, str]  # the session's variables when it was set
    portals: frozenset[str]  # the cursors open then: ROLLBACK TO closes those declared after it
    tables: Any = None  # the block's table writes and created tables then (coordinator/table_blocks.py)


def _savepoints(session: Session) -> list[Savepoint]:
    """The block's savepoints, innermost last (kept on the session; BEGIN and COMMIT/ROLLBACK clear them)."""
    stack: list[Savepoint] | None = getattr(session, "_savepoints", None)
    if stack is None:
        stack = []
        setattr(session, "_savepoints", stack)
    return stack


async def execute_savepoint(session: Session, ast: SavepointStatement, targets: Any = None) -> CommandComplete:
    """SAVEPOINT / RELEASE / ROLLBACK TO with PostgreSQL's semantics for session state: ROLLBACK TO
    restores the variables and the block's table writes, closes cursors declared since, drops tables created
    since, keeps the savepoint and clears a failed block. `targets`: the tables (their `savepoint` and
    `rollback_to`)."""
    action, name = ast.args["action"], str(ast.this)
    if not session.in_block:
        shown = {"savepoint": "SAVEPOINT", "release": "RELEASE SAVEPOINT", "rollback_to": "ROLLBACK TO SAVEPOINT"}[action]
        raise HeadraceError(f"{shown} can only be used in transaction blocks", sqlstate="25P01")
    stack = _savepoints(session)
    if action == "savepoint":
        saved_tables = targets.savepoint(session) if hasattr(targets, "savepoint") else None
        stack.append(Savepoint(name, dict(session.variables), frozenset(session.portals), saved_tables))
        return CommandComplete("SAVEPOINT")
    found = next((i for i in range(len(stack) - 1, -1, -1) if stack[i].name == name), None)
    if found is None:
        raise HeadraceError(f'savepoint "{name}" does not exist', sqlstate="3B001")
    if action == "release":
        del stack[found:]
        return CommandComplete("RELEASE")
    savepoint = stack[found]
    del stack[found + 1:]
    if savepoint.tables is not None:
        await targets.rollback_to(session, savepoint.tables)
    session.variables.clear()
    session.variables.update(savepoint.variables)
    for portal_name in list(session.portals):
        if portal_name and portal_name not in savepoint.portals:
            session.close_portal(portal_name)
    session.transaction = TransactionStatus.IN_BLOCK
    return CommandComplete("ROLLBACK")


def portal_columns(portal: Portal) -> tuple[Any, ...] | None:
    if portal.stream is not None:
        return portal.stream.columns
    return portal.columns if portal.columns is not None else portal.statement.description.columns


async def fetch_rows(runner: StatementRunner, session: Session, fetch: Fetch,
                     cancel: asyncio.Event) -> SendingRows | CommandComplete:
    """The inner execute of a FETCH (or MOVE): rows of the cursor, tagged FETCH (MOVE n: the count only). A cursor
    over rows runs its query whole at its first FETCH and scrolls over them (coordinator/cursors.py ScrollRows);
    one over a stream (SUBSCRIBE) goes forward only, waiting for its first row (up to the timeout)."""
    portal = session.get_portal(fetch.name)
    if portal.stream is None and portal.scroll_rows is None:
        rows: list[Any] = []
        if not portal.finished:
            response = await runner.execute(session, portal, 0, cancel)
            if isinstance(response, Subscribing):
                portal.stream = SubscriptionBuffer(response)
            elif isinstance(response, SendingRows):
                rows = list(response.rows)
            else:
                raise UndefinedCursor(f'cursor "{fetch.name}" does not return rows')
        if portal.stream is None:
            portal.scroll_rows = ScrollRows(rows)
    columns = portal_columns(portal) or ()
    if (fetch.direction != FORWARD and portal.stream is not None) or (
            portal.scroll is False and portal.scroll_rows is not None
            and portal.scroll_rows.needs_backward(fetch.direction, fetch.count)):
        raise HeadraceError("cursor can only scan forward", sqlstate="55000",
                            hint="Declare it with SCROLL option to enable backward scan.")
    if portal.scroll_rows is not None:
        found = portal.scroll_rows.fetch(fetch.direction, fetch.count)
    elif fetch.count == 0:
        found = []
    else:
        assert portal.stream is not None
        found = await portal.stream.take(fetch.count, fetch.timeout_s, cancel)
    if fetch.move:
        return CommandComplete(f"MOVE {len(found)}")
    return SendingRows(columns, found, "FETCH")


def type_oid(type_name: str) -> int:
    """A type as written in PREPARE (int, integer, text, varchar(10), numeric(10,2), int4[] ...)."""
    text = type_name.strip().lower()
    array = text.endswith("[]")
    if array:
        text = text[:-2].strip()
    try:
        data_type = exp.DataType.build(text, dialect="postgres")
    except Exception:  # noqa: BLE001 - sqlglot raises several kinds for an unknown type
        raise HeadraceError(f'type "{type_name}" does not exist', sqlstate="42704") from None
    oid = OID_BY_TYPE_NAME.get(PG_TYPE_NAMES.get(data_type.this, text))
    if oid is None:
        raise HeadraceError(f'type "{type_name}" does not exist', sqlstate="42704")
    if array:
        array_oid = pg.array_oid_of(oid)
        if array_oid is None:
            raise HeadraceError(f'type "{type_name}" does not exist', sqlstate="42704")
        return array_oid
    return oid


def parameter_value(expression: exp.Expr, oid: int) -> Any:
    """An EXECUTE argument: a constant (literal, NULL, boolean, a cast or negation of one), typed
    as the statement's parameter through its text form."""
    node = expression
    while isinstance(node, (exp.Cast, exp.Paren)):
        node = node.this
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        text = "true" if node.this else "false"
    elif isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        text = "-" + node.this.name
    elif isinstance(node, exp.Literal):
        text = node.name
    else:
        raise FeatureNotSupported("EXECUTE arguments must be constants",
                                  detail=f"got {expression.sql(dialect='postgres')}")
    return pg.decode_parameter(oid, pg.TEXT_FORMAT, text.encode())


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
