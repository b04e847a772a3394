"""Codecs for date, time, timestamp, timestamptz and interval.

Text output follows PostgreSQL with DateStyle=ISO, IntervalStyle=postgres and the session's TimeZone
(time_zone.py); binary values count days or microseconds from PostgreSQL's epoch, 2000-01-01 (UTC for
timestamptz).
"""

from __future__ import annotations

import re
import struct
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal

from headrace.pgwire.types.base import OutOfRange, TypeCodec, Unsupported
from headrace.pgwire.types.time_zone import offset_text, session_zone

_EPOCH_ORDINAL = date(2000, 1, 1).toordinal()
_EPOCH_NAIVE = datetime(2000, 1, 1)
_EPOCH_UTC = datetime(2000, 1, 1, tzinfo=timezone.utc)
_US_PER_SECOND = 1_000_000
_US_PER_DAY = 86_400 * _US_PER_SECOND
_ONE_MICROSECOND = timedelta(microseconds=1)
_INT32 = struct.Struct("!i")
_INT64 = struct.Struct("!q")
_INTERVAL = struct.Struct("!qii")  # microseconds, days, months
# PostgreSQL encodes +-infinity as the extreme integers; Python's date/datetime cannot hold them.
_INFINITIES_32 = (0x7FFFFFFF, -0x80000000)
_INFINITIES_64 = (0x7FFFFFFFFFFFFFFF, -0x8000000000000000)


def _fraction(microsecond: int) -> str:
    return f".{microsecond:06d}".rstrip("0") if microsecond else ""


def _refuse_special_words(text: str) -> None:
    if text.strip().lower() in ("infinity", "-infinity", "+infinity"):
        raise Unsupported(f'"{text.strip()}" has no Python equivalent')


# --- date ---------------------------------------------------------------------------------------

def _encode_date_text(value: date) -> bytes:
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}".encode("ascii")


def _decode_date_text(text: str) -> date:
    _refuse_special_words(text)
    word = text.strip()
    return date(1970, 1, 1) if word.lower() == "epoch" else date.fromisoformat(word)


def _decode_date_binary(data: bytes) -> date:
    days = _INT32.unpack(data)[0]
    if days in _INFINITIES_32:
        raise Unsupported("infinite date")
    try:
        return date.fromordinal(days + _EPOCH_ORDINAL)
    except (ValueError, OverflowError):
        raise OutOfRange("date out of range") from None


DATE = TypeCodec(
    encode_text=_encode_date_text,
    encode_binary=lambda value: _INT32.pack(value.toordinal() - _EPOCH_ORDINAL),
    decode_text=_decode_date_text,
    decode_binary=_decode_date_binary,
)


# --- time ---------------------------------------------------------------------------------------

def _encode_time_text(value: time) -> bytes:
    return f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}{_fraction(value.microsecond)}".encode("ascii")


def _encode_time_binary(value: time) -> bytes:
    seconds = value.hour * 3600 + value.minute * 60 + value.second
    return _INT64.pack(seconds * _US_PER_SECOND + value.microsecond)


def _decode_time_binary(data: bytes) -> time:
    micros = _INT64.unpack(data)[0]
    if not 0 <= micros < _US_PER_DAY:
        raise OutOfRange("time out of range")
    return (datetime.min + timedelta(microseconds=micros)).time()


TIME = TypeCodec(_encode_time_text, _encode_time_binary, lambda text: time.fromisoformat(text.strip()),
                 _decode_time_binary)


# --- timestamp / timestamptz --------------------------------------------------------------------

def _as_utc_naive(value: datetime) -> datetime:
    """The UTC wall-clock time of an aware datetime; a naive one is taken to be UTC already."""
    if value.tzinfo is None:
        return value
    if value.tzinfo is not timezone.utc:
        value = value.astimezone(timezone.utc)
    return value.replace(tzinfo=None)


def _format_timestamp(value: datetime) -> str:
    """A naive datetime as PostgreSQL prints it: like isoformat, without trailing fraction zeros."""
    if type(value) is datetime:  # subclasses (e.g. pandas.Timestamp) may print nanoseconds
        text = value.isoformat(" ")  # C-implemented: the hot path of timestamp columns
        return text.rstrip("0") if value.microsecond else text
    return (f"{value.year:04d}-{value.month:02d}-{value.day:02d} {value.hour:02d}:{value.minute:02d}:"
            f"{value.second:02d}{_fraction(value.microsecond)}")


