"""Framing of protocol messages on a byte stream: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.

JSON is encoded and decoded by orjson (several times faster than the json module on protocol messages). orjson
refuses integers beyond 64 bits (and would decode them as floats), so such a message is encoded by the json module
with one leading space, still valid JSON, which tells the decoder to use the json module too: exact either way.

Binary frames carry Arrow data (StoreColumns, protocol.py) without JSON-encoding it: a message dict with a "blobs"
member ({name: bytes}) is framed as one 0x00 byte, a 4-byte big-endian length of a JSON header (the message without
"blobs", plus "blob_sizes": [[name, size], ..]), the header, then the blobs back to back. A JSON payload never
starts with 0x00, so the first byte tells the two apart; the decoder restores "blobs" as bytes.

Two thin transports share the codec: asyncio (the driver server) and blocking sockets (the runtime, which runs
inside Spark's synchronous foreachBatch). Neither knows about message meaning; see protocol.py for that.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

import orjson

from headrace.errors import ProtocolViolation

MAX_FRAME_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
_RECV_CHUNK = 256 * 1024
_encode_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class FrameTooLarge(ProtocolViolation):
    """A frame exceeds MAX_FRAME_BYTES: a runaway document or a peer speaking another protocol."""


def _too_large(length: int) -> FrameTooLarge:
    return FrameTooLarge(f"frame of {length} bytes exceeds the {MAX_FRAME_BYTES} byte limit "
                         "(split the document or transaction, or check that the peer speaks this protocol)")


def encode_json(value: Any) -> bytes:
    """UTF-8 JSON of `value`: orjson, or the json module for what orjson refuses (big integers)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return b" " + _encode_json(value).encode("utf-8")  # the space: decode with json (see module docstring)


_BINARY_MARK = b"\x00"


def _encode_binary(message: dict[str, Any]) -> bytes:
    blobs: dict[str, bytes] = message["blobs"]
    header = {k: v for k, v in message.items() if k != "blobs"}
    header["blob_sizes"] = [[name, len(blob)] for name, blob in blobs.items()]
    encoded = encode_json(header)
    return b"".join((_BINARY_MARK, _HEADER.pack(len(encoded)), encoded, *blobs.values()))


def _decode_binary(payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    try:
        (length,) = _HEADER.unpack_from(payload, 1)
        start = 1 + _HEADER.size
        message = decode_payload(payload[start:start + length])
        position = start + length
        blobs: dict[str, bytes] = {}
        for name, size in message.pop("blob_sizes"):
            if position + size > len(payload):
                raise ProtocolViolation(f"binary frame's blob {name!r} of {size} bytes runs past the frame")
            blobs[name] = bytes(payload[position:position + size])  # a copy: the read buffer is reused
            position += size
    except (struct.error, KeyError, TypeError, ValueError) as exc:
        raise ProtocolViolation(f"malformed binary frame: {exc!r}") from exc
    message["blobs"] = blobs
    return message


def encode_frame(message: dict[str, Any]) -> bytes:
    payload = _encode_binary(message) if "blobs" in message else encode_json(message)
    if len(payload) > MAX_FRAME_BYTES:
        raise _too_large(len(payload))
    return _HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    if payload[:1] == _BINARY_MARK:
        return _decode_binary(payload)
    try:
        if payload[:1] == b" ":
            message = json.loads(str(payload, "utf-8"))
        else:
            message = orjson.loads(payload)
    except (UnicodeDecodeError, ValueError) as exc:  # orjson's and json's decode errors are ValueErrors
        raise ProtocolViolation(f"frame is not UTF-8 JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolViolation(f"frame holds a JSON {type(message).__name__}, expected an object")
    return message


# ---------------------------------------------------------------------------------------------- asyncio


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None at a clean EOF (between frames). A truncated frame raises ConnectionError."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ConnectionError("connection closed inside a frame header") from exc
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise _too_large(length)
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise ConnectionError(f"connection closed inside a {length} byte frame") from exc
    return decode_payload(payload)


class FrameReader:
    """Reads frames from an asyncio stream in bursts: one await per socket read, not two per frame.

    Use either a FrameReader or read_frame on a given stream, never both (this one buffers ahead)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._buffer = bytearray()

    async def read_frames(self) -> list[dict[str, Any]] | None:
        """All complete frames buffered so far (at least one), or None at a clean EOF."""
        while True:
            frames = self._take_complete_frames()
            if frames:
                return frames
            chunk = await self._reader.read(_RECV_CHUNK)
            if not chunk:
                if self._buffer:
                    raise ConnectionError(f"connection closed inside a frame ({len(self._buffer)} bytes buffered)")
                return None
            self._buffer += chunk

    def _take_complete_frames(self) -> list[dict[str, Any]]:
        buffer, offset, frames = self._buffer, 0, []
        while len(buffer) - offset >= _HEADER.size:
            (length,) = _HEADER.unpack_from(buffer, offset)
            if length > MAX_FRAME_BYTES:
                raise _too_large(length)
            end = offset + _HEADER.size + length
            if end > len(buffer):
                break
            with memoryview(buffer) as view:
                frames.append(decode_payload(view[offset + _HEADER.size:end]))
            offset = end
        if offset:
            del buffer[:offset]
        return frames


def write_frame(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    """Buffer one frame; the caller awaits writer.drain() for back-pressure."""
    writer.write(encode_frame(message))


def write_frames(writer: asyncio.StreamWriter, messages: list[dict[str, Any]]) -> None:
    writer.write(b"".join(encode_frame(m) for m in messages))


# ---------------------------------------------------------------------------------------------- blocking


class FrameSocket:
    """A blocking framed connection with a read buffer, so a burst of small frames costs few syscalls."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._scan = 0  # start of the unread part of _buffer; compacted lazily to avoid O(n^2) slicing

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 10.0,
                io_timeout: float | None = None) -> FrameSocket:
        """Connect within `timeout` seconds; afterwards reads and writes wait `io_timeout` (None: forever)."""
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.settimeout(io_timeout)
        # Small control frames (Flush, StartCommit) must not wait out Nagle + delayed ACK (~40 ms each).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock)

    def send(self, message: dict[str, Any]) -> None:
        self._sock.sendall(encode_frame(message))

    def send_many(self, messages: list[dict[str, Any]]) -> None:
        """All frames in one sendall, i.e. one syscall unless the kernel buffer fills."""
        self._sock.sendall(b"".join(encode_frame(m) for m in messages))

    def recv(self) -> dict[str, Any]:
        """The next message; ConnectionError if the peer closed the connection."""
        self._fill(_HEADER.size)
        (length,) = _HEADER.unpack_from(self._buffer, self._scan)
        if length > MAX_FRAME_BYTES:
            raise _too_large(length)
        self._fill(_HEADER.size + length)
        start = self._scan + _HEADER.size
        payload = memoryview(self._buffer)[start:start + length]
        try:
            message = decode_payload(payload)
        finally:
            payload.release()  # a live memoryview would forbid resizing the buffer
        self._scan = start + length
        return message

    def _fill(self, needed: int) -> None:
        """Ensure `needed` unread bytes are buffered."""
        while len(self._buffer) - self._scan < needed:
            if self._scan:
                del self._buffer[:self._scan]
                self._scan = 0
            chunk = self._sock.recv(max(_RECV_CHUNK, needed - len(self._buffer)))
            if not chunk:
                raise ConnectionError("driver connection closed" if not self._buffer
                                      else "driver connection closed inside a frame")
            self._buffer += chunk

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the peer
        self._sock.close()

    def __enter__(self) -> FrameSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
