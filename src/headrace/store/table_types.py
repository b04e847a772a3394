"""The column types of tables beyond the serving store's first set: numeric(p,s), date, timestamp, uuid and
interval, each held exactly by a native DuckDB type, with their "document form" (the JSON-able value the table
log, the overlay and the serving driver carry; store/table_log.py) and the conversions in and out of it.

| PostgreSQL      | DuckDB (serving store) | document form                                   | Arrow              |
|-----------------|------------------------|-------------------------------------------------|--------------------|
| numeric(p,s)    | DECIMAL(p,s), p <= 38  | decimal text at scale s ("12.50"): exact        | decimal128(p,s)    |
| numeric         | DECIMAL(38,10)         | as numeric(38,10), but refusing, not rounding, more than 10 fractional digits |
| date            | DATE                   | integer days since 1970-01-01                   | date32             |
| timestamp       | TIMESTAMP              | integer microseconds since 1970-01-01 00:00     | timestamp("us")    |
| uuid            | UUID                   | canonical lowercase text                        | string (cast)      |
| interval        | INTERVAL               | integer microseconds (1 month = 30 days, as     | duration("us")     |
|                 |                        | headrace.pgwire.types reads intervals)          |                    |

Values that cannot be held exactly are refused with 22003 (numeric overflow, NaN / Infinity, a bare numeric
with more than 10 fractional digits), never rounded silently; numeric(p,s) rounds to its scale s as PostgreSQL
does (half away from zero). Pure: no DuckDB, no I/O."""

from __future__ import annotations

import datetime
import re
import uuid
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any

MAX_NUMERIC_PRECISION = 38  # DuckDB's DECIMAL holds at most 38 digits exactly
DEFAULT_NUMERIC = (38, 10)  # unconstrained numeric: DECIMAL(38,10)
EXACT_TYPES = frozenset({"numeric", "date", "timestamp", "uuid", "interval"})
_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH = datetime.datetime(1970, 1, 1)
_WIDE = Context(prec=MAX_NUMERIC_PRECISION + 2)  # the default context's 28 digits would round a DECIMAL(38,s)
_DECIMAL_TYPE = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


# PostgreSQL's own encoding of 'infinity' / '-infinity' (DT_NOEND / DT_NOBEGIN, DATEVAL_NOEND / DATEVAL_NOBEGIN): the
# extreme integers, so a document carries them as the number PostgreSQL stores, and they sort as PostgreSQL sorts.
TIME_INFINITY, TIME_MINUS_INFINITY = (1 << 63) - 1, -(1 << 63)  # timestamp, timestamptz: microseconds
DATE_INFINITY, DATE_MINUS_INFINITY = (1 << 31) - 1, -(1 << 31)  # date: days


class Exact:
    """A timestamp or timestamptz as microseconds since 1970-01-01 00:00 (UTC), or a date as days since 1970-01-01,
    as PostgreSQL holds it: any year PostgreSQL takes (4713 BC .. 294276 AD), 'infinity' and '-infinity' as the
    extreme integers. Read from PostgreSQL by store/table_reads_postgres.py's loaders, where Python's datetime
    (years 1..9999, no infinity) cannot hold the value."""

    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number

    def __repr__(self) -> str:
        return f"Exact({self.number})"


def beyond_python(pg_type: str, value: int) -> Exception:
    """The error for a value headrace must hand to pgwire as a Python date / datetime but cannot (RETURNING)."""
    from headrace.errors import FeatureNotSupported

    shown = date_text(value) if pg_type == "date" else time_text(value, with_zone=pg_type == "timestamptz")
    return FeatureNotSupported(f"{pg_type} value {shown} cannot be returned here yet",
                               hint="select it from the table instead")


def infinity_text(pg_type: str, value: int) -> str | None:
    """'infinity' / '-infinity' for a document value of a timestamp(tz) or date that is one, else None."""
    if pg_type in ("timestamp", "timestamptz"):
        return "infinity" if value == TIME_INFINITY else "-infinity" if value == TIME_MINUS_INFINITY else None
    if pg_type == "date":
        return "infinity" if value == DATE_INFINITY else "-infinity" if value == DATE_MINUS_INFINITY else None
    return None


