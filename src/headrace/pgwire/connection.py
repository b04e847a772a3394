"""The per-connection protocol state machine (sans-I/O).

Input: bytes (`receive_data`) or decoded frontend messages (`handle`). Output: backend bytes in an
out buffer (`take_output`) plus effects telling the transport what to do: FLUSH (write the buffer
now), CLOSE (write it, then close) or CancelRequested (call adapter.cancel). It awaits the
coordinator but never touches a socket.

States are routed first, then messages:
  AWAITING_STARTUP --StartupMessage--> READY --Parse/Bind/...--> IN_EXTENDED_BATCH --Sync--> READY
  an extended-protocol error --> AWAITING_SYNC (discard all but Sync) --Sync--> READY
  Terminate, a FATAL error or a CancelRequest --> CLOSED
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from headrace.errors import HeadraceError, ProtocolViolation
from headrace.pgwire import messages
from headrace.pgwire.extended_query import ExtendedQueryHandler
from headrace.pgwire.interfaces import AdapterClient, SessionClient
from headrace.pgwire.simple_query import UNNAMED, run_simple_query
from headrace.pgwire.startup import start_session

logger = logging.getLogger(__name__)


class ConnectionState(enum.Enum):
    AWAITING_STARTUP = "awaiting_startup"
    READY = "ready"
    IN_EXTENDED_BATCH = "in_extended_batch"
    AWAITING_SYNC = "awaiting_sync"  # after an extended-protocol error: discard until Sync
    CLOSED = "closed"


class Signal(enum.Enum):
    FLUSH = "flush"  # write the out buffer now: the client waits for it (ReadyForQuery, Flush, errors)
    CLOSE = "close"  # write the out buffer, then close the connection


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """A CancelRequest arrived on this (fresh) connection: cancel that other session's statement."""

    process_id: int
    secret_key: int


Effect = Signal | CancelRequested

_EXTENDED_MESSAGES = (messages.Parse, messages.Bind, messages.Describe, messages.Execute, messages.Close)
_IGNORED_OUTSIDE_COPY = (messages.CopyData, messages.CopyDone, messages.CopyFail)  # as PostgreSQL does


