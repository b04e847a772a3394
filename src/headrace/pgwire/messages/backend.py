"""Backend (server -> client) message encoders: each returns the message's bytes, and
`append_data_rows` writes DataRows straight into an output buffer (the SELECT hot path)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

_INT16 = struct.Struct("!h")
_UINT32 = struct.Struct("!I")
_INT32 = struct.Struct("!i")


def _message(type_byte: bytes, body: bytes) -> bytes:
    return type_byte + _INT32.pack(len(body) + 4) + body


def _cstring(text: str) -> bytes:
    return text.encode("utf-8") + b"\0"


def authentication_ok() -> bytes:
    return _message(b"R", _INT32.pack(0))


def authentication_cleartext_password() -> bytes:
    return _message(b"R", _INT32.pack(3))


def authentication_sasl(mechanisms: Iterable[str]) -> bytes:
    return _message(b"R", _INT32.pack(10) + b"".join(_cstring(m) for m in mechanisms) + b"\0")


def authentication_sasl_continue(data: bytes) -> bytes:
    return _message(b"R", _INT32.pack(11) + data)


def authentication_sasl_final(data: bytes) -> bytes:
    return _message(b"R", _INT32.pack(12) + data)


def parameter_status(name: str, value: str) -> bytes:
    return _message(b"S", _cstring(name) + _cstring(value))


def backend_key_data(process_id: int, secret_key: int) -> bytes:
    # Masked so any int that fits 32 bits round-trips through CancelRequest's unsigned decoding.
    return _message(b"K", _UINT32.pack(process_id & 0xFFFFFFFF) + _UINT32.pack(secret_key & 0xFFFFFFFF))


def negotiate_protocol_version(newest_minor: int, unrecognized_options: Sequence[str]) -> bytes:
    body = _INT32.pack(newest_minor) + _INT32.pack(len(unrecognized_options))
    return _message(b"v", body + b"".join(_cstring(option) for option in unrecognized_options))


def ready_for_query(transaction_status: str) -> bytes:
    cached = _READY_FOR_QUERY.get(transaction_status)  # one per query: built once per status
    return cached if cached is not None else _message(b"Z", transaction_status.encode("ascii"))


_READY_FOR_QUERY = {status: _message(b"Z", status.encode("ascii")) for status in ("I", "T", "E")}

# table oid, column number, type oid, type size, type modifier, format code
_FIELD = struct.Struct("!ihIhih")


def row_description(fields: Sequence[tuple[str, int, int, int, int]]) -> bytes:
    """fields: (name, type oid, type size, type modifier, format code) per column."""
    parts = [_INT16.pack(len(fields))]
    for name, type_oid, type_size, type_modifier, format_code in fields:
        parts.append(_cstring(name))
        parts.append(_FIELD.pack(0, 0, type_oid, type_size, type_modifier, format_code))
    return _message(b"T", b"".join(parts))


_NULL_CELL = _INT32.pack(-1)
_DATA_ROW_HEADER = struct.Struct("!cih")


def data_row(cells: Sequence[bytes | None]) -> bytes:
    """One DataRow from already-encoded cells (None = SQL NULL)."""
    out = bytearray()
    append_data_rows(out, [tuple(cells)], [_identity] * len(cells))
    return bytes(out)


def _identity(value: bytes) -> bytes:
    return value


def append_data_rows(out: bytearray, rows: Iterable[Sequence[Any]],
                     encoders: Sequence[Callable[[Any], bytes]]) -> None:
    """Encode rows straight into `out`, one DataRow each; `encoders[i]` turns column i's non-NULL
    value into its wire bytes. The SELECT hot path: one bytearray, no per-row message objects."""
    column_count = len(encoders)
    pack_length = _INT32.pack
    pack_header = _DATA_ROW_HEADER.pack
    for row in rows:
        if len(row) != column_count:
            raise ValueError(f"row has {len(row)} values but the result has {column_count} columns")
        parts = []
        size = 6  # length field + column count
        for value, encode in zip(row, encoders, strict=True):
            if value is None:
                parts.append(_NULL_CELL)
                size += 4
            else:
                cell = encode(value)
                parts.append(pack_length(len(cell)))
                parts.append(cell)
                size += 4 + len(cell)
        out += pack_header(b"D", size, column_count)
        out += b"".join(parts)


def command_complete(tag: str) -> bytes:
    return _message(b"C", _cstring(tag))


def empty_query_response() -> bytes:
    return b"I\0\0\0\4"


def _error_fields(severity: str, sqlstate: str, message: str, detail: str | None, hint: str | None,
                  position: int | None) -> bytes:
    fields = [b"S", _cstring(severity), b"V", _cstring(severity), b"C", _cstring(sqlstate),
              b"M", _cstring(message)]
    if detail is not None:
        fields += [b"D", _cstring(detail)]
    if hint is not None:
        fields += [b"H", _cstring(hint)]
    if position is not None:
        fields += [b"P", _cstring(str(position))]
    fields.append(b"\0")
    return b"".join(fields)


def error_response(severity: str, sqlstate: str, message: str, *, detail: str | None = None,
                   hint: str | None = None, position: int | None = None) -> bytes:
    return _message(b"E", _error_fields(severity, sqlstate, message, detail, hint, position))


def notice_response(severity: str, sqlstate: str, message: str, *, detail: str | None = None,
                    hint: str | None = None) -> bytes:
    return _message(b"N", _error_fields(severity, sqlstate, message, detail, hint, None))


def parse_complete() -> bytes:
    return b"1\0\0\0\4"


def bind_complete() -> bytes:
    return b"2\0\0\0\4"


def close_complete() -> bytes:
    return b"3\0\0\0\4"


def no_data() -> bytes:
    return b"n\0\0\0\4"


def portal_suspended() -> bytes:
    return b"s\0\0\0\4"


def parameter_description(type_oids: Sequence[int]) -> bytes:
    return _message(b"t", _INT16.pack(len(type_oids)) + b"".join(_UINT32.pack(oid) for oid in type_oids))
