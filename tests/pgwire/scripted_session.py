"""A scripted coordinator for the protocol tests: an AdapterClient / SessionClient test double that
answers a fixed table of statements. It only stands in for the real coordinator (tested end to end
elsewhere) so the pgwire layer can be checked message by message and against real clients.

Statements it knows:
  SELECT 1 | SELECT * FROM numbers (n = 1..5) | SELECT 1/0 (22012) | SELECT everything (one row of
  every supported type) | SELECT everything but int arrays (asyncpg would introspect int4[]) |
  SELECT pg_sleep (waits until cancelled: 57014) | BEGIN | COMMIT | ROLLBACK | SET ... (with a
  notice) | SELECT $1::type, $2::type, ... (echoes its parameters).
Anything else is a syntax error (42601, position 1).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from headrace.coordinator.responses import (
    Column,
    CommandComplete,
    EmptyQuery,
    ExecuteResponse,
    SendingRows,
    StatementDescription,
)
from headrace.errors import HeadraceError, QueryCanceled
from headrace.pgwire import types as t

TYPE_NAMES = {
    "bool": t.BOOL, "int2": t.INT2, "int4": t.INT4, "int": t.INT4, "int8": t.INT8, "float4": t.FLOAT4,
    "float8": t.FLOAT8, "numeric": t.NUMERIC, "text": t.TEXT, "varchar": t.VARCHAR, "bytea": t.BYTEA,
    "date": t.DATE, "timestamp": t.TIMESTAMP, "timestamptz": t.TIMESTAMPTZ, "interval": t.INTERVAL,
    "uuid": t.UUID, "json": t.JSON, "jsonb": t.JSONB,
}
_ECHO = re.compile(r"SELECT (\$\d+::\w+(?:\[\])?(?:, \$\d+::\w+(?:\[\])?)*)")

EVERYTHING: list[tuple[str, int, Any]] = [
    ("b", t.BOOL, True), ("i2", t.INT2, -7), ("i4", t.INT4, 2_000_000_000), ("i8", t.INT8, -(1 << 62)),
    ("f4", t.FLOAT4, 1.5), ("f8", t.FLOAT8, 0.1), ("num", t.NUMERIC, Decimal("-12345.678900")),
    ("txt", t.TEXT, "héllo"), ("vc", t.VARCHAR, "v"), ("bin", t.BYTEA, b"\x00\xffab"),
    ("d", t.DATE, date(2026, 11, 21)), ("ts", t.TIMESTAMP, datetime(2026, 11, 21, 10, 0, 0, 123000)),
    ("tstz", t.TIMESTAMPTZ, datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=timezone.utc)),
    ("iv", t.INTERVAL, timedelta(days=3, hours=4, minutes=5, seconds=6, microseconds=789000)),
    ("u", t.UUID, uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("j", t.JSON, {"a": [1, 2]}), ("jb", t.JSONB, '{"k": "v"}'),
    ("ints", 1007, [1, None, 3]), ("texts", 1009, ["a b", "", None, 'q"uote']), ("nothing", t.TEXT, None),
]


def _everything(sql: str) -> list[tuple[str, int, Any]]:
    if sql.endswith("but int arrays"):
        return [column for column in EVERYTHING if column[1] != 1007]
    return EVERYTHING


@dataclass
class Portal:
    rows: list[tuple[Any, ...]] | None
    response: ExecuteResponse | None
    columns: tuple[Column, ...] | None
    position: int = 0
    sleeps: bool = False


@dataclass
class Statement:
    sql: str
    param_types: tuple[int, ...]
    columns: tuple[Column, ...] | None


def _plan(sql: str, declared: Sequence[int]) -> Statement:
    """Parameter types and result columns of a known statement (the parser/planner stand-in)."""
    if sql == "":
        return Statement(sql, (), None)
    if sql in ("SELECT 1", "SELECT 1/0"):
        return Statement(sql, (), (Column("?column?", t.INT4),))
    if sql == "SELECT * FROM numbers":
        return Statement(sql, (), (Column("n", t.INT8),))
    if sql in ("SELECT everything", "SELECT everything but int arrays"):
        return Statement(sql, (), tuple(Column(name, oid) for name, oid, _ in _everything(sql)))
    if sql == "SELECT pg_sleep":
        return Statement(sql, (), (Column("pg_sleep", t.TEXT),))
    if sql in ("BEGIN", "COMMIT", "ROLLBACK") or sql.startswith("SET "):
        return Statement(sql, (), None)
    echo = _ECHO.fullmatch(sql)
    if echo:
        oids = []
        for index, cast in enumerate(echo.group(1).split(", ")):
            name = cast.split("::")[1]
            oid = t.array_oid_of(TYPE_NAMES[name[:-2]]) if name.endswith("[]") else TYPE_NAMES[name]
            oids.append(declared[index] if index < len(declared) and declared[index] else oid)
        return Statement(sql, tuple(oids), tuple(Column(f"c{i}", oid) for i, oid in enumerate(oids)))
    raise HeadraceError(f'syntax error at or near "{sql.split()[0] if sql.split() else sql}"',
                        sqlstate="42601", position=1)


@dataclass
class ScriptedSession:
    connection_id: int
    secret_key: int
    calls: list[str] = field(default_factory=list)
    statements: dict[str, Statement] = field(default_factory=dict)
    portals: dict[str, Portal] = field(default_factory=dict)
    status: str = "I"
    running: asyncio.Event | None = None
    terminated: bool = False

    @property
    def transaction_status(self) -> str:
        return self.status

    def startup_parameters(self) -> dict[str, str]:
        return {"server_version": "16.0", "client_encoding": "UTF8", "DateStyle": "ISO, MDY",
                "TimeZone": "UTC", "integer_datetimes": "on", "standard_conforming_strings": "on",
                "application_name": "", "IntervalStyle": "postgres", "is_superuser": "off",
                "session_authorization": "headrace"}

    def split_statements(self, sql: str) -> list[str]:
        self.calls.append(f"split {sql}")
        return [part.strip() for part in sql.split(";") if part.strip()]

    async def split_statements_off_loop(self, sql: str) -> list[str]:
        return self.split_statements(sql)

    async def check_syntax(self, statements: Sequence[str]) -> None:
        self.calls.append(f"check_syntax {len(statements)}")
        for sql in statements:  # a statement that starts with no SQL verb is a syntax error
            verb = sql.split(None, 1)[0].upper() if sql.strip() else "SELECT"
            if verb not in ("SELECT", "BEGIN", "COMMIT", "ROLLBACK", "SET", "COPY", "INSERT", "SHOW"):
                raise HeadraceError(f'syntax error at or near "{sql.split(None, 1)[0]}"', sqlstate="42601")

    async def prepare(self, name: str, sql: str, param_types: Sequence[int], *, describe: bool = True) -> None:
        self.calls.append(f"prepare {name!r} {sql}")
        if name and name in self.statements:
            raise HeadraceError(f'prepared statement "{name}" already exists', sqlstate="42P05")
        self.statements[name] = _plan(sql, param_types)

    def cached_statement(self, name: str, sql: str | None, param_types: Sequence[int]) -> None:
        return None  # nothing is answered at once here: every message takes the general path these tests check

    def answer_now(self, statement: object, params: Sequence[object]) -> None:
        return None

    def install_statement(self, name: str, statement: object) -> None:
        raise AssertionError("never called: cached_statement answers None")

    def describe_statement(self, name: str) -> StatementDescription:
        statement = self._statement(name)
        return StatementDescription(statement.param_types, statement.columns)

    def bind(self, portal: str, statement: str, params: Sequence[object],
             result_formats: Sequence[int] = ()) -> None:
        self.calls.append(f"bind {portal!r} {statement!r} {list(params)!r}")
        planned = self._statement(statement)
        self.portals[portal] = self._run(planned, list(params))

    def describe_portal(self, portal: str) -> tuple[Column, ...] | None:
        return self._portal(portal).columns

    async def execute(self, portal: str, max_rows: int, cancel: asyncio.Event, *,
                      stream: bool = False) -> ExecuteResponse:
        self.calls.append(f"execute {portal!r} {max_rows}")
        state = self._portal(portal)
        if state.sleeps:
            self.running = cancel
            try:
                await asyncio.wait_for(cancel.wait(), timeout=10)
            finally:
                self.running = None
            raise QueryCanceled("canceling statement due to user request")
        if state.response is not None:
            return state.response
        assert state.rows is not None and state.columns is not None
        end = len(state.rows) if max_rows == 0 else min(len(state.rows), state.position + max_rows)
        rows, state.position = state.rows[state.position:end], end
        return SendingRows(state.columns, rows, suspended=end < len(state.rows))

    def close_statement(self, name: str) -> None:
        self.calls.append(f"close_statement {name!r}")
        self.statements.pop(name, None)

    def close_portal(self, name: str) -> None:
        self.calls.append(f"close_portal {name!r}")
        self.portals.pop(name, None)

    def on_sync(self) -> None:
        self.calls.append("on_sync")
        self.portals.pop("", None)

    def on_error(self) -> None:
        self.calls.append("on_error")
        if self.status == "T":
            self.status = "E"

    async def terminate(self) -> None:
        self.calls.append("terminate")
        self.terminated = True

    def _statement(self, name: str) -> Statement:
        if name not in self.statements:
            raise HeadraceError(f'prepared statement "{name}" does not exist', sqlstate="26000")
        return self.statements[name]

    def _portal(self, name: str) -> Portal:
        if name not in self.portals:
            raise HeadraceError(f'portal "{name}" does not exist', sqlstate="34000")
        return self.portals[name]

    def _run(self, statement: Statement, params: list[Any]) -> Portal:
        sql, columns = statement.sql, statement.columns
        if self.status == "E" and sql not in ("COMMIT", "ROLLBACK"):
            raise HeadraceError("current transaction is aborted, commands ignored until end of "
                                "transaction block", sqlstate="25P02")
        if sql == "SELECT 1/0":
            raise HeadraceError("division by zero", sqlstate="22012")
        if sql == "":
            return Portal(None, EmptyQuery(), None)
        if sql in ("BEGIN", "COMMIT", "ROLLBACK"):
            self.status = "T" if sql == "BEGIN" else "I"
            return Portal(None, CommandComplete(sql), None)
        if sql.startswith("SET "):
            return Portal(None, CommandComplete("SET", notices=("setting ignored",)), None)
        if sql == "SELECT pg_sleep":
            return Portal(None, None, columns, sleeps=True)
        rows: list[tuple[Any, ...]]
        if sql == "SELECT 1":
            rows = [(1,)]
        elif sql == "SELECT * FROM numbers":
            rows = [(n,) for n in range(1, 6)]
        elif sql.startswith("SELECT everything"):
            rows = [tuple(value for _, _, value in _everything(sql))]
        else:
            rows = [tuple(params)]
        return Portal(rows, None, columns)


@dataclass
class ScriptedAdapter:
    sessions: dict[int, ScriptedSession] = field(default_factory=dict)
    cancels: list[tuple[int, int]] = field(default_factory=list)
    session_params: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    async def new_session(self, user: str, database: str, params: dict[str, str]) -> ScriptedSession:
        self.session_params.append((user, database, params))
        if user == "nobody":
            raise HeadraceError('role "nobody" does not exist', sqlstate="28000")
        connection_id = len(self.sessions) + 1
        session = ScriptedSession(connection_id, secret_key=1000 + connection_id)
        self.sessions[connection_id] = session
        return session

    def cancel(self, connection_id: int, secret_key: int) -> None:
        self.cancels.append((connection_id, secret_key))
        session = self.sessions.get(connection_id)
        if session is not None and session.secret_key == secret_key and session.running is not None:
            session.running.set()

