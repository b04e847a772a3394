"""The functions and operators webhook CHECKs need, with PostgreSQL's names, types and results. This module holds
arithmetic (integer overflow, numeric and timestamp/interval operands), BETWEEN, IN, CASE and subscripts ([]), and
imports the modules that register the rest: expr_crypto.py (hmac, digest, constant_time_eq, md5/sha*, encode/decode,
convert_to/convert_from), expr_text.py (split_part, position, substring, regexp_match, ~, length, left/right,
replace, starts_with) and expr_time.py (now(), intervals, to_timestamp, extract). Overload resolution and the
table of plain function calls are in expr_calls.py.

Each compiler registers itself in expr.py's table.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal, DivisionByZero, InvalidOperation, localcontext
from typing import Any

from sqlglot import exp

from headrace.errors import DataError, FeatureNotSupported, HeadraceError
from headrace.sql import expr_crypto as _expr_crypto  # noqa: F401  (registers its compilers)
from headrace.sql import expr_text as _expr_text  # noqa: F401  (registers its compilers)
from headrace.sql import expr_time as _expr_time  # noqa: F401  (registers its compilers)
from headrace.sql import expr_types as xt
from headrace.sql.expr import Columns, Compiled, Row, _cast, _compile, _compiles, _constant, _fold, common_type, map_lookup
from headrace.sql.expr_calls import T, strict_call
from headrace.sql.expr_values import INTEGER_TYPES, NUMBER_TYPES, SqlType, fits, step

# -- arithmetic ---------------------------------------------------------------------------------------

def _integer_result(value: int, sql_type: SqlType) -> int:
    if not fits(value, sql_type.value):
        raise DataError(f"{sql_type.value} out of range", sqlstate="22003")
    return value


def _divide(a: Any, b: Any, integral: bool) -> Any:
    if b == 0:
        raise DataError("division by zero", sqlstate="22012")
    if integral:
        quotient = abs(a) // abs(b)
        return quotient if (a >= 0) == (b >= 0) else -quotient
    if isinstance(a, Decimal) and isinstance(b, Decimal) and a.is_finite() and b.is_finite() and a:
        return _numeric_divide(a, b)
    try:
        return a / b
    except (DivisionByZero, InvalidOperation):
        raise DataError("division by zero", sqlstate="22012") from None


def _numeric_divide(a: Decimal, b: Decimal) -> Decimal:
    """numeric / numeric with PostgreSQL's result scale (select_div_scale): at least 16 significant
    digits, and no fewer decimals than either input."""
    def weight_and_first_digit(value: Decimal) -> tuple[int, int]:
        weight = value.adjusted() // 4  # in base-10000 digits, as numeric stores them
        return weight, int(abs(value).scaleb(-4 * weight))
    weight1, first1 = weight_and_first_digit(a)
    weight2, first2 = weight_and_first_digit(b)
    quotient_weight = weight1 - weight2 - (1 if first1 <= first2 else 0)
    scale = max(16 - quotient_weight * 4, -a.as_tuple().exponent, -b.as_tuple().exponent, 0)  # type: ignore[operator]
    scale = min(scale, 1000)
    with localcontext() as context:
        context.prec = max(scale + max(a.adjusted() - b.adjusted(), 0) + 10, 28)
        return (a / b).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)


def _modulo(a: Any, b: Any, integral: bool) -> Any:
    if b == 0:
        raise DataError("division by zero", sqlstate="22012")
    return a - b * _divide(a, b, True) if integral else a % b  # Decimal's % keeps the dividend's sign


_SYMBOLS = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%"}


def _number_operation(symbol: str, left: Compiled, right: Compiled) -> Compiled:
    result = common_type([left.sql_type, right.sql_type], symbol)
    integral = result in INTEGER_TYPES
    if integral:
        result = T.BIGINT if T.BIGINT in (left.sql_type, right.sql_type) else T.INTEGER
    convert: Callable[[Any], Any] = float if result is T.DOUBLE else (Decimal if result is T.NUMERIC else int)
    operations: dict[str, Callable[[Any, Any], Any]] = {
        "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
        "/": lambda a, b: _divide(a, b, integral), "%": lambda a, b: _modulo(a, b, integral),
    }
    operation = operations[symbol]
    if integral:
        implementation = lambda a, b: _integer_result(operation(a, b), result)  # noqa: E731
    else:
        implementation = lambda a, b: operation(convert(a), convert(b))  # noqa: E731
    return _fold(Compiled(strict_call(implementation, [left.evaluate, right.evaluate]), result,
                          left.constant and right.constant))


def _timestamp_operation(symbol: str, left: Compiled, right: Compiled) -> Compiled:
    types = (left.sql_type, right.sql_type)
    time_types = {T.TIMESTAMPTZ, T.INTERVAL}
    if T.UNKNOWN in types and (set(types) - {T.UNKNOWN}) <= time_types:
        known = next(t for t in types if t is not T.UNKNOWN)
        # `ts + '5 minutes'` and `ts - '5 minutes'` read the literal as an interval
        adopt = T.INTERVAL if known is T.TIMESTAMPTZ and symbol in "+-" else known
        left, right = (_cast(left, adopt), right) if left.sql_type is T.UNKNOWN else (left, _cast(right, adopt))
        types = (left.sql_type, right.sql_type)
    ts, iv = T.TIMESTAMPTZ, T.INTERVAL
    table: dict[tuple[str, SqlType, SqlType], tuple[SqlType, Callable[[Any, Any], Any]]] = {
        ("+", ts, iv): (ts, lambda a, b: xt.check_timestamp(a + b)),
        ("+", iv, ts): (ts, lambda a, b: xt.check_timestamp(a + b)),
        ("-", ts, iv): (ts, lambda a, b: xt.check_timestamp(a - b)),
        ("-", ts, ts): (iv, lambda a, b: a - b),
        ("+", iv, iv): (iv, lambda a, b: a + b),
        ("-", iv, iv): (iv, lambda a, b: a - b),
    }
    for number in NUMBER_TYPES:
        table[("*", iv, number)] = (iv, lambda a, b: round(a * float(b)))
        table[("*", number, iv)] = (iv, lambda a, b: round(float(a) * b))
        table[("/", iv, number)] = (iv, lambda a, b: round(a / float(_nonzero(b))))
    found = table.get((symbol, *types))
    if found is None:
        raise HeadraceError(f"operator does not exist: {types[0].value} {symbol} {types[1].value}",
                            sqlstate="42883", http_status=400, hint="add an explicit cast")
    result, implementation = found
    return _fold(Compiled(strict_call(implementation, [left.evaluate, right.evaluate]), result,
                          left.constant and right.constant))


def _nonzero(value: Any) -> Any:
    if value == 0:
        raise DataError("division by zero", sqlstate="22012")
    return value


@_compiles(*_SYMBOLS)
def _arithmetic(node: exp.Expression, columns: Columns) -> Compiled:
    symbol = _SYMBOLS[type(node)]
    left, right = _compile(node.this, columns), _compile(node.expression, columns)
    if {left.sql_type, right.sql_type} & {T.TIMESTAMPTZ, T.INTERVAL}:
        return _timestamp_operation(symbol, left, right)
    if left.sql_type is T.UNKNOWN:
        left = _cast(left, right.sql_type if right.sql_type in NUMBER_TYPES else T.NUMERIC)
    if right.sql_type is T.UNKNOWN:
        right = _cast(right, left.sql_type if left.sql_type in NUMBER_TYPES else T.NUMERIC)
    if left.sql_type not in NUMBER_TYPES or right.sql_type not in NUMBER_TYPES:
        raise HeadraceError(f"operator does not exist: {left.sql_type.value} {symbol} {right.sql_type.value}",
                            sqlstate="42883", http_status=400, hint="add an explicit cast")
    return _number_operation(symbol, left, right)


# -- conditionals and membership ----------------------------------------------------------------------

@_compiles(exp.Between)
def _between(node: exp.Between, columns: Columns) -> Compiled:
    subject = node.this
    rewritten = exp.And(this=exp.GTE(this=subject.copy(), expression=node.args["low"].copy()),
                        expression=exp.LTE(this=subject.copy(), expression=node.args["high"].copy()))
    return _compile(rewritten, columns)


@_compiles(exp.In)
def _in(node: exp.In, columns: Columns) -> Compiled:
    if node.args.get("query") is not None or not node.expressions:
        raise FeatureNotSupported("IN with a subquery")
    comparisons = [exp.EQ(this=node.this.copy(), expression=item.copy()) for item in node.expressions]
    combined: exp.Expression = comparisons[0]
    for comparison in comparisons[1:]:
        combined = exp.Or(this=combined, expression=comparison)
    return _compile(combined, columns)


@_compiles(exp.Case)
def _case(node: exp.Case, columns: Columns) -> Compiled:
    operand = node.this
    conditions: list[Compiled] = []
    for branch in node.args["ifs"]:
        condition = branch.this if operand is None else exp.EQ(this=operand.copy(), expression=branch.this.copy())
        compiled = _compile(condition, columns)
        if compiled.sql_type is T.UNKNOWN:
            compiled = _cast(compiled, T.BOOLEAN)
        if compiled.sql_type is not T.BOOLEAN:
            raise HeadraceError(f"argument of CASE/WHEN must be type boolean, not type {compiled.sql_type.value}",
                                sqlstate="42804", http_status=400)
        conditions.append(compiled)
    default = node.args.get("default")
    results = [_compile(branch.args["true"], columns) for branch in node.args["ifs"]]
    results.append(_compile(default, columns) if default is not None else _constant(None, T.UNKNOWN))
    known = [r.sql_type for r in results if r.sql_type is not T.UNKNOWN]
    target = common_type(known, "CASE") if known else T.TEXT
    getters = [_cast(r, target).evaluate for r in results]
    tests = [c.evaluate for c in conditions]
    pairs = list(zip(tests, getters[:-1], strict=True))
    otherwise = getters[-1]

    def case(row: Row) -> Any:
        for test, get in pairs:
            if test(row) is True:  # NULL is not true: falls through, as in PostgreSQL
                return get(row)
        return otherwise(row)

    constant = all(c.constant for c in conditions) and all(r.constant for r in results)
    return _fold(Compiled(case, target, constant))


@_compiles(exp.Bracket)
def _subscript(node: exp.Bracket, columns: Columns) -> Compiled:
    subject = _compile(node.this, columns)
    if len(node.expressions) != 1 or isinstance(node.expressions[0], exp.Slice):
        raise FeatureNotSupported("slices and multi-dimensional subscripts")
    index_node = node.expressions[0]
    if subject.sql_type is T.MAP:
        return map_lookup(subject, index_node, columns)
    index = _compile(index_node, columns)
    # sqlglot stores a literal integer subscript 0-based; PostgreSQL's are 1-based for arrays
    shift = 1 if isinstance(index_node, exp.Literal) and not index_node.is_string else 0
    get_subject, get_index = subject.evaluate, index.evaluate
    if subject.sql_type is T.TEXT_ARRAY:
        if index.sql_type not in INTEGER_TYPES:
            raise HeadraceError("array subscript must have type integer", sqlstate="42804", http_status=400)

        def element(row: Row) -> str | None:
            values, position = get_subject(row), get_index(row)
            if values is None or position is None:
                return None
            position += shift
            return values[position - 1] if 1 <= position <= len(values) else None

        return Compiled(element, T.TEXT)
    if subject.sql_type is T.JSONB:
        def member(row: Row) -> Any:
            value, key = get_subject(row), get_index(row)
            if value is None or key is None:
                return None
            return step(value, key + shift if isinstance(key, int) else key)  # jsonb subscripts are 0-based

        return Compiled(member, T.JSONB)
    raise FeatureNotSupported(f"subscripting type {subject.sql_type.value}")

