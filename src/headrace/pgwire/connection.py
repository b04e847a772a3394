"""The per-connection protocol state machine (sans-I/O).

Input: bytes (`receive_data`) or decoded frontend messages (`handle`). Output: backend bytes in an
out buffer (`take_output`) plus effects telling the transport what to do: FLUSH (write the buffer
now), CLOSE (write it, then close) or CancelRequested (call adapter.cancel). It awaits the
coordinator but never touches a socket.

States are routed first, then messages:
  AWAITING_STARTUP --SSLRequest (TLS configured)--> 'S', effect START_TLS, still AWAITING_STARTUP
  AWAITING_STARTUP --StartupMessage--> AUTHENTICATING (password / SCRAM 'p' messages) --> READY
  AWAITING_STARTUP --StartupMessage (trust)--> READY --Parse/Bind/...--> IN_EXTENDED_BATCH --Sync--> READY
  an extended-protocol error --> AWAITING_SYNC (discard all but Sync) --Sync--> READY
  Terminate, a FATAL error or a CancelRequest --> CLOSED
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from headrace.cancel import CancelSignal
from headrace.errors import HeadraceError, ProtocolViolation
from headrace.pgwire import messages
from headrace.pgwire.copy import CopyIn, Flush
from headrace.pgwire.direct_lane import answer_bound_group, answer_simple_query
from headrace.pgwire.messages.frontend import peek_bound_group, peek_query
from headrace.pgwire.extended_query import ExtendedQueryHandler
from headrace.pgwire.auth import AuthMethod, Handshake, choose_method, make_handshake, rejection
from headrace.pgwire.interfaces import AdapterClient, SessionClient
from headrace.pgwire.limits import DEFAULT_MAX_MESSAGE_BYTES
from headrace.pgwire.results import WatchPeer
from headrace.pgwire.security import SecurityConfig
from headrace.pgwire.simple_query import UNNAMED, run_simple_query
from headrace.pgwire.startup import StartupRequest, check_startup, open_session

logger = logging.getLogger(__name__)


class ConnectionState(enum.Enum):
    AWAITING_STARTUP = "awaiting_startup"
    AUTHENTICATING = "authenticating"  # a password or SCRAM exchange is under way
    READY = "ready"
    IN_EXTENDED_BATCH = "in_extended_batch"
    AWAITING_SYNC = "awaiting_sync"  # after an extended-protocol error: discard until Sync
    COPY_IN = "copy_in"  # COPY FROM STDIN: CopyData until CopyDone / CopyFail (pgwire/copy.py)
    CLOSED = "closed"


class Signal(enum.Enum):
    FLUSH = "flush"  # write the out buffer now: the client waits for it (ReadyForQuery, Flush, errors)
    CLOSE = "close"  # write the out buffer, then close the connection
    START_TLS = "start_tls"  # write the out buffer ('S'), then run the TLS handshake, then tls_started()


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """A CancelRequest arrived on this (fresh) connection: cancel that other session's statement."""

    process_id: int
    secret_key: int


Effect = Signal | CancelRequested

_EXTENDED_MESSAGES = (messages.Parse, messages.Bind, messages.Describe, messages.Execute, messages.Close)
_EXTENDED_DISPATCH: dict[type, str] = {messages.Parse: "parse", messages.Bind: "bind", messages.Describe: "describe",
                                        messages.Execute: "execute", messages.Close: "close"}
_IGNORED_OUTSIDE_COPY = (messages.CopyData, messages.CopyDone, messages.CopyFail)  # as PostgreSQL does


