"""The fast webhook protocol: bytes in, responses out. Unit tests feed it bytes through a
recording transport (real registry, real logs); the hand-off tests use real sockets against
run_http, where aiohttp takes over the connection."""

from __future__ import annotations

import asyncio
import gc
import gzip
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from headrace.http.app import make_app, run_http
from headrace.http.fast_ingest import GIL_SWITCH_INTERVAL_S, FastIngestProtocol, tune_interpreter_for_latency
from headrace.http.framing import ResponseWriter
from headrace.http.webhook_endpoint import ServerState, WebhookEndpoint
from headrace.webhook.ingest import IngestRegistry, IngestSettings
from tests.http.test_webhook_http import logged, run, webhook_source


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self.protocol: Any = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol


def post(name: str, body: bytes, *extra: str) -> bytes:
    headers = "".join(f"{line}\r\n" for line in extra)
    return (f"POST /api/webhook/headrace/public/{name} HTTP/1.1\r\nHost: t\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def statuses(written: bytes) -> list[int]:
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", written)]


async def settle(transport: RecordingTransport, count: int) -> None:
    for _ in range(500):
        if len(statuses(bytes(transport.written))) >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"expected {count} responses, got {bytes(transport.written)!r}")


def connect(registry: IngestRegistry, hand_off: Any = None) -> tuple[FastIngestProtocol, RecordingTransport]:
    endpoint = WebhookEndpoint(registry, ServerState(ready=True))
    protocol = FastIngestProtocol(endpoint, hand_off or (lambda: None), ResponseWriter())
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport


def test_pipelined_requests_are_answered_in_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("orders", key="body->>'id'"), tmp_path / "u1")
        protocol, transport = connect(registry)
        stream = (post("orders", b'{"id": "1"}') + post("nope", b"{}") + post("orders", b"not json")
                  + post("orders", b'{"id": "2"}', "X-A: 1")
                  + b"GET /api/webhook/headrace/public/orders HTTP/1.1\r\nHost: t\r\n\r\n"
                  + post("orders", b'{"id": "1"}'))
        protocol.data_received(stream)
        await settle(transport, 6)
        assert statuses(bytes(transport.written)) == [200, 404, 400, 200, 405, 200]
        assert b"Allow: POST" in transport.written and not transport.closed
        await registry.close_all()
        assert [record.body for record in logged(tmp_path / "u1")] == [b'{"id": "1"}', b'{"id": "2"}', b'{"id": "1"}']

    run(scenario)


