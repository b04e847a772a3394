"""The asyncio transport: the only pgwire code that touches sockets.

Per connection: read -> PgConnection (decode + state machine) -> write. A point query arriving while the
connection waits is answered in the read callback itself (PgStreamProtocol), without waking its task. Output is written when an
effect asks (ReadyForQuery, Flush, errors, close) or when more than WRITE_HIGH_WATER bytes are
pending, so a pipelined batch goes out in few writes. Statements run one at a time per connection;
a CancelRequest arrives on its own connection and is passed to adapter.cancel. START_TLS upgrades
the stream in place (asyncio start_tls) after 'S' is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
import ssl

from headrace.errors import HeadraceError
from headrace.pgwire.connection import CancelRequested, ConnectionState, PgConnection, Signal
from headrace.pgwire.interfaces import AdapterClient
from headrace.pgwire.limits import PgLimits, authentication_timeout, idle_session_timeout, too_many_clients
from headrace.pgwire.security import SecurityConfig

logger = logging.getLogger(__name__)

READ_CHUNK_SIZE = 64 * 1024
WRITE_HIGH_WATER = 64 * 1024


async def start_pgwire_server(adapter: AdapterClient, host: str, port: int,
                              security: SecurityConfig | None = None, limits: PgLimits | None = None) -> asyncio.Server:
    """Listen for PostgreSQL clients; close the returned server to stop accepting connections.
    Without `security`: trust on loopback, SCRAM elsewhere (no passwords known), no TLS.
    Without `limits`: PostgreSQL's defaults (pgwire/limits.py)."""

    loop = asyncio.get_running_loop()
    counter = ConnectionCounter()
    chosen = limits if limits is not None else PgLimits()
    # PostgreSQL's backlog is 2 x max_connections (capped by the kernel's somaxconn): asyncio's default of 100
    # makes a burst of connects wait for SYN retransmissions.
    return await loop.create_server(lambda: PgStreamProtocol(adapter, security, chosen, counter), host, port,
                                    backlog=max(128, min(2 * chosen.max_connections, 4096)))


class ConnectionCounter:
    """Connections open on one listening server (authenticated or not), for max_connections."""

    def __init__(self) -> None:
        self.active = 0


class PgStreamProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, plus one shortcut: bytes that arrive while the connection's task waits for
    input and that are exactly one point query the coordinator answers at once (PgConnection.answer_at_once)
    are answered right here, in the event loop's callback, without waking the task. Also the connection's
    timers (authentication and idle-session timeouts) and its place in the connection count."""

    def __init__(self, adapter: AdapterClient, security: SecurityConfig | None, limits: PgLimits | None = None,
                 counter: ConnectionCounter | None = None) -> None:
        super().__init__(asyncio.StreamReader(limit=READ_CHUNK_SIZE), self._serve)
        self._adapter = adapter
        self._security = security
        self.limits = limits if limits is not None else PgLimits()
        self._counter = counter if counter is not None else ConnectionCounter()
        self._counted = False
        self.over_limit = False  # connections beyond max_connections are answered 53300 at startup
        self.last_input = 0.0  # loop time of the latest bytes received, kept only for the idle-session timeout
        self._clock = asyncio.get_running_loop().time if self.limits.idle_session_timeout_s > 0 else None
        self.connection: PgConnection | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.idle = False  # the task waits in reader.read() with nothing buffered: set and cleared by it
        # The serving task's context once its session is open: codecs find the session's TimeZone there
        # (pgwire/types/time_zone.py), so answers given here must run in it too.
        self.context: contextvars.Context | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._counter.active += 1
        self._counted = True
        self.over_limit = self._counter.active > self.limits.max_connections
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self._counter.active -= 1
        if self.connection is not None:
            self.connection.cancel_running()  # a statement whose client is gone must not run on
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:
        # The client closed its side while a statement runs (the connection's task is not reading then): end the
        # statement as PostgreSQL ends a backend whose client went away, instead of running it to its end.
        if self.connection is not None:
            self.connection.cancel_running()
        return super().eof_received()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(self._adapter, reader, writer, self._security, self)

    def data_received(self, data: bytes) -> None:
        if self._clock is not None:
            self.last_input = self._clock()
        connection, writer, context = self.connection, self.writer, self.context
        if (self.idle and connection is not None and writer is not None and context is not None
                and writer.transport.get_write_buffer_size() < WRITE_HIGH_WATER):
            try:
                answered = context.run(connection.answer_at_once, data)
            except Exception:
                logger.exception("answering at once failed; the general path takes the query")
                answered = False
            if answered:
                writer.write(connection.take_output())
                return
        self.idle = False  # the task wakes up for these bytes
        super().data_received(data)


async def serve_connection(adapter: AdapterClient, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter, security: SecurityConfig | None = None,
                           protocol: PgStreamProtocol | None = None) -> None:
    sock = writer.get_extra_info("socket")
    peer_address: str | None = None
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        # Replies are small and latency-bound (ReadyForQuery); never wait for Nagle.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer_address = str(writer.get_extra_info("peername")[0])
    limits = protocol.limits if protocol is not None else PgLimits()
    connection = PgConnection(adapter, security, peer_address, limits.max_message_bytes,
                              too_many_clients() if protocol is not None and protocol.over_limit else None)
    if protocol is not None:
        protocol.connection, protocol.writer = connection, writer
    timers = _ConnectionTimers(connection, writer, limits, protocol)

    async def flush_output() -> None:  # streaming responses (COPY TO, SUBSCRIBE) write as they go
        output = connection.take_output()
        if output:
            writer.write(output)
            await writer.drain()

    async def watch_peer() -> None:  # while a statement streams (SUBSCRIBE): notice the client leaving
        while data := await reader.read(READ_CHUNK_SIZE):
            connection.receive_data(data)
        connection.peer_closed()

    connection.flush_output = flush_output
    connection.watch_peer = watch_peer
    async def next_input() -> bytes:
        if protocol is None:
            return await reader.read(READ_CHUNK_SIZE)
        if protocol.context is None and connection.session is not None:
            protocol.context = contextvars.copy_context()
        protocol.idle = not reader._buffer  # type: ignore[attr-defined]  # asyncio's own buffer: empty means wait
        try:
            return await reader.read(READ_CHUNK_SIZE)
        finally:
            protocol.idle = False

    try:
        while data := await next_input():
            connection.receive_data(data)
            while (effects := await connection.step()) is not None:
                timers.after_step()
                if not effects and connection.pending_output_size < WRITE_HIGH_WATER:
                    continue  # mid-batch (Parse, Bind, ...): nothing to do until Sync or Flush
                if not await _apply_effects(adapter, connection, writer, effects):
                    return
                if Signal.START_TLS in effects:
                    assert security is not None and security.tls is not None
                    try:
                        await writer.start_tls(security.tls)
                    except (ssl.SSLError, ConnectionError) as exc:
                        logger.info("TLS handshake with %s failed: %s", peer_address, exc)
                        return
                    connection.tls_started()
    except ConnectionError:
        pass  # the client went away; its session is terminated below
    except Exception:
        logger.exception("pgwire connection failed")
    finally:
        timers.cancel()
        await connection.connection_lost()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


class _ConnectionTimers:
    """The authentication timeout (armed from the start until authentication completes) and the idle-session
    timeout (armed once authenticated, when configured). Both close the connection with a FATAL error."""

    def __init__(self, connection: PgConnection, writer: asyncio.StreamWriter, limits: PgLimits,
                 protocol: PgStreamProtocol | None) -> None:
        self._connection = connection
        self._writer = writer
        self._limits = limits
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()
        self._auth: asyncio.TimerHandle | None = self._loop.call_later(limits.auth_timeout_s, self._auth_expired)
        self._idle: asyncio.TimerHandle | None = None

    def after_step(self) -> None:
        if self._auth is not None and self._connection.state not in _BEFORE_AUTHENTICATION:
            self._auth.cancel()
            self._auth = None
            if self._limits.idle_session_timeout_s > 0 and self._protocol is not None:
                self._idle = self._loop.call_later(self._limits.idle_session_timeout_s, self._idle_check)

    def cancel(self) -> None:
        for handle in (self._auth, self._idle):
            if handle is not None:
                handle.cancel()
        self._auth = self._idle = None

    def _auth_expired(self) -> None:
        self._auth = None
        if self._connection.state in _BEFORE_AUTHENTICATION:
            self._close(authentication_timeout())

    def _idle_check(self) -> None:
        protocol, timeout = self._protocol, self._limits.idle_session_timeout_s
        assert protocol is not None
        session = self._connection.session
        quiet_for = self._loop.time() - protocol.last_input
        # Idle: the task waits for input with nothing buffered (not running a statement), outside a transaction
        # block, and nothing arrived for the whole timeout (a point query answered in data_received counts).
        if (protocol.idle and quiet_for >= timeout and session is not None and session.transaction_status == "I"
                and self._connection.state is ConnectionState.READY):
            self._idle = None
            self._close(idle_session_timeout())
            return
        self._idle = self._loop.call_later(max(timeout - quiet_for, 0.05) if protocol.idle else timeout,
                                           self._idle_check)

    def _close(self, error: HeadraceError) -> None:
        self._connection.timed_out(error)
        output = self._connection.take_output()
        if output and not self._writer.is_closing():
            self._writer.write(output)
        self._writer.close()  # the serving task's read then ends: it cleans up as for any closed connection


_BEFORE_AUTHENTICATION = (ConnectionState.AWAITING_STARTUP, ConnectionState.AUTHENTICATING)


async def _apply_effects(adapter: AdapterClient, connection: PgConnection, writer: asyncio.StreamWriter,
                         effects: list[Signal | CancelRequested]) -> bool:
    """Carry out one step's effects; False when the connection must close."""
    closing = False
    for effect in effects:
        if isinstance(effect, CancelRequested):
            try:
                adapter.cancel(effect.process_id, effect.secret_key)
            except Exception:
                logger.exception("cancel request failed")
        elif effect is Signal.CLOSE:
            closing = True
    if (closing or Signal.FLUSH in effects or Signal.START_TLS in effects
            or connection.pending_output_size >= WRITE_HIGH_WATER):
        output = connection.take_output()
        if output:
            writer.write(output)
            await writer.drain()
    return not closing
