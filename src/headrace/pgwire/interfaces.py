"""The coordinator as pgwire sees it: structural types for the AdapterClient / SessionClient that
headrace.coordinator.client implements, so this package never imports the coordinator."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from headrace.coordinator.responses import Column, CommandComplete, CopyFrom, ExecuteResponse, StatementDescription


class PreparedHandle(Protocol):
    """A prepared statement as the coordinator holds it; pgwire only reads its description."""

    @property
    def description(self) -> StatementDescription: ...


class SessionClient(Protocol):
    """One client session. Every method may raise HeadraceError, which pgwire reports to the client."""

    @property
    def connection_id(self) -> int:
        """BackendKeyData's process id; keep it and secret_key in [0, 2**31) for every client."""
        ...

    @property
    def secret_key(self) -> int: ...

    @property
    def transaction_status(self) -> str:
        """'I' idle, 'T' in a transaction block, 'E' in a failed transaction block."""
        ...

    def startup_parameters(self) -> dict[str, str]: ...

    def split_statements(self, sql: str) -> list[str]: ...

    async def split_statements_off_loop(self, sql: str) -> list[str]:
        """split_statements, on another thread for long text (the event loop keeps serving meanwhile)."""
        ...

    async def check_syntax(self, statements: Sequence[str]) -> None:
        """Raise the first statement's syntax error, if any, before any of them runs (PostgreSQL parses a
        multi-statement Query whole first)."""
        ...

    async def prepare(self, name: str, sql: str, param_types: Sequence[int], *, describe: bool = True) -> None: ...

    def describe_statement(self, name: str) -> StatementDescription: ...

    def cached_statement(self, name: str, sql: str | None, param_types: Sequence[int]) -> PreparedHandle | None:
        """Parse of `sql` without planning (the plan cache knows it), or the statement `name` (sql None)."""
        ...

    def answer_now(self, statement: PreparedHandle, params: Sequence[object]) -> list[tuple[object, ...]] | None:
        """The statement's rows if the coordinator has them without waiting; None: run the general path."""
        ...

    def install_statement(self, name: str, statement: PreparedHandle) -> None: ...

    def bind(self, portal: str, statement: str, params: Sequence[object],
             result_formats: Sequence[int] = ()) -> None: ...

    def describe_portal(self, portal: str) -> tuple[Column, ...] | None: ...

    async def execute(self, portal: str, max_rows: int, cancel: asyncio.Event, *,
                      stream: bool = False) -> ExecuteResponse: ...

    async def insert_rows(self, target: CopyFrom, rows: list[tuple[object, ...]],
                          cancel: asyncio.Event | None = None) -> CommandComplete:
        """The rows of a COPY FROM STDIN, decoded; answers CommandComplete("COPY n")."""
        ...

    async def relay_copy(self, target: CopyFrom, data: bytes | None, failure: str | None = None) -> CommandComplete:
        """A COPY FROM STDIN whose `target.relay` is set: its data undecoded (None and `failure`: the client's
        CopyFail); answers CommandComplete("COPY n")."""
        ...

    def close_statement(self, name: str) -> None: ...

    def close_portal(self, name: str) -> None: ...

    def on_sync(self) -> None: ...

    def on_error(self) -> None: ...

    async def terminate(self) -> None: ...


class AdapterClient(Protocol):
    async def new_session(self, user: str, database: str, params: dict[str, str]) -> SessionClient: ...

    def cancel(self, connection_id: int, secret_key: int) -> None: ...
