"""The HTTP port's front: an asyncio.Protocol that answers plain webhook POSTs itself and hands
every other connection to aiohttp, with the connection.

Why: aiohttp spends more CPU per request than durability does; the webhook hot path needs a
request head parsed (httptools), a body sliced out, the rows queued for the group commit and, once
durable, a constant 200 written: no Request/Response objects, no task per request.

Handled here: POST (or another method: 405) to /api/webhook/{db}/{schema}/{name} with a
Content-Length or chunked body, keep-alive, pipelined requests answered in order. Everything else
(/api/sql, /metrics, WebSocket upgrades, Content-Encoding, Expect: 100-continue, HTTP/1.0 oddities,
malformed heads) is handed off: aiohttp's protocol is created from the runner's `web.Server`, gets
`connection_made(transport)` and the raw bytes from the first byte of the current request on, and
becomes the transport's protocol. A hand-off waits until every response of ours on the connection
is written, so answers stay in request order; from then on aiohttp owns the connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from aiohttp import web

from headrace.http.framing import (
    MAX_HEAD_BYTES,
    BadFraming,
    ChunkedDecoder,
    RequestHead,
    ResponseWriter,
    TooLarge,
    find_head_end,
    parse_head,
)
from headrace.http.webhook_endpoint import Reply, WebhookEndpoint
from headrace.webhook.ingest import SourceIngestor

log = logging.getLogger(__name__)

MAX_PIPELINED = 64  # responses pending on one connection before it stops reading
READ_BUFFER_BYTES = 64 << 10
SHUTDOWN_GRACE_S = 10.0


class _Slot:
    """One request's place in the connection's response order."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | None = None) -> None:
        self.data = data


