"""Compile a scalar SQL expression (PostgreSQL dialect) into a Python closure.

Used per webhook request (IDEMPOTENT now, CHECK later), so the SQL is parsed and type-checked once
and each request only runs nested closures. Semantics follow PostgreSQL where it matters for keys
and checks: static types (an untyped string literal adopts the other operand's type), jsonb `->`
and `->>` with PostgreSQL's text rendering, three-valued logic, NULL propagation.

Values at run time: SQL NULL is None. A jsonb value is the parsed JSON (dict, list, str, int,
Decimal/float, bool), except a top-level JSON null, which is `JSON_NULL`, because in PostgreSQL
`'null'::jsonb IS NULL` is false. Columns are typed by the caller (name -> SqlType; a plain list of
names means jsonb columns, whose values are parsed JSON documents, None = JSON null). The other
types' values are described in expr_types.py. `now()` reads the row's `NOW` entry (the request's
arrival time, integer microseconds) so that a CHECK sees one fixed time per request.

To support a new construct, add a compiler for its sqlglot node type to `_COMPILERS`; functions
and operators beyond the basics live in expr_functions.py.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from headrace.errors import FeatureNotSupported, HeadraceError, SyntaxError_, UndefinedColumn
from headrace.sql import expr_values as jv
from headrace.sql.expr_values import INTEGER_TYPES, JSON_NULL, NUMBER_TYPES, SqlType

__all__ = ["JSON_NULL", "NOW", "CompiledExpression", "SqlType", "compile_expression"]

Row = Mapping[str, Any]
Evaluate = Callable[[Row], Any]
Columns = Mapping[str, SqlType]
NOW = "\0now"  # the row entry holding now() (microseconds since the epoch); no column can be named so


@dataclass(frozen=True, slots=True)
class Compiled:
    evaluate: Evaluate
    sql_type: SqlType
    constant: bool = False


class CompiledExpression:
    """A compiled expression: call it with a row (column name -> value) to evaluate it."""

    def __init__(self, sql_text: str, root: Compiled) -> None:
        self.sql_text = sql_text
        self.result_type = root.sql_type if root.sql_type is not SqlType.UNKNOWN else SqlType.TEXT
        self._evaluate = root.evaluate
        self._evaluate_text = _cast(root, SqlType.TEXT).evaluate

    def __call__(self, row: Row) -> Any:
        return self._evaluate(row)

    def text(self, row: Row) -> str | None:
        """The value as PostgreSQL would print it (`expr::text`), or None for SQL NULL."""
        result: str | None = self._evaluate_text(row)
        return result

    def __repr__(self) -> str:
        return f"CompiledExpression({self.sql_text!r}, {self.result_type.value})"


def compile_expression(sql_text: str, columns: Sequence[str] | Mapping[str, SqlType]) -> CompiledExpression:
    """Parse and type-check `sql_text` once; the result evaluates it per row. `columns` maps each
    column name to its type (a sequence of names: jsonb columns)."""
    try:
        tree = sqlglot.parse_one(sql_text, read="postgres")
    except sqlglot.errors.SqlglotError as error:  # ParseError, TokenError (an unterminated string)
        errors = getattr(error, "errors", None)
        detail = errors[0].get("description") if errors else str(error).splitlines()[0]
        raise SyntaxError_(f"syntax error in expression {sql_text!r}: {detail}") from None
    typed = dict(columns) if isinstance(columns, Mapping) else dict.fromkeys(columns, SqlType.JSONB)
    return CompiledExpression(sql_text, _compile(tree, typed))


# -- the compiler table ----------------------------------------------------------------------

Compiler = Callable[[Any, Columns], Compiled]
_COMPILERS: dict[type[exp.Expression], Compiler] = {}


def _compiles(*node_types: type[exp.Expression]) -> Callable[[Compiler], Compiler]:
    def register(compiler: Compiler) -> Compiler:
        for node_type in node_types:
            _COMPILERS[node_type] = compiler
        return compiler

    return register


def _compile(node: exp.Expression, columns: Columns) -> Compiled:
    compiler = _COMPILERS.get(type(node))
    if compiler is None:
        raise FeatureNotSupported(f"{_describe(node)} is not supported in this expression")
    return compiler(node, columns)


def _describe(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}()"
    if isinstance(node, exp.Func) and not isinstance(node, exp.Cast):
        return f"function {node.sql_name().lower()}()"
    sql = node.sql(dialect="postgres")
    return f"{sql[:60]!r} ({type(node).__name__})"


def _constant(value: Any, sql_type: SqlType) -> Compiled:
    return Compiled(lambda row: value, sql_type, constant=True)


def _fold(compiled: Compiled) -> Compiled:
    """Evaluate a constant once at compile time (constants read no column)."""
    return _constant(compiled.evaluate({}), compiled.sql_type) if compiled.constant else compiled


def _undefined_operator(op: str, *operand_types: SqlType) -> HeadraceError:
    if len(operand_types) == 2:
        shown = f"{operand_types[0].value} {op} {operand_types[1].value}"
    else:
        shown = f"{op} {operand_types[0].value}"
    return HeadraceError(f"operator does not exist: {shown}", hint="add an explicit cast",
                         sqlstate="42883", http_status=400)


def _type_mismatch(message: str) -> HeadraceError:
    return HeadraceError(message, sqlstate="42804", http_status=400)


# -- leaves ---------------------------------------------------------------------------------


@_compiles(exp.Column)
def _column(node: exp.Column, columns: Columns) -> Compiled:
    if node.table:
        raise FeatureNotSupported(f"qualified column reference {node.sql(dialect='postgres')!r}")
    identifier = node.this
    name = identifier.this if identifier.args.get("quoted") else identifier.this.lower()
    if name not in columns:
        raise UndefinedColumn(f'column "{name}" does not exist',
                              hint=f"available columns: {', '.join(sorted(columns))}")

    sql_type = columns[name]
    if sql_type is not SqlType.JSONB:
        return Compiled(lambda row: row[name], sql_type)

    def column(row: Row) -> Any:
        value = row[name]
        return JSON_NULL if value is None else value

    return Compiled(column, SqlType.JSONB)


@_compiles(exp.Literal)
def _literal(node: exp.Literal, columns: Columns) -> Compiled:
    if node.is_string:
        return _constant(node.this, SqlType.UNKNOWN)
    text = node.this
    if text.isdigit():
        value = int(text)
        for sql_type in (SqlType.INTEGER, SqlType.BIGINT):
            if jv.fits(value, sql_type.value):
                return _constant(value, sql_type)
    return _constant(jv.parse_numeric(text), SqlType.NUMERIC)


@_compiles(exp.RawString, exp.ByteString)
def _string(node: exp.Expression, columns: Columns) -> Compiled:
    # $$dollar-quoted$$ and E'escape' strings (sqlglot has already applied E'' escapes).
    return _constant(node.this, SqlType.UNKNOWN)


@_compiles(exp.Boolean)
def _boolean(node: exp.Boolean, columns: Columns) -> Compiled:
    return _constant(bool(node.this), SqlType.BOOLEAN)


@_compiles(exp.Null)
def _null(node: exp.Null, columns: Columns) -> Compiled:
    return _constant(None, SqlType.UNKNOWN)


@_compiles(exp.Paren)
def _paren(node: exp.Paren, columns: Columns) -> Compiled:
    return _compile(node.this, columns)


@_compiles(exp.Neg)
def _neg(node: exp.Neg, columns: Columns) -> Compiled:
    operand = _compile(node.this, columns)
    if operand.sql_type is SqlType.UNKNOWN:
        operand = _cast(operand, SqlType.NUMERIC)
    if operand.sql_type not in NUMBER_TYPES and operand.sql_type is not SqlType.INTERVAL:
        raise _undefined_operator("-", operand.sql_type)
    inner = operand.evaluate
    return _fold(Compiled(lambda row: None if (v := inner(row)) is None else -v, operand.sql_type, operand.constant))


@_compiles(exp.Lambda)
def _arrow_in_function_argument(node: exp.Lambda, columns: Columns) -> Compiled:
    """sqlglot reads `f(body->'a'->>'b')` as a lambda `body -> ('a' ->> 'b')`; PostgreSQL has no
    lambdas, so re-associate it as `(body -> 'a') ->> 'b'` (`->` binds like ->>, ||, = ... on its
    left, while ::, + and friends bind tighter and stay inside its right operand)."""
    parameters = node.expressions
    if len(parameters) != 1 or not isinstance(parameters[0], exp.Identifier):
        raise FeatureNotSupported(f"{_describe(node)}")
    body = node.this.copy()
    parent: exp.Expression | None = None
    leftmost = body
    while isinstance(leftmost, _BINDS_LIKE_ARROW_OR_LOOSER):
        parent, leftmost = leftmost, leftmost.this
    arrow = exp.JSONExtract(this=exp.Column(this=parameters[0].copy()), expression=leftmost.copy())
    if parent is None:
        return _compile(arrow, columns)
    parent.set("this", arrow)
    return _compile(body, columns)


_BINDS_LIKE_ARROW_OR_LOOSER = (
    exp.JSONExtract, exp.JSONExtractScalar, exp.JSONBExtract, exp.JSONBExtractScalar, exp.DPipe,
    exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.Is, exp.And, exp.Or, exp.Like, exp.ILike,
)


# -- casts ----------------------------------------------------------------------------------

_CAST_TARGETS = {
    exp.DataType.Type.TEXT: SqlType.TEXT,
    exp.DataType.Type.VARCHAR: SqlType.TEXT,
    exp.DataType.Type.SMALLINT: SqlType.SMALLINT,
    exp.DataType.Type.INT: SqlType.INTEGER,
    exp.DataType.Type.BIGINT: SqlType.BIGINT,
    exp.DataType.Type.DECIMAL: SqlType.NUMERIC,
    exp.DataType.Type.BOOLEAN: SqlType.BOOLEAN,
    exp.DataType.Type.JSONB: SqlType.JSONB,
    exp.DataType.Type.JSON: SqlType.JSONB,  # json would keep the input text; jsonb semantics are close enough for keys
    exp.DataType.Type.DOUBLE: SqlType.DOUBLE,
    exp.DataType.Type.FLOAT: SqlType.DOUBLE,
    exp.DataType.Type.VARBINARY: SqlType.BYTEA,
    exp.DataType.Type.TIMESTAMPTZ: SqlType.TIMESTAMPTZ,
    exp.DataType.Type.INTERVAL: SqlType.INTERVAL,
}


@_compiles(exp.Cast)
def _cast_node(node: exp.Cast, columns: Columns) -> Compiled:
    to = node.args["to"]
    target = _CAST_TARGETS.get(to.this) if isinstance(to, exp.DataType) else None
    if target is None or to.expressions:
        raise FeatureNotSupported(f"cast to type {to.sql(dialect='postgres').lower()}")
    return _cast(_compile(node.this, columns), target)


def _cast(operand: Compiled, target: SqlType) -> Compiled:
    source = operand.sql_type
    if source is target:
        return operand
    convert = jv.converter(source, target)
    inner = operand.evaluate
    return _fold(Compiled(lambda row: None if (v := inner(row)) is None else convert(v), target, operand.constant))


# -- jsonb access: -> ->> #> #>> ------------------------------------------------------------------


@_compiles(exp.JSONExtract, exp.JSONExtractScalar, exp.JSONBExtract, exp.JSONBExtractScalar)
def _json_access(node: exp.Expression, columns: Columns) -> Compiled:
    as_text = isinstance(node, (exp.JSONExtractScalar, exp.JSONBExtractScalar))
    by_path = isinstance(node, (exp.JSONBExtract, exp.JSONBExtractScalar))
    symbol = ("#>" if by_path else "->") + (">" if as_text else "")
    document = _compile(node.this, columns)
    if document.sql_type is SqlType.MAP and not by_path:
        return map_lookup(document, node.expression, columns)
    if document.sql_type is SqlType.UNKNOWN:
        document = _cast(document, SqlType.JSONB)
    selector = node.expression
    if document.sql_type is not SqlType.JSONB:
        raise _undefined_operator(symbol, document.sql_type, SqlType.UNKNOWN)
    if by_path:
        if not (isinstance(selector, exp.Literal) and selector.is_string):
            raise FeatureNotSupported(f"{symbol} with a path that is not a text[] literal")
        get_path = jv.path_getter(jv.parse_text_array(selector.this), text_path=True)
        select = lambda value, row: get_path(value)  # noqa: E731
    elif isinstance(selector, exp.JSONPath):
        select = _static_steps(selector)
    else:
        select = _dynamic_step(_compile(selector, columns), symbol)
    get_document = document.evaluate
    finish = jv.jsonb_to_text if as_text else None

    def access(row: Row) -> Any:
        value = get_document(row)
        if value is None:
            return None
        found = select(value, row)
        return finish(found) if finish is not None and found is not None else found

    return Compiled(access, SqlType.TEXT if as_text else SqlType.JSONB)


def _static_steps(path: exp.JSONPath) -> Callable[[Any, Row], Any]:
    steps: list[str | int] = []
    for part in path.expressions:
        if isinstance(part, exp.JSONPathRoot):
            continue
        if isinstance(part, (exp.JSONPathKey, exp.JSONPathSubscript)) and isinstance(part.this, (str, int)):
            steps.append(part.this)
        else:
            raise FeatureNotSupported(f"JSON path element {part.sql(dialect='postgres')!r}")
    getter = jv.path_getter(steps)
    return lambda value, row: getter(value)


def _dynamic_step(selector: Compiled, symbol: str) -> Callable[[Any, Row], Any]:
    if selector.sql_type in INTEGER_TYPES or selector.sql_type in (SqlType.TEXT, SqlType.UNKNOWN):
        get_selector = selector.evaluate

        def step(value: Any, row: Row) -> Any:
            key = get_selector(row)
            return None if key is None else jv.step(value, key)

        return step
    raise _undefined_operator(symbol, SqlType.JSONB, selector.sql_type)


# -- operators and functions --------------------------------------------------------------------


@_compiles(exp.DPipe)
def _concat(node: exp.DPipe, columns: Columns) -> Compiled:
    left, right = _compile(node.this, columns), _compile(node.expression, columns)
    if SqlType.JSONB in (left.sql_type, right.sql_type):
        raise FeatureNotSupported("jsonb concatenation (||); cast the jsonb operand to text")
    # bytea || bytea is bytea (an untyped literal adopts bytea); any other pair concatenates as text
    result = SqlType.BYTEA if {left.sql_type, right.sql_type} <= {SqlType.BYTEA, SqlType.UNKNOWN} and (
        SqlType.BYTEA in (left.sql_type, right.sql_type)) else SqlType.TEXT
    get_left, get_right = _cast(left, result).evaluate, _cast(right, result).evaluate

    def concat(row: Row) -> Any:
        a = get_left(row)
        if a is None:
            return None
        b = get_right(row)
        return None if b is None else a + b

    return _fold(Compiled(concat, result, left.constant and right.constant))


_COMPARISONS: dict[type[exp.Expression], tuple[str, Callable[[Any, Any], bool]]] = {
    exp.EQ: ("=", operator.eq), exp.NEQ: ("<>", operator.ne),
    exp.LT: ("<", operator.lt), exp.LTE: ("<=", operator.le),
    exp.GT: (">", operator.gt), exp.GTE: (">=", operator.ge),
    exp.NullSafeEQ: ("IS NOT DISTINCT FROM", operator.eq), exp.NullSafeNEQ: ("IS DISTINCT FROM", operator.ne),
}


@_compiles(*_COMPARISONS)
def _comparison(node: exp.Expression, columns: Columns) -> Compiled:
    symbol, compare = _COMPARISONS[type(node)]
    left, right = _unify(_compile(node.this, columns), _compile(node.expression, columns), symbol)
    if left.sql_type is SqlType.JSONB:
        if compare not in (operator.eq, operator.ne):
            raise FeatureNotSupported(f"ordering jsonb values ({symbol})")
        compare = jv.jsonb_equal if compare is operator.eq else (lambda a, b: not jv.jsonb_equal(a, b))
    get_left, get_right = left.evaluate, right.evaluate
    null_safe = isinstance(node, (exp.NullSafeEQ, exp.NullSafeNEQ))

    def comparison(row: Row) -> bool | None:
        a, b = get_left(row), get_right(row)
        if a is None or b is None:
            return ((a is None) == (b is None)) == (compare is operator.eq) if null_safe else None
        return compare(a, b)

    return _fold(Compiled(comparison, SqlType.BOOLEAN, left.constant and right.constant))


def _unify(left: Compiled, right: Compiled, symbol: str) -> tuple[Compiled, Compiled]:
    """Give both operands one type, the way PostgreSQL resolves an operator's argument types."""
    if left.sql_type is SqlType.UNKNOWN and right.sql_type is SqlType.UNKNOWN:
        return _cast(left, SqlType.TEXT), _cast(right, SqlType.TEXT)
    if left.sql_type is SqlType.UNKNOWN:
        return _cast(left, right.sql_type), right
    if right.sql_type is SqlType.UNKNOWN:
        return left, _cast(right, left.sql_type)
    if left.sql_type is right.sql_type or {left.sql_type, right.sql_type} <= NUMBER_TYPES:
        return left, right
    raise _undefined_operator(symbol, left.sql_type, right.sql_type)


