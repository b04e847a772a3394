"""Run-time values of the types webhook CHECKs need beyond text, numbers and jsonb: bytea,
timestamptz, interval, double precision, map (headers) and text[] (regexp_match).

Representations, chosen so per-request evaluation stays cheap:
- bytea: `bytes`; timestamptz: `int` microseconds since the Unix epoch (UTC, the session TimeZone);
- interval: `int` microseconds (a month counts as 30 days, PostgreSQL's convention when comparing
  intervals; calendar-month arithmetic is not supported);
- double precision: `float`; map: `dict[str, str]`; text[]: `list[str | None]`.
Text input and output follow PostgreSQL (bytea_output = hex, DateStyle ISO, IntervalStyle postgres).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from headrace.errors import DataError
from headrace.pgwire.types.temporal import INTERVAL, TIMESTAMPTZ

US_PER_SECOND = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_HEX_DIGITS = re.compile(r"[0-9a-fA-F\s]*")
# Timestamps PostgreSQL can hold, as microseconds since 1970 (4713 BC .. 294276 AD).
_MIN_TIMESTAMP_US = -210_866_803_200 * US_PER_SECOND
_MAX_TIMESTAMP_US = 9_224_318_016_000 * US_PER_SECOND


def _invalid(type_name: str, text: str) -> DataError:
    return DataError(f'invalid input syntax for type {type_name}: "{text}"', sqlstate="22P02")


# -- bytea ------------------------------------------------------------------------------------

def parse_bytea(text: str) -> bytes:
    """bytea input: hex format ('\\x0a0b') or escape format ('a\\000b', '\\\\' for a backslash)."""
    if text.startswith("\\x"):
        digits = text[2:]
        if not _HEX_DIGITS.fullmatch(digits):
            raise DataError(f'invalid hexadecimal digit: "{_first_bad_hex(digits)}"', sqlstate="22023")
        compact = "".join(digits.split())
        if len(compact) % 2:
            raise DataError("invalid hexadecimal data: odd number of digits", sqlstate="22023")
        return bytes.fromhex(compact)
    return decode_escape(text, "bytea")


def _first_bad_hex(digits: str) -> str:
    return next((c for c in digits if not (c.isspace() or c in "0123456789abcdefABCDEF")), "?")


def bytea_text(value: bytes) -> str:
    return "\\x" + value.hex()


def decode_escape(text: str, type_name: str = "bytea") -> bytes:
    """decode(text, 'escape') and bytea's escape input: \\\\ is a backslash, \\ooo an octal byte."""
    out = bytearray()
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\":
            out += char.encode("utf-8")
            index += 1
        elif text[index + 1 : index + 2] == "\\":
            out.append(0x5C)
            index += 2
        elif re.fullmatch(r"[0-3][0-7][0-7]", text[index + 1 : index + 4]):
            out.append(int(text[index + 1 : index + 4], 8))
            index += 4
        else:
            raise _invalid(type_name, text)
    return bytes(out)


def encode_escape(value: bytes) -> str:
    """encode(bytea, 'escape'): NUL and bytes >= 0x80 as \\ooo, a backslash doubled."""
    parts = []
    for byte in value:
        if byte == 0x5C:
            parts.append("\\\\")
        elif byte == 0 or byte >= 0x80:
            parts.append(f"\\{byte:03o}")
        else:
            parts.append(chr(byte))
    return "".join(parts)


# -- timestamptz ------------------------------------------------------------------------------

def check_timestamp(micros: int) -> int:
    if not _MIN_TIMESTAMP_US <= micros < _MAX_TIMESTAMP_US:
        raise DataError("timestamp out of range", sqlstate="22008")
    return micros


def parse_timestamptz(text: str) -> int:
    try:
        moment = TIMESTAMPTZ.decode_text(text)
    except (ValueError, OverflowError):
        raise _invalid("timestamp with time zone", text) from None
    return check_timestamp((moment - _EPOCH) // timedelta(microseconds=1))


def timestamptz_text(micros: int) -> str:
    moment = _EPOCH + timedelta(microseconds=micros)
    return TIMESTAMPTZ.encode_text(moment).decode("ascii")


def seconds_to_timestamp(seconds: int | float | Decimal) -> int:
    """to_timestamp(double precision): seconds since the epoch, rounded to microseconds."""
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise DataError("timestamp cannot be NaN" if math.isnan(seconds) else "timestamp out of range",
                        sqlstate="22008")
    micros = seconds * US_PER_SECOND if isinstance(seconds, int) else round(Decimal(str(seconds)) * US_PER_SECOND)
    return check_timestamp(int(micros))


# -- interval ---------------------------------------------------------------------------------

def parse_interval(text: str) -> int:
    try:
        span = INTERVAL.decode_text(text)
    except (ValueError, OverflowError, ArithmeticError):
        raise _invalid("interval", text) from None
    return span // timedelta(microseconds=1)


def interval_text(micros: int) -> str:
    return INTERVAL.encode_text(timedelta(microseconds=micros)).decode("ascii")


# -- double precision ---------------------------------------------------------------------------

def parse_double(text: str) -> float:
    word = text.strip().lower()
    special = {"nan": math.nan, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf,
               "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}.get(word)
    if special is not None:
        return special
    try:
        if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?", word):
            raise ValueError(word)
        return float(word)
    except ValueError:
        raise _invalid("double precision", text) from None


def double_text(value: float) -> str:
    """float8out: the shortest digits that read back exactly, in exponent notation below 1e-4 and
    from 1e15 on ('1', '0.1', '1e+15', '1.5e-05', 'Infinity')."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    number = Decimal(repr(value))
    sign, digit_tuple, exponent = number.as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    power = len(digit_tuple) + int(exponent) - 1
    if -4 <= power < 15:
        return format(number.normalize(), "f")
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"


# -- text[] and map -------------------------------------------------------------------------------

def text_array_text(values: list[str | None]) -> str:
    """array_out for text[]: elements quoted when they need it."""
    def element(item: str | None) -> str:
        if item is None:
            return "NULL"
        if item == "" or item.upper() == "NULL" or any(c in item for c in '{},"\\ \t\n'):
            return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return item
    return "{" + ",".join(element(item) for item in values) + "}"


def map_text(value: dict[str, str]) -> str:
    """Materialize's map output: {a=>b,c=>d}, keys in order."""
    def quote(item: str) -> str:
        if item == "" or any(c in item for c in '{},"\\=> \t\n'):
            return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return item
    return "{" + ",".join(f"{quote(k)}=>{quote(v)}" for k, v in sorted(value.items())) + "}"


def number_to_double(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:
        raise DataError("value out of range: overflow", sqlstate="22003") from None


Converter = Callable[[Any], Any]