def _decode_timestamp_micros(data: bytes, epoch: datetime) -> datetime:
    micros = _INT64.unpack(data)[0]
    if micros in _INFINITIES_64:
        raise Unsupported("infinite timestamp")
    try:
        return epoch + timedelta(microseconds=micros)
    except OverflowError:
        raise OutOfRange("timestamp out of range") from None


def _parse_timestamp(text: str) -> datetime:
    _refuse_special_words(text)
    word = text.strip()
    if word.lower() == "epoch":
        return datetime(1970, 1, 1, tzinfo=timezone.utc)
    return datetime.fromisoformat(word)


def _decode_timestamp_text(text: str) -> datetime:
    # PostgreSQL ignores a time zone given for a timestamp without time zone.
    return _parse_timestamp(text).replace(tzinfo=None)


def _decode_timestamptz_text(text: str) -> datetime:
    parsed = _parse_timestamp(text)
    if parsed.tzinfo is None:  # a local time of the session's TimeZone
        parsed = parsed.replace(tzinfo=session_zone() or timezone.utc)
    return parsed.astimezone(timezone.utc)


def _encode_timestamptz_text(value: datetime) -> bytes:
    """In the session's TimeZone with its offset, as PostgreSQL prints it (a naive value is UTC)."""
    zone = session_zone()
    if zone is None:
        if type(value) is datetime and value.tzinfo is timezone.utc:  # hot path: isoformat is C
            text = value.isoformat(" ")[:-6]  # drop "+00:00"
            return ((text.rstrip("0") if value.microsecond else text) + "+00").encode("ascii")
        return (_format_timestamp(_as_utc_naive(value)) + "+00").encode("ascii")
    local = (value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)).astimezone(zone)
    return (_format_timestamp(local.replace(tzinfo=None)) + offset_text(local.utcoffset())).encode("ascii")