def _boolean_operand(compiled: Compiled, what: str) -> Evaluate:
    if compiled.sql_type is SqlType.UNKNOWN:
        compiled = _cast(compiled, SqlType.BOOLEAN)
    if compiled.sql_type is not SqlType.BOOLEAN:
        raise _type_mismatch(f"argument of {what} must be type boolean, not type {compiled.sql_type.value}")
    return compiled.evaluate


@_compiles(exp.And, exp.Or)
def _and_or(node: exp.Expression, columns: Columns) -> Compiled:
    what = "AND" if isinstance(node, exp.And) else "OR"
    left, right = _compile(node.this, columns), _compile(node.expression, columns)
    get_left, get_right = _boolean_operand(left, what), _boolean_operand(right, what)
    decisive = isinstance(node, exp.Or)  # the value that settles the result on its own

    def logic(row: Row) -> bool | None:
        a = get_left(row)
        if a is decisive:
            return decisive
        b = get_right(row)
        if b is decisive:
            return decisive
        return None if a is None or b is None else not decisive

    return _fold(Compiled(logic, SqlType.BOOLEAN, left.constant and right.constant))


@_compiles(exp.Not)
def _not(node: exp.Not, columns: Columns) -> Compiled:
    operand = _compile(node.this, columns)
    get = _boolean_operand(operand, "NOT")
    return _fold(Compiled(lambda row: None if (v := get(row)) is None else not v, SqlType.BOOLEAN, operand.constant))


