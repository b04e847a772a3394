"""PostgreSQL types on the wire: OIDs, and text/binary encoding of result values and decoding of
Bind parameters. Unknown OIDs are treated as text (their binary form is then UTF-8 text too).

    encoder = value_encoder(INT4, BINARY)     # resolve once per result column (hot path)
    encoder(42) -> b"\\0\\0\\0*"
    decode_parameter(INT4, TEXT_FORMAT, b"42") -> 42   # raises HeadraceError with a 22xxx SQLSTATE
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from headrace.errors import FeatureNotSupported, HeadraceError
from headrace.pgwire.types import scalars, temporal
from headrace.pgwire.types.arrays import make_array_codec
from headrace.pgwire.types.base import Encoder, OutOfRange, TypeCodec, Unsupported

TEXT_FORMAT = 0
BINARY_FORMAT = 1

BOOL = 16
BYTEA = 17
CHAR = 18
NAME = 19
INT8 = 20
INT2 = 21
INT4 = 23
TEXT = 25
OID = 26
JSON = 114
FLOAT4 = 700
FLOAT8 = 701
UNKNOWN = 705
BPCHAR = 1042
VARCHAR = 1043
DATE = 1082
TIME = 1083
TIMESTAMP = 1114
TIMESTAMPTZ = 1184
INTERVAL = 1186
NUMERIC = 1700
UUID = 2950
JSONB = 3802


@dataclass(frozen=True, slots=True)
class PgType:
    oid: int
    name: str  # as PostgreSQL names it in error messages
    size: int  # pg_type.typlen: RowDescription's type size (-1 = variable length)
    codec: TypeCodec
    array_oid: int | None = None
    element_oid: int | None = None  # set for array types


_SCALARS = [
    # oid, name, size, codec, array oid
    (BOOL, "boolean", 1, scalars.BOOL, 1000),
    (BYTEA, "bytea", -1, scalars.BYTEA, 1001),
    (CHAR, '"char"', 1, scalars.TEXT, 1002),
    (NAME, "name", 64, scalars.TEXT, 1003),
    (INT8, "bigint", 8, scalars.INT8, 1016),
    (INT2, "smallint", 2, scalars.INT2, 1005),
    (INT4, "integer", 4, scalars.INT4, 1007),
    (TEXT, "text", -1, scalars.TEXT, 1009),
    (OID, "oid", 4, scalars.OID, 1028),
    (JSON, "json", -1, scalars.JSON, 199),
    (FLOAT4, "real", 4, scalars.FLOAT4, 1021),
    (FLOAT8, "double precision", 8, scalars.FLOAT8, 1022),
    (UNKNOWN, "unknown", -2, scalars.TEXT, None),
    (BPCHAR, "character", -1, scalars.TEXT, 1014),
    (VARCHAR, "character varying", -1, scalars.TEXT, 1015),
    (DATE, "date", 4, temporal.DATE, 1182),
    (TIME, "time without time zone", 8, temporal.TIME, 1183),
    (TIMESTAMP, "timestamp without time zone", 8, temporal.TIMESTAMP, 1115),
    (TIMESTAMPTZ, "timestamp with time zone", 8, temporal.TIMESTAMPTZ, 1185),
    (INTERVAL, "interval", 16, temporal.INTERVAL, 1187),
    (NUMERIC, "numeric", -1, scalars.NUMERIC, 1231),
    (UUID, "uuid", 16, scalars.UUID, 2951),
    (JSONB, "jsonb", -1, scalars.JSONB, 3807),
]


def _build_registry() -> dict[int, PgType]:
    registry: dict[int, PgType] = {}
    for oid, name, size, codec, array_oid in _SCALARS:
        registry[oid] = PgType(oid, name, size, codec, array_oid=array_oid)
        if array_oid is not None:
            registry[array_oid] = PgType(array_oid, f"{name}[]", -1, make_array_codec(oid, codec),
                                         element_oid=oid)
    return registry


TYPES: dict[int, PgType] = _build_registry()
_FALLBACK = PgType(0, "unknown", -1, scalars.TEXT)  # any OID we do not know travels as text


def pg_type(oid: int) -> PgType:
    return TYPES.get(oid, _FALLBACK)


def type_size(oid: int) -> int:
    return pg_type(oid).size


def array_oid_of(element_oid: int) -> int | None:
    return pg_type(element_oid).array_oid


def value_encoder(oid: int, format_code: int) -> Encoder:
    """The function that turns a non-NULL value of this type into wire bytes in this format."""
    codec = pg_type(oid).codec
    if format_code == TEXT_FORMAT:
        return codec.encode_text
    if format_code == BINARY_FORMAT:
        return codec.encode_binary
    raise HeadraceError(f"unsupported format code: {format_code}", sqlstate="22023")


def cell_encoder(oid: int, raw_format: int, format_code: int) -> Encoder:
    """A column's encoder into `format_code`: `raw_format` -1, values are Python objects (value_encoder); 0 or 1,
    they are PostgreSQL's own bytes in that format already (the store PostgreSQL's rows): as they are, or
    re-encoded into the other format through this type's codec."""
    if raw_format < 0:
        return value_encoder(oid, format_code)
    if raw_format == format_code:
        return _as_is
    return raw_converter(oid, raw_format, format_code)