class TypeValueError(Exception):
    """A value that does not fit its column: (sqlstate, message, detail)."""

    def __init__(self, sqlstate: str, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail


def duckdb_type(pg_type: str, precision: int | None = None, scale: int | None = None) -> str:
    if pg_type == "numeric":
        p, s = numeric_shape(precision, scale)
        return f"DECIMAL({p},{s})"
    return {"date": "DATE", "timestamp": "TIMESTAMP", "uuid": "UUID", "interval": "INTERVAL"}[pg_type]


def numeric_shape(precision: int | None, scale: int | None) -> tuple[int, int]:
    if precision is None:
        return DEFAULT_NUMERIC
    return precision, scale or 0


def decimal_shape(store_type: str) -> tuple[int, int] | None:
    """(precision, scale) of a DuckDB DECIMAL(p,s) type name, None for other types."""
    match = _DECIMAL_TYPE.fullmatch(store_type.upper().replace(" ", ""))
    return (int(match[1]), int(match[2])) if match else None


# ---------------------------------------------------------------------------------------------- input

def to_document(pg_type: str, value: Any, precision: int | None = None, scale: int | None = None) -> Any:
    """A Python value (a parameter, a COPY field as text, a DuckDB result) as the document form (not None)."""
    if pg_type == "numeric":
        return numeric_document(value, precision, scale)
    if pg_type == "date":
        return _date_days(value)
    if pg_type == "timestamp":
        return round_time(_timestamp_micros(value), precision)
    if pg_type == "uuid":
        return _uuid_text(value)
    if pg_type == "interval":
        return _interval_micros(value)
    raise TypeValueError("0A000", f"type {pg_type} is not supported in tables")


def numeric_document(value: Any, precision: int | None, scale: int | None) -> str:
    p, s = numeric_shape(precision, scale)
    number = _decimal(value)
    if not number.is_finite():
        raise TypeValueError("22003", f"numeric value {number} cannot be stored in a table column",
                             "the serving store holds finite numbers only (DuckDB DECIMAL)")
    quantum = Decimal(1).scaleb(-s)
    rounded = None
    if number.is_zero() or number.adjusted() < p - s:  # else too large: no need to round (or to try, for 1e999999)
        rounded = number.quantize(quantum, rounding=ROUND_HALF_UP, context=_WIDE)
        if precision is None and rounded != number:
            raise TypeValueError("22003", f"numeric value {format(number, 'f')} has more than {s} fractional digits",
                                 f"an unconstrained numeric column holds numeric({p},{s}) exactly; "
                                 "declare numeric(p,s) to round to a scale")
    if rounded is None or not rounded.is_zero() and rounded.adjusted() >= p - s:
        raise TypeValueError("22003", "numeric field overflow",
                             f"A field with precision {p}, scale {s} must round to an absolute value less than "
                             f"{'1' if p == s else '10^' + str(p - s)}.")
    return format(rounded, "f")


def _decimal(value: Any) -> Decimal:
    if isinstance(value, bool):
        raise _bad("numeric", value)
    if isinstance(value, Decimal):
        return value
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))  # the float's shortest text, as PostgreSQL's float8 -> numeric cast
    if isinstance(value, str):
        text = value.strip()
        try:
            number = Decimal(text)
        except InvalidOperation:
            raise _bad("numeric", value) from None
        if not text or "_" in text:
            raise _bad("numeric", value)
        return number
    raise _wrong_type("numeric", value)


def _date_days(value: Any) -> int:
    if isinstance(value, Exact):
        return value.number
    if isinstance(value, str):
        value = _parse("date", value)
    if isinstance(value, datetime.datetime):
        value = value.date()
    if isinstance(value, datetime.date):
        return (value - _EPOCH_DATE).days
    raise _wrong_type("date", value)


def _timestamp_micros(value: Any) -> int:
    if isinstance(value, Exact):
        return value.number
    if isinstance(value, str):
        value = _parse("timestamp", value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:  # timestamptz -> timestamp: the UTC wall clock (headrace sessions run UTC)
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, datetime.date):
        return (value - _EPOCH_DATE).days * 86_400_000_000
    raise _wrong_type("timestamp", value)


