"""Framing over real sockets: blocking FrameSocket on one end, asyncio streams on the other."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from headrace.errors import ProtocolViolation
from headrace.materialize import transport
from headrace.materialize.transport import (
    FrameReader,
    FrameSocket,
    FrameTooLarge,
    encode_frame,
    read_frame,
    write_frame,
    write_frames,
)


def run_with_stream_peer(peer: Callable[[asyncio.StreamReader, asyncio.StreamWriter, socket.socket],
                                        Awaitable[None]]) -> None:
    """Run `peer` with asyncio streams on one end of a socketpair; it gets the raw other end too."""
    async def main() -> None:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        try:
            await peer(reader, writer, theirs)
        finally:
            writer.close()
            theirs.close()

    asyncio.run(main())


def test_frames_round_trip_both_ways() -> None:
    messages: list[dict[str, Any]] = [{"type": "Load", "key": ["ü", 1]}, {"type": "Flush"}, {"big": "x" * 300_000}]

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: socket.socket) -> None:
        blocking = FrameSocket(other)
        loop = asyncio.get_running_loop()
        sending = loop.run_in_executor(None, blocking.send_many, messages)  # larger than the socket buffer
        assert [await read_frame(reader) for _ in messages] == messages
        await sending
        receiving = loop.run_in_executor(None, lambda: [blocking.recv() for _ in messages])
        write_frame(writer, messages[0])
        write_frames(writer, messages[1:])
        await writer.drain()
        assert await receiving == messages
        other.shutdown(socket.SHUT_WR)
        assert await read_frame(reader) is None  # clean EOF between frames

    run_with_stream_peer(peer)


@pytest.mark.parametrize("raw, problem", [
    (b"\x00\x00", "inside a frame header"),
    (struct.pack(">I", 10) + b"{}", "inside a 10 byte frame"),
])
def test_truncated_frames_are_connection_errors(raw: bytes, problem: str) -> None:
    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: socket.socket) -> None:
        other.sendall(raw)
        other.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionError, match=problem):
            await read_frame(reader)

    run_with_stream_peer(peer)


def test_oversized_frames_are_refused_on_read() -> None:
    header = struct.pack(">I", transport.MAX_FRAME_BYTES + 1)

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: socket.socket) -> None:
        other.sendall(header)
        with pytest.raises(FrameTooLarge, match="exceeds the 67108864 byte limit"):
            await read_frame(reader)

    run_with_stream_peer(peer)
    left, right = socket.socketpair()
    with FrameSocket(left) as blocking:
        right.sendall(header)
        with pytest.raises(FrameTooLarge, match="exceeds the 67108864 byte limit"):
            blocking.recv()
    right.close()


def test_oversized_frames_are_refused_on_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "MAX_FRAME_BYTES", 100)
    encode_frame({"v": "x" * 80})
    with pytest.raises(FrameTooLarge, match="frame of 108 bytes exceeds the 100 byte limit"):
        encode_frame({"v": "x" * 100})


def test_blocking_recv_reports_a_closed_peer() -> None:
    left, right = socket.socketpair()
    blocking = FrameSocket(left)
    right.sendall(encode_frame({"n": 1}) + encode_frame({"n": 2})[:5])
    right.close()
    assert blocking.recv() == {"n": 1}
    with pytest.raises(ConnectionError, match="closed inside a frame"):
        blocking.recv()
    blocking.close()


def test_many_small_frames_split_across_reads_arrive_intact() -> None:
    left, right = socket.socketpair()
    blocking = FrameSocket(left)
    frames = [{"i": i, "pad": "y" * (i % 97)} for i in range(20_000)]
    wire = b"".join(encode_frame(f) for f in frames)

    def trickle() -> None:
        for start in range(0, len(wire), 7_001):  # boundaries fall inside headers and payloads
            right.sendall(wire[start:start + 7_001])

    writer = threading.Thread(target=trickle)
    writer.start()
    assert [blocking.recv() for _ in frames] == frames
    writer.join()
    blocking.close()
    right.close()


@pytest.mark.parametrize("payload, problem", [(b"[1]", "JSON list, expected an object"),
                                              (b"\xff{", "not UTF-8 JSON")])
def test_frames_must_hold_a_json_object(payload: bytes, problem: str) -> None:
    left, right = socket.socketpair()
    right.sendall(struct.pack(">I", len(payload)) + payload)
    with FrameSocket(left) as blocking, pytest.raises(ProtocolViolation, match=problem):
        blocking.recv()
    right.close()


def test_connect_reaches_a_listening_server() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with FrameSocket.connect("127.0.0.1", port, timeout=5) as client:
        server_side, _ = listener.accept()
        client.send({"hello": "driver"})
        with FrameSocket(server_side) as server:
            assert server.recv() == {"hello": "driver"}
    listener.close()


def test_frame_reader_returns_bursts_and_reassembles_split_frames() -> None:
    frames = [{"i": i} for i in range(1000)]
    wire = b"".join(encode_frame(f) for f in frames)

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: socket.socket) -> None:
        bursts = FrameReader(reader)
        other.sendall(wire[:4001])  # ends inside a frame
        first = await bursts.read_frames()
        assert first is not None and first == frames[:len(first)] and len(first) > 1
        other.sendall(wire[4001:])
        received = list(first)
        while len(received) < len(frames):
            burst = await bursts.read_frames()
            assert burst is not None
            received.extend(burst)
        assert received == frames
        other.sendall(encode_frame({"last": True})[:6])
        other.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionError, match="closed inside a frame"):
            await bursts.read_frames()

    run_with_stream_peer(peer)


def test_frame_reader_sees_clean_eof_and_refuses_oversized_frames() -> None:
    async def clean(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: socket.socket) -> None:
        other.sendall(encode_frame({"n": 1}))
        other.shutdown(socket.SHUT_WR)
        bursts = FrameReader(reader)
        assert await bursts.read_frames() == [{"n": 1}]
        assert await bursts.read_frames() is None

    async def oversized(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: socket.socket) -> None:
        other.sendall(struct.pack(">I", transport.MAX_FRAME_BYTES + 1))
        with pytest.raises(FrameTooLarge):
            await FrameReader(reader).read_frames()

    run_with_stream_peer(clean)
    run_with_stream_peer(oversized)


def test_integers_beyond_64_bits_cross_the_wire_exactly() -> None:
    from headrace.materialize.transport import decode_payload
    message = {"type": "Store", "values": [2**80, -(2**70)], "text": "ü"}
    frame = encode_frame(message)
    assert decode_payload(frame[4:]) == message
    assert encode_frame({"n": 1})[4:5] == b"{"  # the fast encoder otherwise