class FastIngestProtocol(asyncio.BufferedProtocol):
    """A BufferedProtocol: the transport reads into one buffer shared by every connection of the
    front (get_buffer, recv_into and buffer_updated run back to back in the loop's thread), where a
    plain Protocol would get a fresh 256 KiB allocation per read, which costs more CPU than a small
    request's whole parsing. `data_received` takes bytes directly (tests feed it)."""

    def __init__(self, endpoint: WebhookEndpoint, hand_off_factory: Callable[[], asyncio.BaseProtocol],
                 writer: ResponseWriter, connections: set[FastIngestProtocol] | None = None,
                 read_buffer: memoryview | None = None) -> None:
        self._endpoint = endpoint
        self._hand_off_factory = hand_off_factory
        self._writer = writer
        self._connections = connections
        self._max_body = endpoint.settings.max_body_bytes
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._start = 0  # where the first request not yet dispatched begins in _buffer
        self._head: RequestHead | None = None  # of that request, once its head is in
        self._chunked: ChunkedDecoder | None = None  # its body's decoder, kept across reads
        self._body_start = 0
        self._received_at_us = 0
        self._started = 0.0
        self._slots: collections.deque[_Slot] = collections.deque()
        self._close_after_writes = False  # stop reading; close once every pending response is out
        self._hand_off_pending = False
        self._handed_off = False
        self._reading_paused = False
        self._writing_paused = False
        self._lost = False
        self._eof = False
        self._read_buffer = read_buffer if read_buffer is not None else memoryview(bytearray(READ_BUFFER_BYTES))

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport subclasses
        if self._connections is not None:
            self._connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._read_buffer[:nbytes])  # copied into this connection's buffer there

    def data_received(self, data: bytes | memoryview) -> None:
        if self._close_after_writes:
            return  # no more requests are read on this connection
        if self._buffer:
            self._buffer += data  # kept while a hand-off waits: aiohttp gets them
        else:
            self._buffer = bytearray(data)
        if not self._hand_off_pending:
            self._process()

    def eof_received(self) -> bool:
        # The client sent everything: answer what is pending, then close (or tell aiohttp).
        self._eof = True
        if not self._hand_off_pending:
            self._close_after_writes = True
        self._flush()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._connections is not None:
            self._connections.discard(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    # -- shutdown ----------------------------------------------------------------------------------
    def shut_down(self) -> None:
        """Stop reading requests; close once the pending responses are written."""
        if not self._handed_off:
            self._close_after_writes = True
            self._flush()

    @property
    def idle(self) -> bool:
        return not self._slots

    # -- requests ----------------------------------------------------------------------------------
    def _process(self) -> None:
        while not (self._close_after_writes or self._hand_off_pending or self._throttled()):
            if not self._next_request():
                break
        if self._start and self._start == len(self._buffer):
            self._buffer = bytearray()
            self._start = 0
            self._body_start = 0
        elif self._start > 65536:
            del self._buffer[:self._start]
            self._body_start -= self._start
            self._start = 0
        self._update_reading()

    def _throttled(self) -> bool:
        return len(self._slots) >= MAX_PIPELINED or self._writing_paused

    def _next_request(self) -> bool:
        """Dispatch the request at _start if it is complete; False when more bytes are needed (or
        the connection is now handed off or closing)."""
        buffer = self._buffer
        if len(buffer) == self._start:
            return False
        head = self._head
        if head is None:
            if buffer.startswith(b"\r\n", self._start):
                self._hand_off()
                return False
            head_end = find_head_end(buffer, self._start)
            if head_end < 0:
                if len(buffer) - self._start > MAX_HEAD_BYTES:
                    self._hand_off()
                return False
            self._received_at_us = time.time_ns() // 1000  # arrival (seed 002's now()), before the body
            self._started = time.perf_counter()
            head = parse_head(bytes(buffer[self._start:head_end]))
            if head is None:
                self._hand_off()
                return False
            self._head = head
            self._body_start = head_end
        if head.chunked:
            if self._chunked is None:
                self._chunked = ChunkedDecoder(self._max_body)
            try:
                decoded = self._chunked.feed(buffer, self._body_start)
            except TooLarge:
                self._refuse_too_large(head)
                return False
            except BadFraming as error:
                self._refuse(Reply(400, f"invalid chunked body: {error}"))
                return False
            if decoded is None:
                return False
            body, end = decoded
        else:
            length = head.content_length or 0
            if length > self._max_body:
                self._refuse_too_large(head)
                return False
            end = self._body_start + length
            if len(buffer) < end:
                return False
            body = bytes(buffer[self._body_start:end])
        self._head = None
        self._chunked = None
        self._start = end
        if not head.keep_alive:
            self._close_after_writes = True
        self._dispatch(head, body)
        return True

    def _dispatch(self, head: RequestHead, body: bytes) -> None:
        endpoint = self._endpoint
        received_at_us, started = self._received_at_us, self._started
        database, schema, name = head.segments
        try:
            admitted = endpoint.admit(head.method, database, schema, name, len(body), received_at_us, started)
            if isinstance(admitted, Reply):
                self._answer(admitted)
                return
            slot = _Slot()
            settled = partial(self._durable, slot, admitted, received_at_us, len(body), started)
            try:
                headers = head.header_map if head.header_map is not None else head.headers
                outcome = endpoint.submit_then(admitted, headers, body, received_at_us, started, settled)
            except BaseException:
                endpoint.release(admitted)
                raise
        except Exception:  # a bug: answer 500 as aiohttp would, and keep serving others
            log.exception("webhook request failed")
            self._answer(Reply(500, "internal server error"), close=True)
            return
        if outcome is not None:
            endpoint.release(admitted)
            self._answer(outcome)
            return
        self._slots.append(slot)  # before `settled` can run: that is a later turn of the loop

    def _durable(self, slot: _Slot, ingestor: SourceIngestor, received_at_us: int, size: int, started: float,
                 offsets: list[int] | None, error: BaseException | None) -> None:
        endpoint = self._endpoint
        endpoint.release(ingestor)
        close = False
        try:
            if error is None:
                assert offsets is not None
                reply = endpoint.accepted(ingestor, len(offsets), received_at_us, size, started)
            else:
                reply = endpoint.failed(ingestor, error, received_at_us, size, started)
        except BaseException:  # noqa: BLE001 - a bug (or a cancelled future): answer 500, do not hang
            log.exception("webhook request failed")
            reply, close = Reply(500, "internal server error"), True
        if close:
            self._close_after_writes = True
        slot.data = self._writer.render(reply, close=self._close_after_writes and slot is self._slots[-1])
        self._flush()
        if self._buffer and not self._throttled():
            self._process()  # requests read while throttled

    def _answer(self, reply: Reply, *, close: bool = False) -> None:
        if close:
            self._close_after_writes = True
        self._slots.append(_Slot(self._writer.render(reply, close=self._close_after_writes)))
        self._flush()

    def _refuse(self, reply: Reply) -> None:
        """An answer after which the request's framing is lost: the connection closes."""
        self._head = None
        self._chunked = None
        self._close_after_writes = True
        self._answer(reply)

    def _refuse_too_large(self, head: RequestHead) -> None:
        endpoint = self._endpoint
        database, schema, name = head.segments
        admitted = endpoint.admit(head.method, database, schema, name, None, self._received_at_us, self._started)
        if not isinstance(admitted, Reply):
            endpoint.release(admitted)
            admitted = endpoint.too_large(admitted, self._received_at_us, self._started)
        self._refuse(admitted)

    def _flush(self) -> None:
        """Write the answers that are ready, in request order; then close or hand off if due."""
        slots = self._slots
        transport = self._transport
        if transport is None:
            return
        ready: list[bytes] = []
        while slots and slots[0].data is not None:
            data = slots.popleft().data
            assert data is not None
            ready.append(data)
        if ready and not self._lost:
            transport.write(ready[0] if len(ready) == 1 else b"".join(ready))
        if slots:
            return
        if self._hand_off_pending:
            self._do_hand_off()
        elif self._close_after_writes:
            transport.close()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self._lost or self._handed_off:
            return
        should_pause = self._throttled() or self._hand_off_pending or self._close_after_writes
        if should_pause and not self._reading_paused:
            self._reading_paused = True
            with contextlib.suppress(RuntimeError):
                transport.pause_reading()
        elif not should_pause and self._reading_paused:
            self._reading_paused = False
            with contextlib.suppress(RuntimeError):
                transport.resume_reading()

    # -- hand-off to aiohttp -----------------------------------------------------------------------
    def _hand_off(self) -> None:
        self._hand_off_pending = True
        self._update_reading()
        if not self._slots:
            self._do_hand_off()

    def _do_hand_off(self) -> None:
        transport = self._transport
        assert transport is not None
        self._hand_off_pending = False
        self._handed_off = True
        if self._connections is not None:
            self._connections.discard(self)
        if self._lost:
            return
        data = bytes(self._buffer[self._start:])
        self._buffer = bytearray()
        protocol: Any = self._hand_off_factory()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if data:
            protocol.data_received(data)
        if self._eof:
            protocol.eof_received()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()


class HttpFront:
    """The listening socket (fast path in front of aiohttp) and the aiohttp runner behind it."""

    def __init__(self, server: asyncio.AbstractServer, runner: web.AppRunner,
                 connections: set[FastIngestProtocol]) -> None:
        self._server = server
        self._runner = runner
        self._connections = connections

    @property
    def addresses(self) -> list[Any]:
        return [sock.getsockname() for sock in self._server.sockets]

    async def cleanup(self) -> None:
        """Stop listening, let the answers already owed go out, close; then stop aiohttp."""
        self._server.close()
        for connection in list(self._connections):
            connection.shut_down()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while self._connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self._runner.cleanup()


# How long a thread that wants the GIL waits before the holder is asked to drop it (CPython's
# default: 5 ms). The event loop shares the GIL with the group-commit and dedupe-flush threads;
# the flusher runs Python for a few ms per transaction, and with 5 ms every such stretch could hold
# the loop, and the acks waiting on it, for up to 5 ms.
GIL_SWITCH_INTERVAL_S = 0.001
_DEFAULT_SWITCH_INTERVAL_S = 0.005


def tune_interpreter_for_latency() -> None:
    """Process-wide settings for a server that acknowledges requests in milliseconds:
    - the GIL switch interval above (unless someone chose one on purpose);
    - gc.freeze(): what exists at start-up (modules, compiled plans, the catalog so far: most of
      the heap) moves to the collector's permanent generation. A full collection walks the whole
      heap with the GIL held, and requests in flight promote enough objects to start one every few
      seconds under load: 50-100 ms stalls of the event loop, the p99 at moderate rates, before this.
      Frozen objects are still freed when their reference count drops; only cycles among them
      would never be collected, so the garbage there is collected first, once per process."""
    global _interpreter_tuned
    if _interpreter_tuned:
        return
    _interpreter_tuned = True
    if sys.getswitchinterval() == _DEFAULT_SWITCH_INTERVAL_S:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    gc.collect()
    gc.freeze()


_interpreter_tuned = False


async def start_front(endpoint: WebhookEndpoint, runner: web.AppRunner, host: str, port: int) -> HttpFront:
    """Listen on host:port; `runner` (set up, with no site) serves what the fast path hands off."""
    aiohttp_server = runner.server
    assert aiohttp_server is not None, "runner.setup() first"
    tune_interpreter_for_latency()
    connections: set[FastIngestProtocol] = set()
    writer = ResponseWriter()
    read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))  # shared: reads never interleave in one loop
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: FastIngestProtocol(endpoint, aiohttp_server, writer, connections, read_buffer), host, port,
        backlog=1024)
    return HttpFront(server, runner, connections)
