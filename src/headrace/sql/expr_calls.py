"""Calling SQL functions in compiled expressions: overload resolution as PostgreSQL does it for these cases (an
argument of a parameter's exact type matches, an untyped literal adopts it, integers and numeric widen to double,
the first matching signature wins), strictness (NULL in, NULL out), and the table of functions that sqlglot parses
as plain calls (exp.Anonymous), which expr_crypto.py and expr_text.py fill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlglot import exp

from headrace.errors import FeatureNotSupported, HeadraceError
from headrace.sql.expr import Columns, Compiled, Row, _cast, _compile, _compiles, _fold
from headrace.sql.expr_values import NUMBER_TYPES, SqlType

T = SqlType
Implementation = Callable[..., Any]
Signature = tuple[tuple[SqlType, ...], SqlType, Implementation]


def _no_function(name: str, arguments: Sequence[Compiled]) -> HeadraceError:
    shown = ", ".join(a.sql_type.value for a in arguments)
    return HeadraceError(f"function {name}({shown}) does not exist", sqlstate="42883", http_status=400,
                         hint="no function matches the given name and argument types; add explicit casts")


def _accepts(parameter: SqlType, argument: SqlType) -> bool:
    if argument is parameter or argument is SqlType.UNKNOWN:
        return True
    if parameter is SqlType.DOUBLE:
        return argument in NUMBER_TYPES  # integers and numeric widen implicitly
    if parameter in (SqlType.INTEGER, SqlType.BIGINT):
        return argument in (SqlType.SMALLINT, SqlType.INTEGER) or (parameter is SqlType.BIGINT and argument is SqlType.BIGINT)
    return False


def call_overloaded(name: str, arguments: Sequence[Compiled], signatures: Sequence[Signature]) -> Compiled:
    """Resolve an overloaded, strict function (NULL in, NULL out) and build its closure."""
    for parameters, result, implementation in signatures:
        if len(parameters) == len(arguments) and all(map(_accepts, parameters, arguments_types(arguments))):
            getters = [_cast(a, p).evaluate for a, p in zip(arguments, parameters, strict=True)]
            constant = all(a.constant for a in arguments)
            return _fold(Compiled(strict_call(implementation, getters), result, constant))
    raise _no_function(name, arguments)


def arguments_types(arguments: Sequence[Compiled]) -> list[SqlType]:
    return [a.sql_type for a in arguments]


def strict_call(implementation: Implementation, getters: list[Callable[[Row], Any]]) -> Callable[[Row], Any]:
    if len(getters) == 1:
        (get,) = getters
        return lambda row: None if (v := get(row)) is None else implementation(v)
    if len(getters) == 2:
        get_a, get_b = getters

        def call2(row: Row) -> Any:
            a = get_a(row)
            if a is None:
                return None
            b = get_b(row)
            return None if b is None else implementation(a, b)

        return call2

    def call(row: Row) -> Any:
        values = []
        for get in getters:
            value = get(row)
            if value is None:
                return None
            values.append(value)
        return implementation(*values)

    return call


def compile_arguments(nodes: Sequence[exp.Expression | None], columns: Columns) -> list[Compiled]:
    return [_compile(node, columns) for node in nodes if node is not None]


ANONYMOUS_FUNCTIONS: dict[str, list[Signature]] = {}  # name -> overloads, filled by the modules that define them


@_compiles(exp.Anonymous)
def _anonymous(node: exp.Anonymous, columns: Columns) -> Compiled:
    name = node.name.lower()
    signatures = ANONYMOUS_FUNCTIONS.get(name)
    if signatures is None:
        raise FeatureNotSupported(f"function {name}() is not supported in this expression")
    return call_overloaded(name, compile_arguments(node.expressions, columns), signatures)