class PgConnection:
    def __init__(self, adapter: AdapterClient) -> None:
        self._adapter = adapter
        self._decoder = messages.FrontendDecoder()
        self._out = bytearray()
        self._state = ConnectionState.AWAITING_STARTUP
        self._session: SessionClient | None = None
        self._extended: ExtendedQueryHandler | None = None
        self._running_cancel: asyncio.Event | None = None  # set by cancel_running()
        self._terminated = False

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def session(self) -> SessionClient | None:
        return self._session

    @property
    def pending_output_size(self) -> int:
        return len(self._out)

    def take_output(self) -> bytes:
        output = bytes(self._out)
        self._out.clear()
        return output

    def receive_data(self, data: bytes) -> None:
        self._decoder.push(data)

    async def step(self) -> list[Effect] | None:
        """Handle the next complete message received; None when more bytes are needed (or closed).
        One message per step, so the transport can write between pipelined messages."""
        if self._state is ConnectionState.CLOSED:
            return None
        try:
            message = self._decoder.next_message()
        except HeadraceError as exc:
            return await self._fatal(exc)
        if message is None:
            return None
        return await self.handle(message)

    def cancel_running(self) -> None:
        """Cancel the statement this connection is executing, if any (e.g. on server shutdown)."""
        if self._running_cancel is not None:
            self._running_cancel.set()

    async def connection_lost(self) -> None:
        self._state = ConnectionState.CLOSED
        self.cancel_running()
        await self._terminate_session()

    async def handle(self, message: messages.FrontendMessage) -> list[Effect]:
        state = self._state
        if state is ConnectionState.CLOSED:
            return [Signal.CLOSE]
        if state is ConnectionState.AWAITING_STARTUP:
            return await self._handle_startup(message)
        if isinstance(message, messages.Terminate):
            await self._terminate_session()
            self._state = ConnectionState.CLOSED
            return [Signal.CLOSE]
        if state is ConnectionState.AWAITING_SYNC:
            return self._sync() if isinstance(message, messages.Sync) else []
        if isinstance(message, _EXTENDED_MESSAGES):
            return await self._handle_extended(message)
        if isinstance(message, messages.Sync):
            return self._sync()
        if isinstance(message, messages.Flush):
            return [Signal.FLUSH]
        if isinstance(message, messages.Query):
            return await self._handle_query(message)
        if isinstance(message, _IGNORED_OUTSIDE_COPY):
            return []
        return await self._fatal(ProtocolViolation(f"unexpected message {type(message).__name__}"))

    # --- startup ----------------------------------------------------------------------------------

    async def _handle_startup(self, message: messages.FrontendMessage) -> list[Effect]:
        if isinstance(message, (messages.SSLRequest, messages.GSSENCRequest)):
            self._out += b"N"  # no encryption: the client goes on with a plain StartupMessage
            return [Signal.FLUSH]
        if isinstance(message, messages.CancelRequest):
            self._state = ConnectionState.CLOSED
            return [CancelRequested(message.process_id, message.secret_key), Signal.CLOSE]
        if not isinstance(message, messages.StartupMessage):
            return await self._fatal(ProtocolViolation(f"unexpected message {type(message).__name__}"))
        try:
            session = await start_session(self._adapter, message, self._out)
        except Exception as exc:
            return await self._fatal(exc)
        self._session = session
        self._extended = ExtendedQueryHandler(session)
        self._state = ConnectionState.READY
        return [Signal.FLUSH]

    # --- queries ----------------------------------------------------------------------------------

    async def _handle_query(self, message: messages.Query) -> list[Effect]:
        session = self._require_session()
        self._running_cancel = asyncio.Event()
        try:
            await run_simple_query(session, message.sql, self._out, self._running_cancel)
        except Exception as exc:
            self._report_error(exc)
        finally:
            self._running_cancel = None
        # PostgreSQL drops the unnamed statement after a simple query; the implicit transaction
        # that wrapped its statements ends like at a Sync.
        self._call_safely(session.close_statement, UNNAMED)
        return self._sync()

    async def _handle_extended(self, message: messages.FrontendMessage) -> list[Effect]:
        extended = self._extended
        assert extended is not None
        self._state = ConnectionState.IN_EXTENDED_BATCH
        try:
            if isinstance(message, messages.Parse):
                await extended.parse(message, self._out)
            elif isinstance(message, messages.Bind):
                extended.bind(message, self._out)
            elif isinstance(message, messages.Describe):
                extended.describe(message, self._out)
            elif isinstance(message, messages.Execute):
                self._running_cancel = asyncio.Event()
                try:
                    await extended.execute(message, self._out, self._running_cancel)
                finally:
                    self._running_cancel = None
            elif isinstance(message, messages.Close):
                extended.close(message, self._out)
        except Exception as exc:
            self._report_error(exc)
            self._state = ConnectionState.AWAITING_SYNC
            return [Signal.FLUSH]  # like PostgreSQL: a client waiting after Flush must see the error
        return []

    def _sync(self) -> list[Effect]:
        session = self._require_session()
        if self._extended is not None:
            self._extended.on_sync()
        self._call_safely(session.on_sync)
        self._out += messages.ready_for_query(session.transaction_status)
        self._state = ConnectionState.READY
        return [Signal.FLUSH]

    # --- errors and shutdown ----------------------------------------------------------------------

    def _report_error(self, exc: BaseException) -> None:
        """ErrorResponse for a statement-level error; the session survives."""
        error = _as_headrace_error(exc)
        self._write_error(error, error.severity)
        if self._session is not None:
            self._call_safely(self._session.on_error)

    def _call_safely(self, method: Callable[..., object], *args: object) -> None:
        """Call a session bookkeeping method; a failure there is reported, not fatal."""
        try:
            method(*args)
        except Exception as exc:
            self._write_error(_as_headrace_error(exc), "ERROR")

    async def _fatal(self, exc: BaseException) -> list[Effect]:
        self._write_error(_as_headrace_error(exc), "FATAL")
        self._state = ConnectionState.CLOSED
        await self._terminate_session()
        return [Signal.CLOSE]

    def _write_error(self, error: HeadraceError, severity: str) -> None:
        self._out += messages.error_response(severity, error.sqlstate, error.message, detail=error.detail,
                                             hint=error.hint, position=error.position)

    async def _terminate_session(self) -> None:
        if self._session is None or self._terminated:
            return
        self._terminated = True
        try:
            await self._session.terminate()
        except Exception:
            logger.exception("terminating session %s failed", self._session.connection_id)

    def _require_session(self) -> SessionClient:
        assert self._session is not None, "a session exists once startup completed"
        return self._session


def _as_headrace_error(exc: BaseException) -> HeadraceError:
    if isinstance(exc, HeadraceError):
        return exc
    logger.error("internal error in pgwire", exc_info=exc)
    return HeadraceError(f"internal error: {type(exc).__name__}: {exc}", sqlstate="XX000")