@_compiles(exp.Is)
def _is(node: exp.Is, columns: Columns) -> Compiled:
    operand = _compile(node.this, columns)
    negate = bool(node.args.get("negate"))
    target = node.expression
    if isinstance(target, exp.Null):
        get = operand.evaluate
        test: Evaluate = (lambda row: get(row) is not None) if negate else (lambda row: get(row) is None)
    elif isinstance(target, exp.Boolean):
        get, wanted = _boolean_operand(operand, "IS"), bool(target.this)
        test = (lambda row: get(row) is not wanted) if negate else (lambda row: get(row) is wanted)
    else:
        raise FeatureNotSupported(f"{_describe(node)}")
    return _fold(Compiled(test, SqlType.BOOLEAN, operand.constant))


@_compiles(exp.Coalesce)
def _coalesce(node: exp.Coalesce, columns: Columns) -> Compiled:
    arguments = [_compile(arg, columns) for arg in [node.this, *node.expressions]]
    known = [a.sql_type for a in arguments if a.sql_type is not SqlType.UNKNOWN]
    target = known[0] if known else SqlType.TEXT
    if len(set(known)) > 1:
        target = common_type(known, "COALESCE")
    getters = [_cast(a, target).evaluate for a in arguments]

    def coalesce(row: Row) -> Any:
        for get in getters:  # lazily, as PostgreSQL does: later arguments may not be evaluated
            value = get(row)
            if value is not None:
                return value
        return None

    return _fold(Compiled(coalesce, target, all(a.constant for a in arguments)))