def round_time(micros: int, precision: int | None) -> int:
    """Microseconds rounded to timestamp(p)'s `precision` fractional digits, half away from zero, as PostgreSQL's
    AdjustTimestampForTypmod rounds them (+-infinity untouched)."""
    if precision is None or precision >= 6 or micros in (TIME_INFINITY, TIME_MINUS_INFINITY):
        return micros
    unit = 10 ** (6 - precision)
    since_2000 = micros - _MICROS_2000  # PostgreSQL rounds its own value: microseconds since 2000-01-01
    if since_2000 >= 0:
        return (since_2000 + unit // 2) // unit * unit + _MICROS_2000
    return -((-since_2000 + unit // 2) // unit * unit) + _MICROS_2000


def _uuid_text(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) == 16:
        return str(uuid.UUID(bytes=bytes(value)))
    if isinstance(value, str):
        text = value.strip()
        try:  # PostgreSQL takes hyphens anywhere in groups of 4 and optional braces; Python's parser is close
            return str(uuid.UUID(text))
        except ValueError:
            raise _bad("uuid", value) from None
    raise _wrong_type("uuid", value)


def _interval_micros(value: Any) -> int:
    if isinstance(value, str):
        value = _parse("interval", value)
    if isinstance(value, datetime.timedelta):
        return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    raise _wrong_type("interval", value)


def _parse(pg_type: str, text: str) -> Any:
    """Text through PostgreSQL's input function, as pgwire decodes a text parameter of that type."""
    from headrace.errors import HeadraceError
    from headrace.pgwire import types as pg

    oid = {"date": pg.DATE, "timestamp": pg.TIMESTAMP, "interval": pg.INTERVAL}[pg_type]
    try:
        return pg.decode_parameter(oid, pg.TEXT_FORMAT, text.encode())
    except HeadraceError as error:
        raise TypeValueError(error.sqlstate, error.message) from None


def _bad(pg_type: str, value: Any) -> TypeValueError:
    return TypeValueError("22P02", f'invalid input syntax for type {pg_type}: "{value}"')


def _wrong_type(pg_type: str, value: Any) -> TypeValueError:
    return TypeValueError("42804", f"column is of type {pg_type} but expression is of type {type(value).__name__}")


# ---------------------------------------------------------------------------------------------- PostgreSQL's text

_MICROS_PER_DAY = 86_400_000_000
_MICROS_2000 = 946_684_800_000_000  # 2000-01-01, PostgreSQL's epoch, since 1970-01-01
_ISO_TIME = re.compile(r"(\d{4,})-(\d\d)-(\d\d)(?: (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
                       r"(?:([+-])(\d\d)(?::(\d\d)(?::(\d\d))?)?)?( BC)?")


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC is 0), any year."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(astronomical year, month, day) of a day number since 1970-01-01."""
    days += 719468
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * month_index + 2) // 5 + 1
    month = month_index + (3 if month_index < 10 else -9)
    return year_of_era + era * 400 + (month <= 2), month, day


def _year_text(year: int) -> tuple[str, str]:
    return (f"{year:04d}", "") if year > 0 else (f"{1 - year:04d}", " BC")


def date_text(days: int) -> str:
    """A date's document value in PostgreSQL's ISO input syntax (BC and 'infinity' included)."""
    infinite = infinity_text("date", days)
    if infinite is not None:
        return infinite
    year, month, day = civil_from_days(days)
    year_text, era = _year_text(year)
    return f"{year_text}-{month:02d}-{day:02d}{era}"


def time_text(micros: int, with_zone: bool) -> str:
    """A timestamp's (with_zone: timestamptz's, in UTC) document value in PostgreSQL's ISO input syntax."""
    infinite = infinity_text("timestamp", micros)
    if infinite is not None:
        return infinite
    days, rest = divmod(micros, _MICROS_PER_DAY)
    year, month, day = civil_from_days(days)
    seconds, fraction = divmod(rest, 1_000_000)
    year_text, era = _year_text(year)
    text = f"{year_text}-{month:02d}-{day:02d} {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return f"{text}{f'.{fraction:06d}'.rstrip('0') if fraction else ''}{'+00' if with_zone else ''}{era}"


def parse_time_text(text: str, days_only: bool = False) -> int:
    """PostgreSQL's ISO output of a timestamp, timestamptz (any offset) or date (`days_only`) as its document value:
    microseconds (days) since 1970-01-01 UTC; 'infinity' / '-infinity' as the extreme integers."""
    if text in ("infinity", "-infinity"):
        if days_only:
            return DATE_INFINITY if text == "infinity" else DATE_MINUS_INFINITY
        return TIME_INFINITY if text == "infinity" else TIME_MINUS_INFINITY
    match = _ISO_TIME.fullmatch(text)
    if match is None:
        raise ValueError(f"not PostgreSQL's ISO date/time output: {text!r}")
    (year, month, day, hours, minutes, seconds, fraction, sign, zone_hours, zone_minutes, zone_seconds,
     era) = match.groups()
    astronomical = 1 - int(year) if era else int(year)
    days = days_from_civil(astronomical, int(month), int(day))
    if days_only:
        return days
    micros = days * _MICROS_PER_DAY + (int(hours or 0) * 3600 + int(minutes or 0) * 60 + int(seconds or 0)) \
        * 1_000_000 + int((fraction or "0").ljust(6, "0"))
    if sign:
        offset = int(zone_hours) * 3600 + int(zone_minutes or 0) * 60 + int(zone_seconds or 0)
        micros -= (offset if sign == "+" else -offset) * 1_000_000
    return micros


# ---------------------------------------------------------------------------------------------- output

def from_store(pg_type: str, value: Any) -> Any:
    """A value DuckDB returned for the column (Decimal, date, datetime, UUID, timedelta) as its document form."""
    if value is None:
        return None
    if pg_type == "numeric":
        return format(value, "f") if isinstance(value, Decimal) else str(value)
    return to_document(pg_type, value)


def to_python(pg_type: str, value: Any) -> Any:
    """The document form as the Python value pgwire encodes for the type (RETURNING, views)."""
    if value is None:
        return None
    if pg_type == "numeric":
        return Decimal(value)
    if pg_type in ("date", "timestamp"):
        try:
            if pg_type == "date":
                return _EPOCH_DATE + datetime.timedelta(days=value)
            return _EPOCH + datetime.timedelta(microseconds=value)
        except OverflowError:  # BC, year 10000 on, +-infinity: PostgreSQL holds them, Python's datetime does not
            raise beyond_python(pg_type, value) from None
    if pg_type == "uuid":
        return uuid.UUID(value)
    if pg_type == "interval":
        return datetime.timedelta(microseconds=value)
    raise ValueError(pg_type)


def to_arrow(store_type: str, value: Any) -> Any:
    """The document form as the Arrow array of `arrow_type(store_type)` takes it."""
    if value is None:
        return None
    if decimal_shape(store_type) is not None:
        return Decimal(value)
    return value  # days, microseconds and uuid text go in as they are


def arrow_type(store_type: str) -> Any:
    import pyarrow as pa

    shape = decimal_shape(store_type)
    if shape is not None:
        return pa.decimal128(*shape)
    return {"DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us"), "UUID": pa.string(),
            "INTERVAL": pa.duration("us")}[store_type.upper()]


def is_exact_store_type(store_type: str) -> bool:
    return decimal_shape(store_type) is not None or store_type.upper() in ("DATE", "TIMESTAMP", "UUID", "INTERVAL")


def document_select_sql(store_type: str, quoted: str) -> str:
    """A DuckDB expression reading a column of `store_type` back as its document form."""
    if decimal_shape(store_type) is not None or store_type.upper() == "UUID":
        return f"CAST({quoted} AS VARCHAR)"
    if store_type.upper() == "DATE":
        return f"CAST({quoted} - DATE '1970-01-01' AS BIGINT)"
    return f"epoch_us({quoted})"  # TIMESTAMP, INTERVAL