def _encode_timestamp_binary(value: datetime) -> bytes:
    # Datetime subtraction is C and honours any UTC offset of an aware value.
    epoch = _EPOCH_NAIVE if value.tzinfo is None else _EPOCH_UTC
    return _INT64.pack((value - epoch) // _ONE_MICROSECOND)


TIMESTAMP = TypeCodec(
    encode_text=lambda value: _format_timestamp(_as_utc_naive(value)).encode("ascii"),
    encode_binary=_encode_timestamp_binary,
    decode_text=_decode_timestamp_text,
    decode_binary=lambda data: _decode_timestamp_micros(data, _EPOCH_NAIVE),
)
TIMESTAMPTZ = TypeCodec(
    encode_text=_encode_timestamptz_text,
    encode_binary=_encode_timestamp_binary,
    decode_text=_decode_timestamptz_text,
    decode_binary=lambda data: _decode_timestamp_micros(data, _EPOCH_UTC),
)


# --- interval -----------------------------------------------------------------------------------
# A timedelta has no months, so intervals carrying months are read with PostgreSQL's own
# convention for comparing intervals: 1 month = 30 days (and 1 year = 12 months).

def _split_days(value: timedelta) -> tuple[int, int]:
    """(days, microseconds) with the same sign, so -1 hour prints '-01:00:00', not '-1 days +23:00:00'."""
    total = (value.days * 86_400 + value.seconds) * _US_PER_SECOND + value.microseconds
    days = abs(total) // _US_PER_DAY * (1 if total >= 0 else -1)
    return days, total - days * _US_PER_DAY


def _encode_interval_text(value: timedelta) -> bytes:
    days, micros = _split_days(value)
    parts = [f"{days} day{'' if days == 1 else 's'}"] if days else []
    if micros or not days:
        sign = "-" if micros < 0 else ""
        seconds, fraction = divmod(abs(micros), _US_PER_SECOND)
        minutes, second = divmod(seconds, 60)
        hour, minute = divmod(minutes, 60)
        parts.append(f"{sign}{hour:02d}:{minute:02d}:{second:02d}{_fraction(fraction)}")
    return " ".join(parts).encode("ascii")


def _encode_interval_binary(value: timedelta) -> bytes:
    days, micros = _split_days(value)
    return _INTERVAL.pack(micros, days, 0)


def _decode_interval_binary(data: bytes) -> timedelta:
    micros, days, months = _INTERVAL.unpack(data)
    try:
        return timedelta(days=days + 30 * months, microseconds=micros)
    except OverflowError:
        raise OutOfRange("interval out of range") from None


_UNIT_MICROS = {  # exact integers: amounts are multiplied as Decimals, so large intervals stay exact
    "microsecond": 1, "millisecond": 1000, "second": _US_PER_SECOND, "minute": 60 * _US_PER_SECOND,
    "hour": 3600 * _US_PER_SECOND, "day": _US_PER_DAY, "week": 7 * _US_PER_DAY, "month": 30 * _US_PER_DAY,
    "year": 360 * _US_PER_DAY, "decade": 3600 * _US_PER_DAY, "century": 36_000 * _US_PER_DAY,
    "millennium": 360_000 * _US_PER_DAY,
}
_UNIT_ALIASES = {
    "us": "microsecond", "usec": "microsecond", "usecs": "microsecond", "microseconds": "microsecond",
    "ms": "millisecond", "msec": "millisecond", "msecs": "millisecond", "milliseconds": "millisecond",
    "s": "second", "sec": "second", "secs": "second", "seconds": "second",
    "m": "minute", "min": "minute", "mins": "minute", "minutes": "minute",
    "h": "hour", "hr": "hour", "hrs": "hour", "hours": "hour",
    "d": "day", "days": "day", "w": "week", "weeks": "week",
    "mon": "month", "mons": "month", "months": "month", "y": "year", "yr": "year", "yrs": "year",
    "years": "year", "decades": "decade", "centuries": "century", "millennia": "millennium",
}
_TOKEN = re.compile(
    r"\s*(?:(?P<time>[+-]?\d+:\d{1,2}(?::\d{1,2}(?:\.\d*)?)?)"
    r"|(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))\s*(?P<unit>[a-z]+)?)\s*,?")
_ISO_INTERVAL = re.compile(
    r"P(?:(?P<year>[+-]?\d+(?:\.\d+)?)Y)?(?:(?P<month>[+-]?\d+(?:\.\d+)?)M)?(?:(?P<week>[+-]?\d+(?:\.\d+)?)W)?"
    r"(?:(?P<day>[+-]?\d+(?:\.\d+)?)D)?(?:T(?:(?P<hour>[+-]?\d+(?:\.\d+)?)H)?"
    r"(?:(?P<minute>[+-]?\d+(?:\.\d+)?)M)?(?:(?P<second>[+-]?\d+(?:\.\d+)?)S)?)?")


def _decode_interval_text(text: str) -> timedelta:
    """PostgreSQL-style ('1 day 02:03:04.5', '@ 3 mins ago', '-1 day +2:00'), bare seconds ('90')
    and ISO 8601 ('P1DT2H') intervals."""
    word = text.strip().lower()
    iso = _ISO_INTERVAL.fullmatch(word.upper()) if word.startswith("p") else None
    if iso is not None:
        micros = sum(Decimal(amount) * _UNIT_MICROS[unit] for unit, amount in iso.groupdict().items()
                     if amount is not None)
        return timedelta(microseconds=round(micros))
    ago = word.endswith(" ago")
    word = word.removesuffix(" ago").removeprefix("@").strip()
    if not word:
        raise ValueError(text)
    total_us = 0
    position = 0
    while position < len(word):
        token = _TOKEN.match(word, position)
        if token is None or token.end() == position:
            raise ValueError(text)
        position = token.end()
        if token["time"] is not None:
            total_us += _time_field_micros(token["time"])
            continue
        unit = token["unit"] or "second"
        unit = _UNIT_ALIASES.get(unit, unit)
        if unit not in _UNIT_MICROS:
            raise ValueError(text)
        total_us += round(Decimal(token["number"]) * _UNIT_MICROS[unit])
    return timedelta(microseconds=-total_us if ago else total_us)


def _time_field_micros(field: str) -> int:
    negative = field.startswith("-")
    pieces = field.lstrip("+-").split(":")
    hours, minutes = int(pieces[0]), int(pieces[1])
    seconds = Decimal(pieces[2]) if len(pieces) > 2 else Decimal(0)
    micros = (hours * 3600 + minutes * 60) * _US_PER_SECOND + round(seconds * _US_PER_SECOND)
    return -micros if negative else micros


INTERVAL = TypeCodec(_encode_interval_text, _encode_interval_binary, _decode_interval_text,
                     _decode_interval_binary)