def common_type(known: Sequence[SqlType], construct: str) -> SqlType:
    """The one type values of `known` types resolve to (COALESCE, CASE): equal, or numbers widened."""
    if len(set(known)) == 1:
        return known[0]
    if not set(known) <= NUMBER_TYPES:
        mismatch = next(t for t in known if t is not known[0])
        raise _type_mismatch(f"{construct} types {known[0].value} and {mismatch.value} cannot be matched")
    for widest in (SqlType.DOUBLE, SqlType.NUMERIC):
        if widest in known:
            return widest
    return SqlType.BIGINT


def _text_argument(node: exp.Expression, columns: Columns, function: str) -> Compiled:
    compiled = _compile(node, columns)
    if compiled.sql_type is SqlType.UNKNOWN:
        compiled = _cast(compiled, SqlType.TEXT)
    if compiled.sql_type is not SqlType.TEXT:
        raise HeadraceError(f"function {function}({compiled.sql_type.value}) does not exist",
                            hint="add an explicit cast to text", sqlstate="42883", http_status=400)
    return compiled


@_compiles(exp.Lower, exp.Upper)
def _case_change(node: exp.Expression, columns: Columns) -> Compiled:
    function = "lower" if isinstance(node, exp.Lower) else "upper"
    operand = _text_argument(node.this, columns, function)
    change: Callable[[str], str] = _per_character(str.lower) if function == "lower" else _per_character(str.upper)
    get = operand.evaluate
    return _fold(Compiled(lambda row: None if (v := get(row)) is None else change(v), SqlType.TEXT, operand.constant))


