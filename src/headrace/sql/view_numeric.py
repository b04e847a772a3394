"""numeric in materialized views as PostgreSQL 15 computes it: display scales, exact sums, avg as numeric division.

A PostgreSQL numeric carries its display scale (dscale): `2.50` keeps two digits, `sum` keeps the largest dscale
of its inputs, `*` adds them, and `/` (so `avg`, which is sum / count) picks one by `select_div_scale`
(src/backend/utils/adt/numeric.c): at least 16 significant digits, at least either operand's dscale, rounded half
away from zero. The pipeline computes scalars on Spark's decimal(38,10) and carries numeric values as double, so:

- a numeric expression whose dscale the expression fixes (a column of numeric(p,s), a literal, an integer, `+ - *`,
  round/floor/ceil) has a STATIC scale, and its values are shown at that scale, as PostgreSQL shows them;
- a value whose dscale is its own (an unconstrained numeric column, a cast from text or float) is shown with the
  fewest digits that hold it (`2.5`; PostgreSQL keeps `2.50` when it was written so: docs/views.md "Types");
- `/` between numerics is refused (its dscale depends on the values, beyond decimal(38,10)); aggregates add values
  exactly (Python Decimal from the double's shortest text) and divide as PostgreSQL's numeric_div.

Values leave the view as PostgreSQL's numeric text ("2.5000000000000000"), stored as text and cast to numeric by
the public relation (sql/view_serving.py)."""

from __future__ import annotations

from decimal import ROUND_DOWN, ROUND_HALF_UP, Context, Decimal
from typing import Any

from sqlglot import exp

from headrace.errors import FeatureNotSupported

SPARK_SCALE = 10  # the pipeline's decimal(38,10): a static scale beyond it could not be computed exactly
MIN_SIG_DIGITS = 16  # NUMERIC_MIN_SIG_DIGITS
MAX_DISPLAY_SCALE = 1000  # NUMERIC_MAX_DISPLAY_SCALE
INTEGER_TYPES = ("int2", "int4", "int8")


def scale_of(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return max(-exponent, 0) if isinstance(exponent, int) else 0


def _weight_and_first_digit(value: Decimal) -> tuple[int, int]:
    """PostgreSQL's NumericVar weight (index of the leading base-10000 digit) and that digit; (0, 0) for zero."""
    if value.is_zero():
        return 0, 0
    magnitude = abs(value)
    weight = magnitude.adjusted() // 4
    return weight, int(magnitude.scaleb(-4 * weight))


def select_div_scale(dividend: Decimal, dividend_scale: int, divisor: Decimal, divisor_scale: int) -> int:
    weight1, first1 = _weight_and_first_digit(dividend)
    weight2, first2 = _weight_and_first_digit(divisor)
    quotient_weight = weight1 - weight2 - (1 if first1 <= first2 else 0)
    scale = MIN_SIG_DIGITS - quotient_weight * 4
    return min(max(scale, dividend_scale, divisor_scale, 0), MAX_DISPLAY_SCALE)


def numeric_div(dividend: Decimal, dividend_scale: int, divisor: Decimal, divisor_scale: int = 0) -> Decimal:
    """dividend / divisor as PostgreSQL's numeric_div: select_div_scale digits, rounded half away from zero."""
    scale = select_div_scale(dividend, dividend_scale, divisor, divisor_scale)
    digits = max(dividend.adjusted() - divisor.adjusted(), 0) + scale + 10
    truncated = Context(prec=digits, rounding=ROUND_DOWN).divide(dividend, divisor)  # see round_half_up's note
    return round_half_up(truncated, scale)


def _integer_weight(magnitude: int) -> tuple[int, int]:
    if magnitude == 0:
        return 0, 0
    weight = (len(str(magnitude)) - 1) // 4
    return weight, magnitude // 10_000 ** weight


def integer_div_text(dividend: int, divisor: int) -> str:
    """numeric_div(dividend, divisor) of two integers (divisor > 0) as text, in integer arithmetic: the same digits
    as numeric_div (tests/sql/test_view_numeric.py), ~50x faster (avg of integers on the columnar path, per group)."""
    magnitude = abs(dividend)
    weight1, first1 = _integer_weight(magnitude)
    weight2, first2 = _integer_weight(divisor)
    scale = min(max(MIN_SIG_DIGITS - (weight1 - weight2 - (1 if first1 <= first2 else 0)) * 4, 0), MAX_DISPLAY_SCALE)
    quotient = (magnitude * 10 ** scale * 2 + divisor) // (2 * divisor)  # rounded half away from zero
    digits = str(quotient)
    if scale:
        digits = digits.rjust(scale + 1, "0")
        digits = f"{digits[:-scale]}.{digits[-scale:]}"
    return f"-{digits}" if dividend < 0 and quotient else digits


def round_half_up(value: Decimal, scale: int) -> Decimal:
    """`value` at `scale` digits, half away from zero. Truncating first (as numeric_div does above, with 10 digits
    to spare) cannot change this rounding: a truncated tail is below half exactly when the whole tail is."""
    digits = max(value.adjusted(), 0) + scale + 2
    return value.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP, context=Context(prec=digits))


