"""Per-session state (seed 004): variables, prepared statements and portals, transaction status.

Portals and SQL cursors share one namespace; the unnamed statement survives Sync, the unnamed
portal does not."""

from __future__ import annotations

import enum
import itertools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from headrace.coordinator.responses import Column, StatementDescription
from headrace.errors import (
    HeadraceError,
    ProtocolViolation,
    UndefinedCursor,
    UndefinedPreparedStatement,
)
from headrace.sql.select import SelectPlan

SERVER_VERSION = "15.0"
SERVER_VERSION_NUM = "150000"

_connection_ids = itertools.count(1)


class TransactionStatus(enum.Enum):
    IDLE = "I"
    IN_BLOCK = "T"
    FAILED = "E"


@dataclass(slots=True)
class PreparedStatement:
    sql: str
    ast: exp.Expr | None  # None for the empty statement
    description: StatementDescription
    plan: SelectPlan | None = None


@dataclass(slots=True)
class Portal:
    statement: PreparedStatement
    params: tuple[Any, ...]
    # Set once the portal has run: the rows not yet returned (Execute with max_rows resumes here).
    pending_rows: list[tuple[Any, ...]] | None = None
    columns: tuple[Column, ...] | None = None
    rows_sent: int = 0
    finished: bool = False


def default_variables(user: str, database: str, application_name: str) -> dict[str, str]:
    return {
        "application_name": application_name,
        "client_encoding": "UTF8",
        "datestyle": "ISO, MDY",
        "integer_datetimes": "on",
        "intervalstyle": "postgres",
        "is_superuser": "on",
        "server_encoding": "UTF8",
        "server_version": SERVER_VERSION,
        "server_version_num": SERVER_VERSION_NUM,
        "session_authorization": user,
        "standard_conforming_strings": "on",
        "timezone": "UTC",
        "search_path": "public",
        "transaction_isolation": "serializable",
        "default_transaction_isolation": "serializable",
        "database": database,
    }


# Names as PostgreSQL reports them in ParameterStatus (it preserves their canonical case).
REPORTED_VARIABLES = {
    "application_name": "application_name", "client_encoding": "client_encoding", "datestyle": "DateStyle",
    "integer_datetimes": "integer_datetimes", "intervalstyle": "IntervalStyle", "is_superuser": "is_superuser",
    "server_encoding": "server_encoding", "server_version": "server_version",
    "session_authorization": "session_authorization",
    "standard_conforming_strings": "standard_conforming_strings", "timezone": "TimeZone",
}


@dataclass
class Session:
    user: str
    database: str
    variables: dict[str, str]
    connection_id: int = field(default_factory=lambda: next(_connection_ids))
    secret_key: int = field(default_factory=lambda: secrets.randbits(31))
    transaction: TransactionStatus = TransactionStatus.IDLE
    statements: dict[str, PreparedStatement] = field(default_factory=dict)
    portals: dict[str, Portal] = field(default_factory=dict)

    def get_statement(self, name: str) -> PreparedStatement:
        try:
            return self.statements[name]
        except KeyError:
            raise UndefinedPreparedStatement(f'prepared statement "{name}" does not exist') from None

    def get_portal(self, name: str) -> Portal:
        try:
            return self.portals[name]
        except KeyError:
            raise UndefinedCursor(f'portal "{name}" does not exist') from None

    def set_portal(self, name: str, statement: PreparedStatement, params: Sequence[Any]) -> None:
        """Bind a statement and its parameter values to a portal (seed 004's Session::set_portal)."""
        expected = len(statement.description.param_types)
        if len(params) != expected:
            raise ProtocolViolation(
                f"bind message supplies {len(params)} parameters, but prepared statement requires {expected}")
        if name and name in self.portals:
            raise HeadraceError(f'cursor "{name}" already exists', sqlstate="42P03")
        self.portals[name] = Portal(statement=statement, params=tuple(params))

    def fail_transaction(self) -> None:
        if self.transaction is TransactionStatus.IN_BLOCK:
            self.transaction = TransactionStatus.FAILED

    def end_of_batch(self) -> None:
        """Sync: the unnamed portal goes; an implicit transaction ends."""
        self.portals.pop("", None)
