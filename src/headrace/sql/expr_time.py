"""Time for webhook CHECKs, with PostgreSQL's results: now() (the request's arrival), interval literals,
to_timestamp(double), extract from timestamptz and interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from sqlglot import exp

from headrace.errors import FeatureNotSupported
from headrace.sql import expr_types as xt
from headrace.sql.expr import NOW, Columns, Compiled, Row, _cast, _compile, _compiles, _constant, _fold
from headrace.sql.expr_calls import T, call_overloaded, compile_arguments

# -- time ---------------------------------------------------------------------------------------------

@_compiles(exp.CurrentTimestamp)
def _now(node: exp.Expression, columns: Columns) -> Compiled:
    """now(): the request's arrival time (the row's NOW entry), the same for the whole request."""
    def now(row: Row) -> int:
        arrival = row.get(NOW)
        return time.time_ns() // 1000 if arrival is None else int(arrival)
    return Compiled(now, T.TIMESTAMPTZ)


@_compiles(exp.Interval)
def _interval(node: exp.Interval, columns: Columns) -> Compiled:
    text = node.this.name if node.this is not None else ""
    unit = node.args.get("unit")
    if unit is not None:
        text = f"{text} {unit.name}"
    return _constant(xt.parse_interval(text), T.INTERVAL)


@_compiles(exp.UnixToTime)
def _to_timestamp(node: exp.UnixToTime, columns: Columns) -> Compiled:
    if any(node.args.get(k) is not None for k in ("scale", "zone", "hours", "minutes", "format")):
        raise FeatureNotSupported("to_timestamp with these arguments")
    return call_overloaded("to_timestamp", compile_arguments([node.this], columns), [((T.DOUBLE,), T.TIMESTAMPTZ, xt.seconds_to_timestamp)])


@_compiles(exp.StrToTime)
def _to_timestamp_format(node: exp.Expression, columns: Columns) -> Compiled:
    raise FeatureNotSupported("to_timestamp(text, format); cast the text instead: '2024-01-01T00:00:00Z'::timestamptz")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROS = Decimal(1_000_000)


def _timestamp_field(field: str) -> Callable[[int], Decimal]:
    def moment(micros: int) -> datetime:
        return _EPOCH + timedelta(microseconds=micros)
    fields: dict[str, Callable[[int], Decimal]] = {
        "epoch": lambda us: (Decimal(us) / _MICROS).quantize(Decimal("0.000001")),
        "year": lambda us: Decimal(moment(us).year),
        "quarter": lambda us: Decimal((moment(us).month - 1) // 3 + 1),
        "month": lambda us: Decimal(moment(us).month),
        "day": lambda us: Decimal(moment(us).day),
        "hour": lambda us: Decimal(moment(us).hour),
        "minute": lambda us: Decimal(moment(us).minute),
        "second": lambda us: (Decimal(moment(us).second * 1_000_000 + moment(us).microsecond) / _MICROS).quantize(Decimal("0.000001")),
        "milliseconds": lambda us: (Decimal(moment(us).second * 1_000_000 + moment(us).microsecond) / 1000).quantize(Decimal("0.001")),
        "microseconds": lambda us: Decimal(moment(us).second * 1_000_000 + moment(us).microsecond),
        "dow": lambda us: Decimal(moment(us).isoweekday() % 7),
        "isodow": lambda us: Decimal(moment(us).isoweekday()),
        "doy": lambda us: Decimal(moment(us).timetuple().tm_yday),
    }
    aliases = {"millisecond": "milliseconds", "microsecond": "microseconds", "seconds": "second",
               "minutes": "minute", "hours": "hour", "days": "day", "months": "month", "years": "year"}
    found = fields.get(aliases.get(field, field))
    if found is None:
        raise FeatureNotSupported(f'unit "{field}" of extract for timestamp with time zone')
    return found


def _interval_field(field: str) -> Callable[[int], Decimal]:
    day = 86_400_000_000
    fields: dict[str, Callable[[int], Decimal]] = {
        "epoch": lambda us: (Decimal(us) / _MICROS).quantize(Decimal("0.000001")),
        "day": lambda us: Decimal(int(us / day)),
        "hour": lambda us: Decimal(int((us - int(us / day) * day) / 3_600_000_000)),
        "minute": lambda us: Decimal(int((us % (3_600_000_000 if us >= 0 else -3_600_000_000)) / 60_000_000)),
        "second": lambda us: (Decimal(us % (60_000_000 if us >= 0 else -60_000_000)) / _MICROS).quantize(Decimal("0.000001")),
    }
    found = fields.get(field)
    if found is None:
        raise FeatureNotSupported(f'unit "{field}" of extract for interval')
    return found


@_compiles(exp.Extract)
def _extract(node: exp.Extract, columns: Columns) -> Compiled:
    field = node.this.name.lower()
    source = _compile(node.expression, columns)
    if source.sql_type is T.UNKNOWN:
        source = _cast(source, T.TIMESTAMPTZ)
    if source.sql_type is T.TIMESTAMPTZ:
        get_field = _timestamp_field(field)
    elif source.sql_type is T.INTERVAL:
        get_field = _interval_field(field)
    else:
        raise FeatureNotSupported(f"extract from {source.sql_type.value}")
    get = source.evaluate
    return _fold(Compiled(lambda row: None if (v := get(row)) is None else get_field(v), T.NUMERIC, source.constant))