def from_double(value: float | int | Decimal, scale: int | None) -> Decimal:
    """A numeric the pipeline carried as a double, exactly as written (its shortest text), at `scale` (None: its own,
    the fewest digits that hold it)."""
    number = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else value)
    if scale is not None:
        return round_half_up(number, scale)
    if number == number.to_integral_value():
        return round_half_up(number, 0)
    return number.normalize(Context(prec=max(len(number.as_tuple().digits), 1)))


def text(value: Decimal) -> str:
    """PostgreSQL's numeric text: plain notation, the value's own scale, no negative zero."""
    if value.is_zero():
        value = value.copy_abs()
    return format(value, "f")


def to_text(value: Any, scale: int | None) -> str | None:
    """A numeric document value (double, int or Decimal) as PostgreSQL's text at `scale` (None: its own)."""
    if value is None:
        return None
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(value)]
    return text(from_double(value, scale))


def read(value: Any) -> float | None:
    """A stored numeric text back as the double the pipeline computes with (views over views)."""
    if value is None or isinstance(value, (int, float)):
        return value
    return float(Decimal(value))


# ---------------------------------------------------------------------------------------------- static scales

def static_scale(node: exp.Expr, types: dict[str, str], scales: dict[str, int]) -> int | None:
    """The dscale PostgreSQL gives every value of a numeric (or integer) expression when the expression fixes it,
    None when each value keeps its own. Refuses (0A000) what the pipeline cannot compute exactly."""
    from headrace.sql.view_scalars import type_of

    while isinstance(node, exp.Paren):
        node = node.this
    node_type = type_of(node, types)
    if node_type in INTEGER_TYPES:
        return 0
    if node_type != "numeric":
        return None
    if isinstance(node, exp.Literal):
        return _checked(scale_of(Decimal(node.this)), node)
    if isinstance(node, exp.Column):
        return scales.get(node.name)
    if isinstance(node, (exp.Neg, exp.Abs)):
        return static_scale(node.this, types, scales)
    if isinstance(node, (exp.Floor, exp.Ceil)):
        return 0
    if isinstance(node, exp.Round):
        decimals = node.args.get("decimals")
        return _checked(max(int(decimals.this), 0), node) if decimals is not None else 0
    if isinstance(node, exp.Cast):
        shape = cast_shape(node.to)
        if shape is not None:
            return shape[1]
        return 0 if type_of(node.this, types) in INTEGER_TYPES else None
    if isinstance(node, exp.Div):
        raise FeatureNotSupported(
            f"materialized views cannot compute {node.sql(dialect='postgres')} as PostgreSQL does: numeric division "
            "keeps at least 16 significant digits, chosen by the values, beyond the pipeline's decimal(38,10)",
            hint="divide in the SELECT that reads the view (e.g. keep sum(x) and count(x) in the view), or round "
                 "the quotient of floats: (x::float8 / 4)")
    if isinstance(node, (exp.Add, exp.Sub, exp.Mod, exp.Mul)):
        left = static_scale(node.this, types, scales)
        right = static_scale(node.expression, types, scales)
        if left is None or right is None:
            return None
        return _checked(left + right if isinstance(node, exp.Mul) else max(left, right), node)
    branches: list[exp.Expr] = []
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
        branches = [node.this, *node.expressions]
    elif isinstance(node, exp.Nullif):
        branches = [node.this]
    elif isinstance(node, exp.Case):
        branches = [i.args["true"] for i in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            branches.append(node.args["default"])
    known = {static_scale(b, types, scales) for b in branches if type_of(b, types) != "unknown"}
    return known.pop() if len(known) == 1 else None  # branches of different scales: each value keeps its own


def cast_shape(data_type: exp.DataType) -> tuple[int, int] | None:
    """(precision, scale) of a cast to numeric(p[,s]), None for a bare numeric or another type; refuses a shape the
    pipeline's decimal(38,10) cannot hold."""
    params = data_type.expressions
    if data_type.this not in (exp.DataType.Type.DECIMAL, exp.DataType.Type.BIGDECIMAL) or not params:
        return None
    numbers = [int(p.this.this if isinstance(p.this, exp.Literal) else p.name) for p in params]
    precision, scale = numbers[0], numbers[1] if len(numbers) > 1 else 0
    if not 1 <= precision <= 1000:
        raise FeatureNotSupported(f"NUMERIC precision {precision} must be between 1 and 1000")
    if scale > SPARK_SCALE or precision - scale > 38 - SPARK_SCALE or scale < 0:
        raise FeatureNotSupported(
            f"materialized views cannot compute numeric({precision},{scale}) exactly: the pipeline's numeric holds "
            f"at most {38 - SPARK_SCALE} integer and {SPARK_SCALE} fractional digits",
            hint="cast to a numeric(p,s) with s <= 10 and p - s <= 28")
    return precision, scale


def _checked(scale: int, node: exp.Expr) -> int:
    if scale > SPARK_SCALE:
        raise FeatureNotSupported(
            f"materialized views cannot compute {node.sql(dialect='postgres')} exactly: its values have {scale} "
            f"fractional digits, the pipeline's numeric holds {SPARK_SCALE}",
            hint="round it in the view, e.g. round(x, 10), or compute it in the SELECT that reads the view")
    return scale
