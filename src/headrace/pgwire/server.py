"""The asyncio transport: the only pgwire code that touches sockets.

Per connection: read -> PgConnection (decode + state machine) -> write. Output is written when an
effect asks (ReadyForQuery, Flush, errors, close) or when more than WRITE_HIGH_WATER bytes are
pending, so a pipelined batch goes out in few writes. Statements run one at a time per connection;
a CancelRequest arrives on its own connection and is passed to adapter.cancel. START_TLS upgrades
the stream in place (asyncio start_tls) after 'S' is written.
"""

from __future__ import annotations

import asyncio
import contextlib
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

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(adapter, reader, writer, security)

    return await asyncio.start_server(on_client, host, port)


async def serve_connection(adapter: AdapterClient, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter, security: SecurityConfig | None = None) -> None:
    sock = writer.get_extra_info("socket")
    peer_address: str | None = None
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        # Replies are small and latency-bound (ReadyForQuery); never wait for Nagle.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer_address = str(writer.get_extra_info("peername")[0])
    connection = PgConnection(adapter, security, peer_address)

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
    try:
        while data := await reader.read(READ_CHUNK_SIZE):
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
