"""Per-session state (seed 004): variables, prepared statements and portals, transaction status.

Portals and SQL cursors share one namespace; the unnamed statement survives Sync, the unnamed
portal does not."""

from __future__ import annotations

import enum
import itertools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from headrace.coordinator.cursors import ScrollRows, SubscriptionBuffer
from headrace.coordinator.responses import Column, StatementDescription
from headrace.errors import (
    HeadraceError,
    ProtocolViolation,
    UndefinedCursor,
    UndefinedPreparedStatement,
)
from headrace.sql.select import SelectPlan

if TYPE_CHECKING:
    from headrace.coordinator.row_streams import RowStream

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
    backend: bool = False  # PostgreSQL's statement, run on the session's store backend (coordinator/passthrough.py)
    notice: str | None = None  # said with its result (a table only the store PostgreSQL keeps)
    # A backend statement over headrace's relations (the PostgreSQL serving store): they are checked (privileges,
    # read-your-writes) before PostgreSQL runs it.
    store_reads: tuple[tuple[str | None, str], ...] = ()


@dataclass(slots=True)
class Portal:
    statement: PreparedStatement
    params: tuple[Any, ...]
    # Set once the portal has run: the rows not yet returned (Execute with max_rows resumes here).
    pending_rows: list[tuple[Any, ...]] | None = None
    columns: tuple[Column, ...] | None = None
    rows_sent: int = 0
    finished: bool = False
    # SQL cursors (DECLARE) share this namespace with protocol portals.
    cursor: bool = False
    hold: bool = False  # WITH HOLD: survives the end of its transaction
    binary: bool = False
    declared_in_block: bool = False  # a ROLLBACK of that block drops even a WITH HOLD cursor
    # A portal over a streaming statement (SUBSCRIBE): FETCH draws from it.
    stream: SubscriptionBuffer | None = None
    # A cursor over rows: all of them, positioned (FETCH / MOVE in any direction); `scroll` is DECLARE's SCROLL
    # (True), NO SCROLL (False, forward only) or neither (None: backward allowed, as PostgreSQL's plans mostly do).
    scroll_rows: ScrollRows | None = None
    scroll: bool | None = None
    result_formats: tuple[int, ...] = ()  # Bind's result format codes (a store backend statement asks for them)
    # The rows of a large result still in the store, handed out in pieces (coordinator/row_streams.py).
    row_stream: RowStream | None = None

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if self.row_stream is not None:
            self.row_stream.close()
            self.row_stream = None


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
    # What RESET returns a variable to: the built-in default, or the client's startup value.
    session_defaults: dict[str, str] = field(default_factory=dict)
    # Variables as they were at BEGIN (a ROLLBACK restores them) and before each SET LOCAL.
    _block_variables: dict[str, str] | None = None
    _local_saved: dict[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.session_defaults:
            self.session_defaults = dict(self.variables)

    def get_statement(self, name: str) -> PreparedStatement:
        try:
            return self.statements[name]
        except KeyError:
            raise UndefinedPreparedStatement(f'prepared statement "{name}" does not exist') from None

    def get_portal(self, name: str) -> Portal:
        try:
            return self.portals[name]
        except KeyError:
            shown = "cursor" if name else "portal"
            raise UndefinedCursor(f'{shown} "{name}" does not exist') from None

    def set_portal(self, name: str, statement: PreparedStatement, params: Sequence[Any],
                   result_formats: Sequence[int] = ()) -> Portal:
        """Bind a statement and its parameter values to a portal (seed 004's Session::set_portal).
        The unnamed portal is replaced; a named one must not exist yet (42P03)."""
        expected = len(statement.description.param_types)
        if len(params) != expected:
            raise ProtocolViolation(
                f"bind message supplies {len(params)} parameters, but prepared statement requires {expected}")
        if name and name in self.portals:
            raise HeadraceError(f'cursor "{name}" already exists', sqlstate="42P03")
        if not name:
            self.close_portal("")
        portal = Portal(statement=statement, params=tuple(params), result_formats=tuple(result_formats))
        self.portals[name] = portal
        return portal

    def close_portal(self, name: str) -> None:
        portal = self.portals.pop(name, None)
        if portal is not None:
            portal.close()

    def close_all_cursors(self) -> None:
        for name in list(self.portals):
            self.close_portal(name)

    @property
    def in_block(self) -> bool:
        return self.transaction is not TransactionStatus.IDLE

    def begin(self) -> bool:
        """BEGIN: False (and no change) when a transaction block is already open."""
        if self.in_block:
            return False
        self.transaction = TransactionStatus.IN_BLOCK
        self._block_variables = dict(self.variables)
        return True

    def set_variable(self, name: str, value: str, *, local: bool = False) -> None:
        if local and name not in self._local_saved:
            self._local_saved[name] = self.variables.get(name)
        self.variables[name] = value

    def end_transaction(self, *, committed: bool) -> None:
        """COMMIT or ROLLBACK of the block: SET LOCAL values revert, a ROLLBACK reverts every SET
        of the block; cursors without HOLD close (and on ROLLBACK those declared in the block)."""
        for name, value in self._local_saved.items():
            if value is None:
                self.variables.pop(name, None)
            else:
                self.variables[name] = value
        self._local_saved.clear()
        if not committed and self._block_variables is not None:
            self.variables.clear()
            self.variables.update(self._block_variables)
        self._block_variables = None
        for name, portal in list(self.portals.items()):
            if not portal.hold or (not committed and portal.declared_in_block):
                self.close_portal(name)
            else:
                portal.declared_in_block = False
        self.transaction = TransactionStatus.IDLE

    def fail_transaction(self) -> None:
        if self.transaction is TransactionStatus.IN_BLOCK:
            self.transaction = TransactionStatus.FAILED

    def end_of_batch(self) -> None:
        """Sync: the unnamed portal goes. Outside a transaction block the implicit transaction of
        the batch ends too, and with it every portal that is not a WITH HOLD cursor (PostgreSQL)."""
        self.close_portal("")
        if not self.in_block:
            for name, portal in list(self.portals.items()):
                if not portal.hold:
                    self.close_portal(name)

    def reset(self) -> None:
        """DISCARD ALL: as if the connection were new (outside a transaction block)."""
        self.close_all_cursors()
        self.statements.clear()
        self.variables.clear()
        self.variables.update(self.session_defaults)
        self._local_saved.clear()