def test_requests_split_at_every_byte_and_chunked_bodies(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("orders"), tmp_path / "u1")
        protocol, transport = connect(registry)
        chunked = (b"POST /api/webhook/headrace/public/orders HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"4\r\n{\"a\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n")
        for byte in post("orders", b'{"b": 2}') + chunked:
            protocol.data_received(bytes([byte]))
        await settle(transport, 2)
        assert statuses(bytes(transport.written)) == [200, 200]
        await registry.close_all()
        assert [record.body for record in logged(tmp_path / "u1")] == [b'{"b": 2}', b'{"a": 1}']

    run(scenario)


def test_connection_close_and_oversized_bodies_close_after_the_answer(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry(IngestSettings(max_body_bytes=10))
        registry.add(webhook_source("orders"), tmp_path / "u1")
        protocol, transport = connect(registry)
        protocol.data_received(post("orders", b"{}", "Connection: close") + post("orders", b"{}"))
        await settle(transport, 1)
        await asyncio.sleep(0.05)
        assert statuses(bytes(transport.written)) == [200] and transport.closed
        assert b"Connection: close" in transport.written

        protocol, transport = connect(registry)
        protocol.data_received(post("orders", b'{"x": "' + b"y" * 20 + b'"}'))
        await settle(transport, 1)
        assert statuses(bytes(transport.written)) == [413] and transport.closed
        protocol, transport = connect(registry)
        protocol.data_received(b"POST /api/webhook/headrace/public/orders HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                               b"8\r\n12345678\r\n8\r\n12345678\r\n")
        await settle(transport, 1)
        assert statuses(bytes(transport.written)) == [413] and transport.closed
        await registry.close_all()
        assert registry.settings.max_body_bytes == 10

    run(scenario)


def test_hand_off_waits_for_pending_answers_and_passes_the_bytes(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("orders"), tmp_path / "u1")
        received: list[bytes] = []

        class Receiver(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                received.append(b"<connected>")

            def data_received(self, data: bytes) -> None:
                received.append(data)

        protocol, transport = connect(registry, Receiver)
        other = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
        protocol.data_received(post("orders", b"{}") + other[:10])
        assert received == []  # our answer is still pending: no hand-off yet
        protocol.data_received(other[10:] + b"more")
        await settle(transport, 1)
        assert isinstance(transport.protocol, Receiver)
        assert received == [b"<connected>", other + b"more"]
        await registry.close_all()

    run(scenario)


async def raw_exchange(port: int, data: bytes, responses: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = b""
    while len(statuses(got)) < responses or not got.endswith((b"\r\n\r\n", b"}", b"\n")):
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        if not chunk:
            break
        got += chunk
    writer.close()
    return got


def test_real_sockets_webhook_then_metrics_and_gzip_on_one_connection(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("orders"), tmp_path / "u1")
        front = await run_http(make_app(registry, ready=ServerState(ready=True)), "127.0.0.1", 0)
        port = front.addresses[0][1]
        compressed = gzip.compress(b'{"z": 1}')
        gzipped = (b"POST /api/webhook/headrace/public/orders HTTP/1.1\r\nHost: t\r\nContent-Encoding: gzip\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(compressed)) + compressed
        got = await raw_exchange(port, post("orders", b'{"a": 1}') + gzipped, 2)
        assert statuses(got) == [200, 200]
        assert b"Server: Python" in got.split(b"HTTP/1.1 200")[2]  # the second answer came from aiohttp
        got = await raw_exchange(port, post("orders", b'{"b": 1}') + b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n", 2)
        assert statuses(got) == [200, 200] and b"headrace_webhook_requests_accepted" in got
        await front.cleanup()
        await registry.close_all()
        assert [record.body for record in logged(tmp_path / "u1")] == [b'{"a": 1}', b'{"z": 1}', b'{"b": 1}']

    run(scenario)


def test_real_sockets_pipelined_bodies_larger_than_the_shared_read_buffer(tmp_path: Path) -> None:
    """Reads go through one buffer shared by all connections: bodies spanning many reads, on two
    connections at once, arrive whole and in order."""
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("orders"), tmp_path / "u1")
        front = await run_http(make_app(registry, ready=ServerState(ready=True)), "127.0.0.1", 0)
        port = front.addresses[0][1]
        bodies = [b'{"n": %d, "pad": "%s"}' % (n, b"x" * (150_000 + n * 7_000)) for n in range(6)]
        first = b"".join(post("orders", body) for body in bodies[:3])
        second = b"".join(post("orders", body) for body in bodies[3:])
        answers = await asyncio.gather(raw_exchange(port, first, 3), raw_exchange(port, second, 3))
        assert [statuses(got) for got in answers] == [[200, 200, 200], [200, 200, 200]]
        await front.cleanup()
        await registry.close_all()
        logged_bodies = [record.body for record in logged(tmp_path / "u1")]
        assert sorted(logged_bodies) == sorted(bodies)
        assert [body for body in logged_bodies if body in bodies[:3]] == bodies[:3]

    run(scenario)


def test_the_front_tunes_the_interpreter_for_short_gil_waits_and_cheap_full_collections() -> None:
    tune_interpreter_for_latency()  # what start_front does, once per process
    assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
    assert gc.get_freeze_count() > 1000  # the start-up heap no longer walked by full collections