class PgConnection:
    def __init__(self, adapter: AdapterClient, security: SecurityConfig | None = None,
                 peer_address: str | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 refusal: HeadraceError | None = None) -> None:
        """`peer_address`: the client's IP address (None for a Unix socket), for the auth rules.
        `max_message_bytes`: the longest message accepted once authenticated (pgwire/limits.py).
        `refusal`: the FATAL error to answer the startup packet with (e.g. 53300, too many clients)."""
        self._adapter = adapter
        self._max_message_bytes = max_message_bytes
        self._refusal = refusal
        self._security = security if security is not None else SecurityConfig()
        self._peer_address = peer_address
        self._tls_active = False
        self._startup: StartupRequest | None = None
        self._handshake: Handshake | None = None
        self._decoder = messages.FrontendDecoder()
        self._out = bytearray()
        self._state = ConnectionState.AWAITING_STARTUP
        self._session: SessionClient | None = None
        self._extended: ExtendedQueryHandler | None = None
        self._running_cancel: asyncio.Event | None = None  # set by cancel_running()
        self._idle_cancel: asyncio.Event | None = None  # reused by _cancel_event() until set
        self._terminated = False
        self._copy_in: CopyIn | None = None
        # Set by the transport: write the out buffer now. COPY TO uses it to stream mid-statement.
        self.flush_output: Flush | None = None
        # Set by the transport: read from the client until it goes away (calling peer_closed), while a
        # statement streams (bare SUBSCRIBE) and nothing else reads.
        self.watch_peer: WatchPeer | None = None

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

    @property
    def tls_active(self) -> bool:
        return self._tls_active

    def receive_data(self, data: bytes) -> None:
        self._decoder.push(data)

    def answer_at_once(self, data: bytes) -> bool:
        """`data` (just received, nothing else pending) is exactly one point query the coordinator answers
        without waiting (pgwire/direct_lane.py): its whole response is in the out buffer and True returned,
        without a step. False: nothing changed; receive_data and step as usual."""
        if self._state is not ConnectionState.READY or self._decoder.buffered_size or len(data) < 6:
            return False
        session = self._session
        assert session is not None
        if data[0] == 0x51:  # 'Q'
            query = peek_query(data)
            return query is not None and answer_simple_query(session, query.sql, self._out)
        group = peek_bound_group(data)
        return group is not None and group.size == len(data) and answer_bound_group(session, group, self._out)

    def timed_out(self, error: HeadraceError) -> None:
        """The transport closes the connection for a timeout: `error` (FATAL) goes out first, if the client is past
        its startup packet (before it, PostgreSQL closes without a word)."""
        if self._state is not ConnectionState.AWAITING_STARTUP:
            self._write_error(error, "FATAL")
        self._state = ConnectionState.CLOSED

    def tls_started(self) -> None:
        """The transport finished the TLS handshake that START_TLS asked for."""
        self._tls_active = True

    async def step(self) -> list[Effect] | None:
        """Handle the next complete message received; None when more bytes are needed (or closed).
        One message per step, so the transport can write between pipelined messages."""
        state = self._state
        if state is ConnectionState.CLOSED:
            return None
        if state is ConnectionState.READY:
            group = self._decoder.peek_bound_group()
            if group is not None and answer_bound_group(self._require_session(), group, self._out):
                self._decoder.skip(group.size)
                return [Signal.FLUSH]
        try:
            message = self._decoder.next_message()
        except HeadraceError as exc:
            return await self._fatal(exc)
        if message is None:
            return None
        return await self.handle(message)

    def peer_closed(self) -> None:
        """The client's end of input while a statement streams: cancel it (the transport closes after)."""
        self.cancel_running()

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
        if state is ConnectionState.READY or state is ConnectionState.IN_EXTENDED_BATCH:
            # The per-query path: one dict lookup instead of the isinstance chain below.
            kind = type(message)
            if kind is messages.Sync:
                return self._sync()
            extended = _EXTENDED_DISPATCH.get(kind)
            if extended is not None:
                return await self._handle_extended(message, extended)
        if state is ConnectionState.CLOSED:
            return [Signal.CLOSE]
        if state is ConnectionState.AWAITING_STARTUP:
            return await self._handle_startup(message)
        if state is ConnectionState.AUTHENTICATING:
            return await self._handle_authentication(message)
        if isinstance(message, messages.Terminate):
            await self._terminate_session()
            self._state = ConnectionState.CLOSED
            return [Signal.CLOSE]
        if state is ConnectionState.COPY_IN:
            return await self._handle_copy_in(message)
        if state is ConnectionState.AWAITING_SYNC:
            return self._sync() if isinstance(message, messages.Sync) else []
        if isinstance(message, _EXTENDED_MESSAGES):
            return await self._handle_extended(message, _EXTENDED_DISPATCH[type(message)])
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
        if isinstance(message, messages.SSLRequest) and self._security.tls is not None and not self._tls_active:
            if self._decoder.buffered_size:
                # Bytes sent before the handshake would be trusted as if encrypted (CVE-2021-23214).
                return await self._fatal(ProtocolViolation("received unencrypted data after SSL request"))
            self._out += b"S"
            return [Signal.START_TLS]
        if isinstance(message, (messages.SSLRequest, messages.GSSENCRequest)):
            self._out += b"N"  # no encryption: the client goes on with a plain StartupMessage
            return [Signal.FLUSH]
        if isinstance(message, messages.CancelRequest):
            self._state = ConnectionState.CLOSED
            return [CancelRequested(message.process_id, message.secret_key), Signal.CLOSE]
        if not isinstance(message, messages.StartupMessage):
            return await self._fatal(ProtocolViolation(f"unexpected message {type(message).__name__}"))
        try:
            request = check_startup(message, self._out)
        except Exception as exc:
            return await self._fatal(exc)
        if self._refusal is not None:  # over the connection limit: said once the startup packet is read, as PostgreSQL
            return await self._fatal(self._refusal)
        method = choose_method(self._security.auth_rules, request.user, self._peer_address, self._tls_active)
        if method is AuthMethod.TRUST:
            return await self._open_session(request)
        if method is AuthMethod.REJECT:
            return await self._fatal(rejection(request.user, self._peer_address, self._tls_active, request.database))
        self._startup = request
        self._handshake = make_handshake(method, request.user, self._security.credentials)
        self._out += self._handshake.start()
        self._state = ConnectionState.AUTHENTICATING
        return [Signal.FLUSH]

    async def _handle_authentication(self, message: messages.FrontendMessage) -> list[Effect]:
        if isinstance(message, messages.Terminate):  # the client gave up (e.g. psql asks for a password)
            self._state = ConnectionState.CLOSED
            return [Signal.CLOSE]
        if not isinstance(message, messages.PasswordMessage):
            return await self._fatal(ProtocolViolation(
                f"expected password response, got message type {type(message).__name__}"))
        assert self._handshake is not None and self._startup is not None
        try:
            reply, authenticated = self._handshake.receive(message.payload)
        except Exception as exc:
            return await self._fatal(exc)
        self._out += reply
        if not authenticated:
            return [Signal.FLUSH]
        self._handshake = None
        return await self._open_session(self._startup)

    async def _open_session(self, request: StartupRequest) -> list[Effect]:
        try:
            session = await open_session(self._adapter, request, self._out)
        except Exception as exc:
            return await self._fatal(exc)
        self._session = session
        self._extended = ExtendedQueryHandler(session)
        self._decoder.authenticated(self._max_message_bytes)
        self._state = ConnectionState.READY
        return [Signal.FLUSH]

    # --- queries ----------------------------------------------------------------------------------

    async def _handle_query(self, message: messages.Query) -> list[Effect]:
        session = self._require_session()
        if answer_simple_query(session, message.sql, self._out):
            return [Signal.FLUSH]
        self._running_cancel = self._cancel_event()
        try:
            copy_in = await run_simple_query(session, message.sql, self._out, self._running_cancel, self.flush_output,
                                             self.watch_peer)
            if copy_in is not None:
                return self._enter_copy_in(copy_in)
        except Exception as exc:
            self._report_error(exc)
        finally:
            self._running_cancel = None
        # PostgreSQL drops the unnamed statement after a simple query; the implicit transaction
        # that wrapped its statements ends like at a Sync.
        self._call_safely(session.close_statement, UNNAMED)
        return self._sync()

    async def _handle_extended(self, message: messages.FrontendMessage, kind: str) -> list[Effect]:
        extended = self._extended
        assert extended is not None
        self._state = ConnectionState.IN_EXTENDED_BATCH
        out = self._out
        try:
            if kind == "execute":
                cancel = self._cancel_event()
                self._running_cancel = cancel
                try:
                    copy_in = await extended.execute(message, out, cancel, self.flush_output,  # type: ignore[arg-type]
                                                     self.watch_peer)
                    if copy_in is not None:
                        return self._enter_copy_in(copy_in)
                finally:
                    self._running_cancel = None
            elif kind == "bind":
                extended.bind(message, out)  # type: ignore[arg-type]
            elif kind == "parse":
                await extended.parse(message, out)  # type: ignore[arg-type]
            elif kind == "describe":
                extended.describe(message, out)  # type: ignore[arg-type]
            else:
                extended.close(message, out)  # type: ignore[arg-type]
        except Exception as exc:
            self._report_error(exc)
            self._state = ConnectionState.AWAITING_SYNC
            return [Signal.FLUSH]  # like PostgreSQL: a client waiting after Flush must see the error
        return []

    def _cancel_event(self) -> asyncio.Event:
        """The event a CancelRequest sets for the next statement: one per connection, replaced only once
        set (a cancel that arrived after its statement ended must not cancel the next one)."""
        event = self._idle_cancel
        if event is None or event.is_set():
            event = self._idle_cancel = CancelSignal()
        return event

    # --- COPY FROM STDIN ---------------------------------------------------------------------------

    def _enter_copy_in(self, copy_in: CopyIn) -> list[Effect]:
        self._copy_in = copy_in
        self._state = ConnectionState.COPY_IN
        return [Signal.FLUSH]  # CopyInResponse: the client sends its data now

    async def _handle_copy_in(self, message: messages.FrontendMessage) -> list[Effect]:
        """CopyData accumulates; CopyDone inserts; CopyFail or any other message aborts the COPY.
        Flush and Sync are ignored meanwhile, as PostgreSQL does."""
        copy_in = self._copy_in
        session = self._require_session()
        assert copy_in is not None
        if isinstance(message, (messages.Flush, messages.Sync)):
            return []
        try:
            if isinstance(message, messages.CopyData):
                copy_in.receive(message.data)
                return []
            if isinstance(message, messages.CopyFail):
                if copy_in.response.relay:  # the store PostgreSQL ends its COPY with its own error
                    await session.relay_copy(copy_in.response, None, message.message)
                raise CopyIn.failed(message.message)
            if not isinstance(message, messages.CopyDone):
                raise ProtocolViolation(f"unexpected message {type(message).__name__} during COPY from stdin")
            self._running_cancel = CancelSignal()
            try:
                if copy_in.response.relay:  # the store PostgreSQL's relation: its COPY parses the data
                    result = await session.relay_copy(copy_in.response, bytes(copy_in.buffer))
                else:
                    result = await session.insert_rows(copy_in.response, copy_in.rows(), self._running_cancel)
            finally:
                self._running_cancel = None
            self._out += messages.command_complete(result.tag)
        except Exception as exc:
            self._copy_in = None
            self._report_error(exc)
            if copy_in.extended:
                self._state = ConnectionState.AWAITING_SYNC
                return [Signal.FLUSH]
            self._call_safely(session.close_statement, UNNAMED)
            return self._sync()
        self._copy_in = None
        if copy_in.extended:
            self._state = ConnectionState.IN_EXTENDED_BATCH
            return []
        self._state = ConnectionState.READY
        if copy_in.remaining_sql and copy_in.remaining_sql.strip():
            # The rest of the simple Query that held the COPY.
            return await self._handle_query(messages.Query(copy_in.remaining_sql))
        self._call_safely(session.close_statement, UNNAMED)
        return self._sync()

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
