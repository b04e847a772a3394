"""The log payload of one accepted webhook row, and its codec.

Binary, because decoding runs on the Spark hot path and bodies may be arbitrary bytes (BODY FORMAT
BYTES):

    u8 version (1) | u8 flags | i64 received_at_us | i64 prev_offset | u32 key_len | u32 headers_len
    | key (UTF-8) | headers (JSON object) | body (the rest)

flags: 1 = has key, 2 = has headers, 4 = has prev_offset. `prev_offset` makes the record a
replacement: the row at that log offset (same idempotency key, within the window) is superseded by
this one. Payloads written by earlier versions (a JSON object, first byte "{") still decode.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import orjson

_HEADER = struct.Struct(">BBqqII")
_VERSION = 1
_HAS_KEY, _HAS_HEADERS, _HAS_PREV = 1, 2, 4
_LEGACY_JSON_FIRST_BYTE = ord("{")


class WebhookRecord:
    """One row of an accepted request. Immutable by convention; `replacing` makes a replacement."""

    __slots__ = ("received_at_us", "idempotency_key", "headers", "body", "prev_offset")

    def __init__(self, received_at_us: int, idempotency_key: str | None, headers: dict[str, str] | None,
                 body: bytes | str | None = None, prev_offset: int | None = None, *,
                 body_text: str | None = None) -> None:
        # A text body (or `body_text`) is accepted while the handler still builds records from text.
        if body is None:
            if body_text is None:
                raise TypeError("WebhookRecord needs body (bytes)")
            body = body_text
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogatepass")
        self.received_at_us = received_at_us  # microseconds since the Unix epoch, at arrival
        self.idempotency_key = idempotency_key
        self.headers = headers  # only with INCLUDE HEADERS; names lower-cased
        self.body = body  # the row's raw bytes
        self.prev_offset = prev_offset  # log offset of the row this one replaces, or None

    @property
    def body_text(self) -> str:
        return self.body.decode("utf-8")

    def replacing(self, prev_offset: int | None) -> WebhookRecord:
        return WebhookRecord(self.received_at_us, self.idempotency_key, self.headers, self.body, prev_offset)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WebhookRecord):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"WebhookRecord({fields})"


def encode(record: WebhookRecord) -> bytes:
    flags = 0
    key = b""
    if record.idempotency_key is not None:
        flags |= _HAS_KEY
        key = record.idempotency_key.encode("utf-8", "surrogatepass")
    headers = b""
    if record.headers is not None:
        flags |= _HAS_HEADERS
        headers = orjson.dumps(record.headers)
    prev = -1
    if record.prev_offset is not None:
        flags |= _HAS_PREV
        prev = record.prev_offset
    return b"".join((_HEADER.pack(_VERSION, flags, record.received_at_us, prev, len(key), len(headers)),
                     key, headers, record.body))


def decode_fields(payload: bytes) -> tuple[int, str | None, str | None, bytes, int | None]:
    """(received_at_us, key, headers as JSON text, body, prev_offset) without building objects:
    what the pipeline needs per row."""
    if payload[0] == _LEGACY_JSON_FIRST_BYTE:
        fields: dict[str, Any] = json.loads(payload)
        headers_json = json.dumps(fields["h"], separators=(",", ":")) if fields.get("h") is not None else None
        return fields["t"], fields.get("k"), headers_json, fields["b"].encode("utf-8"), None
    version, flags, received_at_us, prev, key_len, headers_len = _HEADER.unpack_from(payload)
    if version != _VERSION:
        raise ValueError(f"unknown webhook record version {version}")
    start = _HEADER.size
    key = payload[start:start + key_len].decode("utf-8", "surrogatepass") if flags & _HAS_KEY else None
    start += key_len
    headers = payload[start:start + headers_len].decode("utf-8") if flags & _HAS_HEADERS else None
    start += headers_len
    return received_at_us, key, headers, payload[start:], (prev if flags & _HAS_PREV else None)


def decode(payload: bytes) -> WebhookRecord:
    received_at_us, key, headers, body, prev = decode_fields(payload)
    return WebhookRecord(received_at_us=received_at_us, idempotency_key=key,
                         headers=orjson.loads(headers) if headers is not None else None, body=body, prev_offset=prev)