def _per_character(change: Callable[[str], str]) -> Callable[[str], str]:
    """Case mapping character by character, as PostgreSQL's: 'ß' stays 'ß' (Python makes it 'SS')."""
    def apply(text: str) -> str:
        changed = change(text)
        if len(changed) == len(text):
            return changed
        return "".join(mapped if len(mapped := change(c)) == 1 else c for c in text)
    return apply


@_compiles(exp.Trim)
def _trim(node: exp.Trim, columns: Columns) -> Compiled:
    operand = _text_argument(node.this, columns, "trim")
    position = (node.args.get("position") or "BOTH").upper()
    strip = {"BOTH": str.strip, "LEADING": str.lstrip, "TRAILING": str.rstrip}[position]
    characters = _text_argument(node.expression, columns, "trim") if node.expression else _constant(" ", SqlType.TEXT)
    get, get_characters = operand.evaluate, characters.evaluate

    def trim(row: Row) -> str | None:
        value = get(row)
        chars = get_characters(row) if value is not None else None
        return None if value is None or chars is None else strip(value, chars)

    return _fold(Compiled(trim, SqlType.TEXT, operand.constant and characters.constant))


def map_lookup(document: Compiled, selector_node: exp.Expression, columns: Columns) -> Compiled:
    """`headers -> 'name'` (Materialize's map lookup) and headrace's `headers ->> 'name'`: text."""
    if isinstance(selector_node, exp.JSONPath):
        keys = [part.this for part in selector_node.expressions if isinstance(part, exp.JSONPathKey)]
        if len(keys) != 1 or len(selector_node.expressions) > 2 or not isinstance(keys[0], str):
            raise FeatureNotSupported("map lookup takes one text key")
        selector = _constant(keys[0], SqlType.TEXT)
    else:
        selector = _text_argument(selector_node, columns, "map lookup")
    get_map, get_key = document.evaluate, selector.evaluate

    def lookup(row: Row) -> str | None:
        mapping, key = get_map(row), get_key(row)
        return None if mapping is None or key is None else mapping.get(key)

    return Compiled(lookup, SqlType.TEXT)


from headrace.sql import expr_functions as _expr_functions  # noqa: E402,F401  (registers its compilers)
