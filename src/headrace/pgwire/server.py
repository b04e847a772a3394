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

from headrace.pgwire.connection import CancelRequested, PgConnection, Signal
from headrace.pgwire.interfaces import AdapterClient
from headrace.pgwire.security import SecurityConfig

logger = logging.getLogger(__name__)

READ_CHUNK_SIZE = 64 * 1024
WRITE_HIGH_WATER = 64 * 1024


async def start_pgwire_server(adapter: AdapterClient, host: str, port: int,
                              security: SecurityConfig | None = None) -> asyncio.Server:
    """Listen for PostgreSQL clients; close the returned server to stop accepting connections.
    Without `security`: trust on loopback, SCRAM elsewhere (no passwords known), no TLS."""

    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: PgStreamProtocol(adapter, security), host, port)


class PgStreamProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, plus one shortcut: bytes that arrive while the connection's task waits for
    input and that are exactly one point query the coordinator answers at once (PgConnection.answer_at_once)
    are answered right here, in the event loop's callback, without waking the task."""

    def __init__(self, adapter: AdapterClient, security: SecurityConfig | None) -> None:
        super().__init__(asyncio.StreamReader(limit=READ_CHUNK_SIZE), self._serve)
        self._adapter = adapter
        self._security = security
        self.connection: PgConnection | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.idle = False  # the task waits in reader.read() with nothing buffered: set and cleared by it
        # The serving task's context once its session is open: codecs find the session's TimeZone there
        # (pgwire/types/time_zone.py), so answers given here must run in it too.
        self.context: contextvars.Context | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(self._adapter, reader, writer, self._security, self)

    def data_received(self, data: bytes) -> None:
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
    connection = PgConnection(adapter, security, peer_address)
    if protocol is not None:
        protocol.connection, protocol.writer = connection, writer

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
        await connection.connection_lost()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


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
