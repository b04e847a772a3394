"""A client-side view of the wire protocol, written independently of headrace.pgwire.messages so the
tests check the server codec against the documented formats rather than against itself:
frontend message encoders, and a backend message decoder returning readable tuples."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any


def _message(type_byte: bytes, body: bytes) -> bytes:
    return type_byte + struct.pack("!i", len(body) + 4) + body


def _cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def startup(parameters: dict[str, str], version: int = 196608) -> bytes:
    body = struct.pack("!i", version) + b"".join(_cstr(k) + _cstr(v) for k, v in parameters.items()) + b"\0"
    return struct.pack("!i", len(body) + 4) + body


def ssl_request() -> bytes:
    return struct.pack("!ii", 8, 80877103)


def gssenc_request() -> bytes:
    return struct.pack("!ii", 8, 80877104)


def cancel_request(process_id: int, secret_key: int) -> bytes:
    return struct.pack("!iiII", 16, 80877102, process_id, secret_key)


def query(sql: str) -> bytes:
    return _message(b"Q", _cstr(sql))


def parse(name: str, sql: str, param_types: Sequence[int] = ()) -> bytes:
    body = _cstr(name) + _cstr(sql) + struct.pack("!h", len(param_types))
    return _message(b"P", body + b"".join(struct.pack("!I", oid) for oid in param_types))


def bind(portal: str, statement: str, params: Sequence[bytes | None] = (), param_formats: Sequence[int] = (),
         result_formats: Sequence[int] = ()) -> bytes:
    body = bytearray(_cstr(portal) + _cstr(statement))
    body += struct.pack("!h", len(param_formats)) + b"".join(struct.pack("!h", f) for f in param_formats)
    body += struct.pack("!h", len(params))
    for param in params:
        body += struct.pack("!i", -1) if param is None else struct.pack("!i", len(param)) + param
    body += struct.pack("!h", len(result_formats)) + b"".join(struct.pack("!h", f) for f in result_formats)
    return _message(b"B", bytes(body))


def describe(kind: str, name: str) -> bytes:
    return _message(b"D", kind.encode() + _cstr(name))


def execute(portal: str, max_rows: int = 0) -> bytes:
    return _message(b"E", _cstr(portal) + struct.pack("!i", max_rows))


def close(kind: str, name: str) -> bytes:
    return _message(b"C", kind.encode() + _cstr(name))


def sync() -> bytes:
    return _message(b"S", b"")


def flush() -> bytes:
    return _message(b"H", b"")


def terminate() -> bytes:
    return _message(b"X", b"")


def copy_data(data: bytes) -> bytes:
    return _message(b"d", data)


def copy_done() -> bytes:
    return _message(b"c", b"")


def copy_fail(reason: str) -> bytes:
    return _message(b"f", _cstr(reason))


def password(payload: bytes) -> bytes:
    return _message(b"p", payload)


# --- backend decoding --------------------------------------------------------------------------

def _cstrings(body: bytes) -> list[str]:
    return [part.decode() for part in body.split(b"\0")[:-1]]


def _fields(body: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    position = 0
    while body[position] != 0:
        end = body.index(b"\0", position + 1)
        fields[chr(body[position])] = body[position + 1:end].decode()
        position = end + 1
    assert position == len(body) - 1, "ErrorResponse/NoticeResponse must end right after the terminator"
    return fields


def _decode_one(type_byte: str, body: bytes) -> tuple[Any, ...]:
    if type_byte == "R":
        code = struct.unpack_from("!i", body)[0]
        if code == 10:
            return ("R", code, _cstrings(body[4:-1]))
        return ("R", code) if len(body) == 4 else ("R", code, body[4:])
    if type_byte == "S":
        name, value = _cstrings(body)
        return ("S", name, value)
    if type_byte == "K":
        return ("K", *struct.unpack("!II", body))
    if type_byte == "Z":
        assert len(body) == 1
        return ("Z", body.decode())
    if type_byte == "T":
        count = struct.unpack_from("!h", body)[0]
        position = 2
        columns: list[tuple[str, int, int, int, int]] = []
        for _ in range(count):
            end = body.index(b"\0", position)
            name = body[position:end].decode()
            table_oid, attnum, type_oid, size, modifier, fmt = struct.unpack_from("!ihIhih", body, end + 1)
            assert (table_oid, attnum) == (0, 0)
            columns.append((name, type_oid, size, modifier, fmt))
            position = end + 1 + 18
        assert position == len(body)
        return ("T", columns)
    if type_byte == "D":
        count = struct.unpack_from("!h", body)[0]
        position = 2
        cells: list[bytes | None] = []
        for _ in range(count):
            size = struct.unpack_from("!i", body, position)[0]
            position += 4
            if size == -1:
                cells.append(None)
            else:
                cells.append(body[position:position + size])
                position += size
        assert position == len(body)
        return ("D", cells)
    if type_byte == "C":
        return ("C", _cstrings(body)[0])
    if type_byte in ("E", "N"):
        return (type_byte, _fields(body))
    if type_byte == "t":
        count = struct.unpack_from("!h", body)[0]
        assert len(body) == 2 + 4 * count
        return ("t", list(struct.unpack_from(f"!{count}I", body, 2)))
    if type_byte == "v":
        newest_minor, count = struct.unpack_from("!ii", body)
        options = _cstrings(body[8:])
        assert len(options) == count
        return ("v", newest_minor, options)
    if type_byte in ("I", "1", "2", "3", "n", "s"):
        assert body == b"", f"{type_byte} has no body"
        return (type_byte,)
    raise AssertionError(f"unknown backend message {type_byte!r}")


def decode_backend(data: bytes) -> list[tuple[Any, ...]]:
    """Every backend message in `data` (which must hold whole messages only)."""
    decoded: list[tuple[Any, ...]] = []
    position = 0
    while position < len(data):
        type_byte = chr(data[position])
        length = struct.unpack_from("!i", data, position + 1)[0]
        decoded.append(_decode_one(type_byte, data[position + 5:position + 1 + length]))
        position += 1 + length
    assert position == len(data), "trailing partial message"
    return decoded


def kinds(decoded: list[tuple[Any, ...]]) -> list[str]:
    """Just the message types: ['1', '2', 'T', 'D', 'C', 'Z']."""
    return [message[0] for message in decoded]
