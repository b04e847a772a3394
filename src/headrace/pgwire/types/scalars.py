"""Codecs for bool, integers, floats, numeric, text-like types, bytea, uuid, json/jsonb and oid."""

from __future__ import annotations

import json
import math
import struct
import uuid
from decimal import Decimal
from typing import Any

from headrace.pgwire.types.base import OutOfRange, TypeCodec

# --- bool ---------------------------------------------------------------------------------------

_TRUE_WORDS = frozenset({"t", "tr", "tru", "true", "y", "ye", "yes", "on", "1"})
_FALSE_WORDS = frozenset({"f", "fa", "fal", "fals", "false", "n", "no", "of", "off", "0"})


def _decode_bool_text(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise ValueError(text)


def _decode_bool_binary(data: bytes) -> bool:
    if len(data) != 1:
        raise ValueError("bool is one byte")
    return data != b"\0"


BOOL = TypeCodec(
    encode_text=lambda value: b"t" if value else b"f",
    encode_binary=lambda value: b"\1" if value else b"\0",
    decode_text=_decode_bool_text,
    decode_binary=_decode_bool_binary,
)


# --- integers and oid ---------------------------------------------------------------------------

def _encode_int_text(value: Any) -> bytes:
    return b"%d" % value


def _integer_codec(fmt: str, low: int, high: int) -> TypeCodec:
    packer = struct.Struct(fmt)

    def decode_text(text: str) -> int:
        number = int(text.strip())
        if not low <= number <= high:
            raise OutOfRange(text)
        return number

    def decode_binary(data: bytes) -> int:
        return int(packer.unpack(data)[0])

    return TypeCodec(_encode_int_text, packer.pack, decode_text, decode_binary)


INT2 = _integer_codec("!h", -(1 << 15), (1 << 15) - 1)
INT4 = _integer_codec("!i", -(1 << 31), (1 << 31) - 1)
INT8 = _integer_codec("!q", -(1 << 63), (1 << 63) - 1)
OID = _integer_codec("!I", 0, (1 << 32) - 1)


# --- floats -------------------------------------------------------------------------------------

def format_float(value: float, fixed_exponent_limit: int) -> str:
    """PostgreSQL's float output (shortest round-trip digits, as since PostgreSQL 12): fixed notation
    for decimal exponents in [-4, limit), else d.ddde+XX; integral values print without '.0'."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    return _format_shortest(Decimal(repr(value)), fixed_exponent_limit)


def _format_shortest(shortest: Decimal, fixed_exponent_limit: int) -> str:
    sign, digits, exponent = shortest.as_tuple()
    assert isinstance(exponent, int)  # finite
    return _place_decimal_point("-" if sign else "", "".join(map(str, digits)), exponent,
                                fixed_exponent_limit)


def _place_decimal_point(sign: str, digits: str, exponent: int, fixed_exponent_limit: int) -> str:
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped or "0"
    decimal_exponent = exponent + len(digits) - 1  # exponent of the leading digit
    if -4 <= decimal_exponent < fixed_exponent_limit:
        if exponent >= 0:
            return sign + digits + "0" * exponent
        point = len(digits) + exponent
        if point > 0:
            return f"{sign}{digits[:point]}.{digits[point:]}"
        return f"{sign}0.{'0' * -point}{digits}"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'-' if decimal_exponent < 0 else '+'}{abs(decimal_exponent):02d}"


_FLOAT4 = struct.Struct("!f")
_FLOAT8 = struct.Struct("!d")


def _to_float32(value: float) -> float:
    return float(_FLOAT4.unpack(_FLOAT4.pack(value))[0])


def _encode_float4_text(value: Any) -> bytes:
    single = _to_float32(float(value))
    if math.isnan(single) or math.isinf(single) or single == 0:
        return format_float(single, 6).encode("ascii")
    for precision in range(1, 10):  # shortest digit count that reads back as the same float32
        candidate = f"{single:.{precision - 1}e}"
        try:
            if _to_float32(float(candidate)) == single:
                break
        except OverflowError:  # rounded up past the largest float32: needs more digits
            continue
    return _format_shortest(Decimal(candidate), 6).encode("ascii")


def _decode_float_text(text: str) -> float:
    if "_" in text:  # Python's float() accepts digit separators, PostgreSQL's float input does not
        raise ValueError(text)
    return float(text.strip())


def _decode_float4_text(text: str) -> float:
    number = _decode_float_text(text)
    try:
        return _to_float32(number)
    except OverflowError:
        raise OutOfRange(text) from None


FLOAT4 = TypeCodec(
    encode_text=_encode_float4_text,
    encode_binary=lambda value: _FLOAT4.pack(value),
    decode_text=_decode_float4_text,
    decode_binary=lambda data: _FLOAT4.unpack(data)[0],
)
def _encode_float8_text(value: Any) -> bytes:
    number = float(value)
    if 1e-4 <= abs(number) < 1e15:
        # Hot path: here Python's repr is PostgreSQL's output (same shortest digits, fixed
        # notation) except for a trailing ".0".
        text = repr(number)
        return (text[:-2] if text.endswith(".0") else text).encode("ascii")
    return format_float(number, 15).encode("ascii")


FLOAT8 = TypeCodec(
    encode_text=_encode_float8_text,
    encode_binary=lambda value: _FLOAT8.pack(value),
    decode_text=_decode_float_text,
    decode_binary=lambda data: _FLOAT8.unpack(data)[0],
)


# --- numeric ------------------------------------------------------------------------------------

def _as_decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))  # the float's shortest digits, not its binary expansion
    return Decimal(value)


def _encode_numeric_text(value: Any) -> bytes:
    if isinstance(value, int):
        return b"%d" % value
    number = _as_decimal(value)
    if number.is_nan():
        return b"NaN"
    if number.is_infinite():
        return b"-Infinity" if number.is_signed() else b"Infinity"
    if number.is_zero():
        number = number.copy_abs()  # PostgreSQL's numeric has no negative zero
    return format(number, "f").encode("ascii")


_NUMERIC_HEADER = struct.Struct("!hhHh")  # ndigits, weight, sign, display scale
_NUMERIC_POSITIVE, _NUMERIC_NEGATIVE = 0x0000, 0x4000
_NUMERIC_NAN, _NUMERIC_PINF, _NUMERIC_NINF = 0xC000, 0xD000, 0xF000


def _encode_numeric_binary(value: Any) -> bytes:
    """Binary numeric: base-10000 digit groups aligned on the decimal point, plus weight (exponent
    of the first group) and display scale (digits after the point)."""
    number = _as_decimal(value)
    if number.is_nan():
        return _NUMERIC_HEADER.pack(0, 0, _NUMERIC_NAN, 0)
    if number.is_infinite():
        return _NUMERIC_HEADER.pack(0, 0, _NUMERIC_NINF if number.is_signed() else _NUMERIC_PINF, 0)
    text = format(number, "f")  # plain digits, C-implemented; cheaper than walking as_tuple()
    negative = text.startswith("-")
    integer, _, fraction = text.lstrip("-").partition(".")
    integer = integer.lstrip("0")
    integer_padding = -len(integer) % 4
    digits = "0" * integer_padding + integer + fraction + "0" * (-len(fraction) % 4)
    groups = [int(digits[i:i + 4]) for i in range(0, len(digits), 4)]
    weight = (integer_padding + len(integer)) // 4 - 1
    first = 0
    while first < len(groups) and groups[first] == 0:
        first += 1
    last = len(groups)
    while last > first and groups[last - 1] == 0:
        last -= 1
    groups = groups[first:last]
    weight = weight - first if groups else 0
    sign_word = _NUMERIC_NEGATIVE if negative and groups else _NUMERIC_POSITIVE
    header = _NUMERIC_HEADER.pack(len(groups), weight, sign_word, len(fraction))
    return header + struct.pack(f"!{len(groups)}h", *groups)


def _decode_numeric_binary(data: bytes) -> Decimal:
    group_count, weight, sign_word, display_scale = _NUMERIC_HEADER.unpack_from(data)
    if len(data) != 8 + 2 * group_count:
        raise ValueError("numeric length")
    if sign_word == _NUMERIC_NAN:
        return Decimal("NaN")
    if sign_word in (_NUMERIC_PINF, _NUMERIC_NINF):
        return Decimal("-Infinity" if sign_word == _NUMERIC_NINF else "Infinity")
    if sign_word not in (_NUMERIC_POSITIVE, _NUMERIC_NEGATIVE):
        raise ValueError("numeric sign")
    groups = struct.unpack_from(f"!{group_count}h", data, 8)
    if any(not 0 <= group < 10000 for group in groups):
        raise ValueError("numeric digit")
    digits = "".join(f"{group:04d}" for group in groups)
    exponent = 4 * (weight - group_count + 1)
    if exponent > -display_scale:
        digits += "0" * (exponent + display_scale)
    elif exponent < -display_scale:
        digits = digits[:len(digits) - (-display_scale - exponent)]
    digit_tuple = tuple(int(c) for c in digits.lstrip("0")) or (0,)
    return Decimal((1 if sign_word == _NUMERIC_NEGATIVE else 0, digit_tuple, -display_scale))


def _decode_numeric_text(text: str) -> Decimal:
    number = Decimal(text.strip())
    if number.is_snan():
        raise ValueError(text)
    return number


NUMERIC = TypeCodec(_encode_numeric_text, _encode_numeric_binary, _decode_numeric_text,
                    _decode_numeric_binary)


# --- text-like, bytea, uuid ---------------------------------------------------------------------

def _encode_text(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else str(value).encode("utf-8")


TEXT = TypeCodec(_encode_text, _encode_text, lambda text: text, lambda data: data.decode("utf-8"))


def _encode_bytea_text(value: Any) -> bytes:
    return b"\\x" + bytes(value).hex().encode("ascii")


def _decode_bytea_text(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    # The traditional escape format: \\ for a backslash, \ooo for an octal byte.
    out = bytearray()
    raw = text.encode("utf-8")
    i = 0
    while i < len(raw):
        if raw[i] != 0x5C:
            out.append(raw[i])
            i += 1
        elif raw[i + 1:i + 2] == b"\\":
            out.append(0x5C)
            i += 2
        elif len(raw) >= i + 4 and all(0x30 <= c <= 0x37 for c in raw[i + 1:i + 4]) and raw[i + 1] <= 0x33:
            out.append(int(raw[i + 1:i + 4], 8))
            i += 4
        else:
            raise ValueError(text)
    return bytes(out)


BYTEA = TypeCodec(_encode_bytea_text, bytes, _decode_bytea_text, bytes)

UUID = TypeCodec(
    encode_text=lambda value: str(value).encode("ascii"),
    encode_binary=lambda value: (value if isinstance(value, uuid.UUID) else uuid.UUID(value)).bytes,
    decode_text=lambda text: uuid.UUID(text.strip()),
    decode_binary=lambda data: uuid.UUID(bytes=data),
)


# --- json / jsonb -------------------------------------------------------------------------------
# Result values may be parsed JSON (dict, list, numbers, ...) or a str that already is JSON text.
# Parameters are decoded to validated JSON *text* (str): parsing them would make a JSON string
# indistinguishable from JSON text, while text means the same thing on both sides.

def _encode_json_text(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, ensure_ascii=False).encode("utf-8")  # jsonb's ", " / ": " spacing


def _decode_json_text(text: str) -> str:
    json.loads(text)
    return text


def _decode_jsonb_binary(data: bytes) -> str:
    if data[:1] != b"\1":
        raise ValueError("unsupported jsonb version number")
    return _decode_json_text(data[1:].decode("utf-8"))


JSON = TypeCodec(_encode_json_text, _encode_json_text, _decode_json_text,
                 lambda data: _decode_json_text(data.decode("utf-8")))
JSONB = TypeCodec(_encode_json_text, lambda value: b"\1" + _encode_json_text(value), _decode_json_text,
                  _decode_jsonb_binary)
