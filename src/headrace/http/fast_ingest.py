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
from headrace.http.settings import HttpSettings
from headrace.http.webhook_endpoint import Reply, WebhookEndpoint
from headrace.webhook.ingest import SourceIngestor

log = logging.getLogger(__name__)

MAX_PIPELINED = 64  # responses pending on one connection before it stops reading
READ_BUFFER_BYTES = 64 << 10
SHUTDOWN_GRACE_S = 10.0
NO_DEADLINE = float("inf")
REQUEST_TIMEOUT = Reply(408, "request timed out")


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
                 read_buffer: memoryview | None = None, settings: HttpSettings | None = None) -> None:
        self._endpoint = endpoint
        self._settings = settings or HttpSettings()
        self._hand_off_factory = hand_off_factory
        self._writer = writer
        self._connections = connections
        self._max_body = endpoint.settings.max_body_bytes
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._start = 0  # where the first request not yet dispatched begins in _buffer
        self._head: RequestHead | None = None  # of that request, once its head is in
        self._chunked: ChunkedDecoder | None = None  # its body's decoder, kept across reads
        # Admitted (counted in flight) as soon as its head is in, so the concurrency limit bounds the
        # bodies being buffered, not only those being written.
        self._admitted: SourceIngestor | None = None
        self._skip = 0  # body bytes still to discard: of a request answered before its body was read
        self._held_bytes = 0  # bodies of this connection's requests awaiting durability
        self._head_since = 0.0  # when the first byte of the head being read arrived (0: none yet)
        self._served_a_head = False  # keepalive_timeout applies between requests; before the first, the head's
        self.deadline = NO_DEADLINE  # monotonic time when the connection times out (HttpFront sweeps)
        self._timeout_reply: Reply | None = None  # what a timeout answers (None: close silently)
        self._lingering = False  # answered and half-closed; reading and discarding until the client closes
        self._linger_bytes = 0
        self._linger_until = NO_DEADLINE
        self._body_start = 0
        self._received_at_us = 0
        self._started = 0.0
        self._slots: collections.deque[_Slot] = collections.deque()
        self._close_after_writes = False  # stop reading; close once every pending response is out
        self._linger_on_close = False
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
        self._arm()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._read_buffer[:nbytes])  # copied into this connection's buffer there

    def data_received(self, data: bytes | memoryview) -> None:
        if self._lingering:
            self._linger_bytes += len(data)
            if self._linger_bytes > self._settings.lingering_max_bytes:
                self._abort()
            else:
                self.deadline = min(self._linger_until, time.monotonic() + self._settings.lingering_timeout_s)
            return
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
        if self._lingering:
            return False  # the client is done too: close
        if not self._hand_off_pending:
            self._close_after_writes = True
        self._flush()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.deadline = NO_DEADLINE
        self._release_admitted()
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
        if self._lingering:
            self._abort()
        elif not self._handed_off:
            self._close_after_writes = True
            self._flush()

    @property
    def idle(self) -> bool:
        return not self._slots

    # -- timeouts (nginx's client_header_timeout, client_body_timeout, keepalive_timeout) ----------
    def _arm(self) -> None:
        """Set the deadline for what the connection waits on now: the client's next request (idle),
        the rest of a head, the next read of a body; none while it waits on us."""
        if self._lingering or self._handed_off or self._lost:
            return
        settings = self._settings
        if self._slots or self._close_after_writes or self._hand_off_pending:
            self.deadline, self._timeout_reply = NO_DEADLINE, None
        elif self._head is not None or self._skip:
            self.deadline = time.monotonic() + settings.body_timeout_s
            self._timeout_reply = REQUEST_TIMEOUT
        elif len(self._buffer) > self._start:
            if not self._head_since:
                self._head_since = time.monotonic()
            self.deadline = self._head_since + settings.header_timeout_s
            self._timeout_reply = REQUEST_TIMEOUT
        else:
            self._head_since = 0.0
            # A connection that never sent a request waits no longer than a head may take (nginx's
            # client_header_timeout starts at accept): idle sockets cannot pile up for keepalive_timeout.
            waiting = settings.keepalive_timeout_s if self._served_a_head else settings.header_timeout_s
            self.deadline = time.monotonic() + waiting
            self._timeout_reply = None

    def time_out(self) -> None:
        """The deadline passed: answer 408 if a request was under way, and close."""
        self.deadline = NO_DEADLINE
        if self._lingering or self._timeout_reply is None:
            self._abort() if self._lingering else self._close_now()
            return
        self._buffer = bytearray()
        self._start = 0
        self._refuse(self._timeout_reply, linger=False)

    def _close_now(self) -> None:
        if self._transport is not None and not self._lost:
            self._transport.close()

    def _abort(self) -> None:
        self.deadline = NO_DEADLINE
        if self._transport is not None and not self._lost:
            self._transport.abort()

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
        self._arm()

    def _throttled(self) -> bool:
        # Per connection: at most MAX_PIPELINED answers owed, and no new body read while the bodies
        # awaiting durability already weigh a full body's limit.
        return len(self._slots) >= MAX_PIPELINED or self._writing_paused or self._held_bytes >= self._max_body

    def _next_request(self) -> bool:
        """Dispatch the request at _start if it is complete; False when more bytes are needed (or
        the connection is now handed off or closing)."""
        buffer = self._buffer
        if len(buffer) == self._start:
            return False
        if self._skip:
            skipped = min(self._skip, len(buffer) - self._start)
            self._skip -= skipped
            self._start += skipped
            return not self._skip
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
            self._head_since = 0.0
            if not self._admit(head, head_end):
                return not self._close_after_writes
            self._head = head
            self._served_a_head = True
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

    def _admit(self, head: RequestHead, head_end: int) -> bool:
        """Admit the request whose head just arrived, before its body is read; False when it was
        answered at once (its Content-Length body is then skipped unread; a chunked one, or one over
        the limit, closes the connection)."""
        database, schema, name = head.segments
        try:
            admitted = self._endpoint.admit(head.method, database, schema, name, head.content_length,
                                            self._received_at_us, self._started)
        except Exception:  # a bug: answer 500 as aiohttp would, and keep serving others
            log.exception("webhook request failed")
            admitted = Reply(500, "internal server error")
        if not isinstance(admitted, Reply):
            self._admitted = admitted
            return True
        length = head.content_length or 0
        if head.chunked or length > self._max_body or admitted.status == 500:
            self._refuse(admitted)
            return False
        self._start = head_end
        self._skip = length
        if not head.keep_alive:
            self._close_after_writes = True
        self._answer(admitted)
        return False

    def _release_admitted(self) -> None:
        if self._admitted is not None:
            self._endpoint.release(self._admitted)
            self._admitted = None

    def _dispatch(self, head: RequestHead, body: bytes) -> None:
        endpoint = self._endpoint
        received_at_us, started = self._received_at_us, self._started
        admitted = self._admitted
        assert admitted is not None
        self._admitted = None
        try:
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
        self._held_bytes += len(body)
        self._slots.append(slot)  # before `settled` can run: that is a later turn of the loop

    def _durable(self, slot: _Slot, ingestor: SourceIngestor, received_at_us: int, size: int, started: float,
                 offsets: list[int] | None, error: BaseException | None) -> None:
        endpoint = self._endpoint
        endpoint.release(ingestor)
        self._held_bytes -= size
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
        else:
            self._update_reading()  # reading may resume: fewer answers owed, fewer bytes held

    def _answer(self, reply: Reply, *, close: bool = False) -> None:
        if close:
            self._close_after_writes = True
        self._slots.append(_Slot(self._writer.render(reply, close=self._close_after_writes)))
        self._flush()

    def _refuse(self, reply: Reply, *, linger: bool = True) -> None:
        """An answer after which the request's framing is lost: the connection closes, lingering
        (`linger`) so that a client still sending its body reads the answer rather than a reset."""
        self._head = None
        self._chunked = None
        self._skip = 0
        self._release_admitted()
        self._close_after_writes = True
        self._linger_on_close = linger
        self._answer(reply)

    def _refuse_too_large(self, head: RequestHead) -> None:
        admitted = self._admitted
        if admitted is None:
            self._refuse(Reply(413, f"request body exceeds {self._max_body} bytes"))
            return
        reply = self._endpoint.too_large(admitted, self._received_at_us, self._started)
        self._refuse(reply)

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
            if self._linger_on_close and not self._eof and not self._lost:
                self._linger()
            else:
                transport.close()
        else:
            self._arm()

    def _linger(self) -> None:
        """nginx's lingering close: half-close (the answer is out), then read and discard what the
        client still sends until it closes, bounded in time and bytes. Closing at once while unread
        bytes sit in the socket would make the kernel send a reset, which can destroy the answer
        before the client reads it."""
        transport = self._transport
        assert transport is not None
        if self._lingering:
            return
        self._lingering = True
        self._buffer = bytearray()
        self._start = 0
        settings = self._settings
        now = time.monotonic()
        self._linger_until = now + settings.lingering_time_s
        self.deadline = min(self._linger_until, now + settings.lingering_timeout_s)
        try:
            transport.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            transport.close()
            return
        if self._reading_paused:
            self._reading_paused = False
            with contextlib.suppress(RuntimeError):
                transport.resume_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self._lost or self._handed_off or self._lingering:
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
        self.deadline = NO_DEADLINE
        self._release_admitted()
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
                 connections: set[FastIngestProtocol], settings: HttpSettings | None = None) -> None:
        self._server = server
        self._runner = runner
        self._connections = connections
        settings = settings or HttpSettings()
        shortest = min(settings.header_timeout_s, settings.body_timeout_s, settings.keepalive_timeout_s,
                       settings.lingering_timeout_s)
        self._sweeper = asyncio.ensure_future(self._sweep(max(0.05, min(1.0, shortest / 4))))

    async def _sweep(self, interval_s: float) -> None:
        """Close the connections whose deadline passed: one pass a second (a deadline per connection
        is a float compared here, cheaper than a timer rescheduled at every read)."""
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for connection in [c for c in self._connections if c.deadline <= now]:
                try:
                    connection.time_out()
                except Exception:  # noqa: BLE001 - one connection's failure must not stop the sweeps
                    log.exception("closing a timed-out connection failed")

    @property
    def addresses(self) -> list[Any]:
        return [sock.getsockname() for sock in self._server.sockets]

    async def cleanup(self) -> None:
        """Stop listening, let the answers already owed go out, close; then stop aiohttp."""
        self._sweeper.cancel()
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


async def start_front(endpoint: WebhookEndpoint, runner: web.AppRunner, host: str, port: int,
                      settings: HttpSettings | None = None) -> HttpFront:
    """Listen on host:port; `runner` (set up, with no site) serves what the fast path hands off."""
    aiohttp_server = runner.server
    assert aiohttp_server is not None, "runner.setup() first"
    tune_interpreter_for_latency()
    connections: set[FastIngestProtocol] = set()
    writer = ResponseWriter()
    read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))  # shared: reads never interleave in one loop
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: FastIngestProtocol(endpoint, aiohttp_server, writer, connections, read_buffer, settings), host, port,
        backlog=1024)
    return HttpFront(server, runner, connections, settings)