def _as_is(value: Any) -> bytes:
    return value  # type: ignore[no-any-return]


def raw_converter(oid: int, from_format: int, to_format: int) -> Encoder:
    """PostgreSQL's bytes of one format re-encoded in the other (a client mixing formats per column, a binary
    COPY of text rows) through this type's codec; a type without one cannot be re-encoded (0A000)."""
    if oid not in TYPES:
        raise FeatureNotSupported(f"type {oid} cannot be re-encoded from the "
                                  f"{'binary' if from_format else 'text'} format into the "
                                  f"{'binary' if to_format else 'text'} format")
    codec = TYPES[oid].codec
    decode = (lambda data: codec.decode_text(data.decode())) if from_format == TEXT_FORMAT else codec.decode_binary
    encode = value_encoder(oid, to_format)
    return lambda value: encode(decode(value))


def encode_value(oid: int, format_code: int, value: Any) -> bytes | None:
    return None if value is None else value_encoder(oid, format_code)(value)


# Exceptions a decoder raises on bad input (decimal.InvalidOperation is an ArithmeticError).
_BAD_INPUT = (ValueError, ArithmeticError, IndexError, struct.error, TypeError)


def decode_parameter(oid: int, format_code: int, data: bytes | None) -> Any:
    """A Bind parameter's Python value; errors carry PostgreSQL's SQLSTATEs (22P02 bad text, 22P03 bad
    binary, 22003 out of range, 22021 bad UTF-8, 0A000 no Python equivalent)."""
    if data is None:
        return None
    target = pg_type(oid)
    if format_code not in (TEXT_FORMAT, BINARY_FORMAT):
        raise HeadraceError(f"unsupported format code: {format_code}", sqlstate="22023")
    try:
        if format_code == TEXT_FORMAT:
            text = data.decode("utf-8")
            return target.codec.decode_text(text)
        return target.codec.decode_binary(data)
    except UnicodeDecodeError:
        raise HeadraceError('invalid byte sequence for encoding "UTF8"', sqlstate="22021") from None
    except Unsupported as exc:
        raise FeatureNotSupported(f"{target.name} value not supported: {exc}") from None
    except OutOfRange:
        shown = data.decode("utf-8", "replace") if format_code == TEXT_FORMAT else "binary value"
        raise HeadraceError(f'value "{shown}" is out of range for type {target.name}',
                            sqlstate="22003") from None
    except _BAD_INPUT:
        if format_code == TEXT_FORMAT:
            raise HeadraceError(f'invalid input syntax for type {target.name}: "{text}"',
                                sqlstate="22P02") from None
        raise HeadraceError(f"incorrect binary data format for type {target.name}",
                            sqlstate="22P03") from None


__all__ = [
    "BINARY_FORMAT", "BOOL", "BPCHAR", "BYTEA", "CHAR", "DATE", "FLOAT4", "FLOAT8", "INT2", "INT4",
    "INT8", "INTERVAL", "JSON", "JSONB", "NAME", "NUMERIC", "OID", "TEXT", "TEXT_FORMAT", "TIME",
    "TIMESTAMP", "TIMESTAMPTZ", "TYPES", "UNKNOWN", "UUID", "VARCHAR", "PgType", "array_oid_of",
    "cell_encoder", "decode_parameter", "encode_value", "pg_type", "raw_converter", "type_size", "value_encoder",
]
