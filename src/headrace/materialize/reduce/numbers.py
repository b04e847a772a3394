"""The `sum` strategy's arithmetic, after Flow's ParsedNumber (crates/doc/src/reduce/parsed_number.rs).

- integer + integer: exact, in Flow's range [-2**63, 2**64 - 1] (its i64 and u64); beyond it -> overflow error.
- integer + float, float + float: IEEE double (the integer is rounded to a double); a non-finite result -> overflow.
- a string holding a decimal number on either side: arbitrary precision, and the result is a string.
  A float joins arbitrary precision through 16 significant digits, as Flow's BigDecimal conversion does
  (86753.09 -> "86753.09000000000").
Anything else (booleans, null, non-numeric strings, arrays, objects) -> "'sum' strategy expects numbers".

Integers outside Flow's range in an input are read as doubles, as Flow's JSON parser reads them.
One deliberate difference: Flow reports overflow for i64::MIN + a positive integer (it negates i64::MIN
internally); headrace returns the exact sum, which is in range.
"""

from __future__ import annotations

import math
import re
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any

from headrace.materialize.reduce.values import MISSING, SUM_OVERFLOW, SUM_WRONG_TYPE, ReductionError

I64_MIN = -(2**63)
U64_MAX = 2**64 - 1
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)  # additions of finite decimals are exact
_DECIMAL_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_PLAIN_EXPONENT_LIMIT = 64  # beyond this many zeros, keep scientific notation rather than pad


def _parse_decimal(text: str) -> Decimal | None:
    if _DECIMAL_TEXT.fullmatch(text) is None:
        return None
    return Decimal(text)


def format_decimal(value: Decimal) -> str:
    """A decimal as Flow writes its arbitrary-precision sums: plain notation, scale kept ("3.80" stays)."""
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    if abs(exponent) > _PLAIN_EXPONENT_LIMIT and value != 0:
        return str(value)
    return format(value, "f")


def _to_decimal(value: Any) -> Decimal | None:
    t = type(value)
    if t is int:
        return Decimal(value)
    if t is float:
        if not math.isfinite(value):
            return None
        return Decimal(format(value, ".15e"))
    if t is str:
        return _parse_decimal(value)
    return None


def _wrong_type(lhs: Any, rhs: Any) -> ReductionError:
    return ReductionError(SUM_WRONG_TYPE, lhs, rhs)


def _read_int(value: int) -> int | float:
    if I64_MIN <= value <= U64_MAX:
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf  # sums with it overflow


def checked_sum(lhs: Any, rhs: Any) -> Any:
    """lhs + rhs under Flow's `sum` rules; lhs may be MISSING (reads as 0). Raises ReductionError."""
    tl, tr = type(lhs), type(rhs)
    if tl is int and tr is int:
        if I64_MIN <= lhs <= U64_MAX and I64_MIN <= rhs <= U64_MAX:
            total = lhs + rhs
            if I64_MIN <= total <= U64_MAX:
                return total
            raise ReductionError(SUM_OVERFLOW, lhs, rhs)
        return checked_sum(_read_int(lhs), _read_int(rhs))
    if lhs is MISSING:
        if tr is int:
            rhs = _read_int(rhs)
            tr = type(rhs)
        if tr is int:
            return rhs
        if tr is float:
            if not math.isfinite(rhs):
                raise ReductionError(SUM_OVERFLOW, lhs, rhs)
            return rhs
        return checked_sum(0, rhs)
    if (tl is float or tl is int) and (tr is float or tr is int):
        try:
            total = float(lhs) + float(rhs)
        except OverflowError:  # an integer beyond any double
            raise ReductionError(SUM_OVERFLOW, lhs, rhs) from None
        if math.isfinite(total):
            return total
        raise ReductionError(SUM_OVERFLOW, lhs, rhs)
    if tl is str or tr is str:
        if tl is bool or tr is bool:
            raise _wrong_type(lhs, rhs)
        a, b = _to_decimal(lhs), _to_decimal(rhs)
        if a is None or b is None:
            if (tl is float and not math.isfinite(lhs)) or (tr is float and not math.isfinite(rhs)):
                raise ReductionError(SUM_OVERFLOW, lhs, rhs)
            raise _wrong_type(lhs, rhs)
        return format_decimal(_EXACT.add(a, b))
    raise _wrong_type(lhs, rhs)
