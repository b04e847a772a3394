"""The scalar expressions a materialized view may use, and their PostgreSQL types.

A view's WHERE, GROUP BY keys, projections and aggregate arguments run on Spark, so they are limited
to what the Spark translation (pipeline/views.py) implements; `type_of` checks an expression against
that list and types it, so an unsupported construct is refused at CREATE, not in the pipeline.
Types are PostgreSQL type names (pg_type.typname); "unknown" is an untyped string literal or NULL.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping

from sqlglot import exp

from headrace.errors import FeatureNotSupported, HeadraceError, UndefinedColumn
from headrace.sql.select import PG_TYPE_NAMES

INTEGER_TYPES = frozenset({"int2", "int4", "int8"})
NUMERIC_RANK = {"int2": 0, "int4": 1, "int8": 2, "numeric": 3, "float4": 4, "float8": 5}
TEXT_TYPES = frozenset({"text", "varchar", "unknown"})
# Types a view's columns may have: what the serving store and the Spark translation both carry.
SUPPORTED_TYPES = frozenset({*NUMERIC_RANK, "text", "varchar", "bool", "jsonb", "json", "timestamptz"})
# Tables' exact types, carried through a view in their document form (days, microseconds, uuid text; see
# store/table_types.py): grouped by, counted, min/max'ed and projected, stored as DATE, TIMESTAMP, UUID, INTERVAL.
TABLE_EXACT_TYPES = frozenset({"date", "timestamp", "uuid", "interval"})
SUPPORTED_TYPES = SUPPORTED_TYPES | TABLE_EXACT_TYPES

COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)
TEXT_FUNCTIONS = (exp.Lower, exp.Upper, exp.Trim, exp.Substring, exp.Replace, exp.Left, exp.Right, exp.MD5,
                  exp.SplitPart, exp.Concat)
NON_DETERMINISTIC = (exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime, exp.Rand)
NON_DETERMINISTIC_NAMES = frozenset({"now", "clock_timestamp", "statement_timestamp", "transaction_timestamp",
                                     "random", "gen_random_uuid", "timeofday", "mz_now"})

Columns = Mapping[str, str]


class InvalidViewExpression(HeadraceError):
    """An expression a view cannot maintain or type (42804 datatype mismatch unless told otherwise)."""

    sqlstate = "42804"
    http_status = 400


def cast_target(data_type: exp.DataType) -> str:
    """The PostgreSQL name of a cast's target type, refusing those views cannot carry."""
    name = PG_TYPE_NAMES.get(data_type.this)
    if name is None or name not in SUPPORTED_TYPES or name in TABLE_EXACT_TYPES:  # no Spark casts to those yet
        shown = data_type.sql(dialect="postgres").lower()
        raise FeatureNotSupported(f"materialized views cannot produce type {shown}",
                                  hint=f"supported types: {', '.join(sorted(SUPPORTED_TYPES))}")
    return name


def numeric_result(left: str, right: str, symbol: str) -> str:
    left = "int4" if left == "unknown" else left
    right = "int4" if right == "unknown" else right
    if left not in NUMERIC_RANK or right not in NUMERIC_RANK:
        raise InvalidViewExpression(f"operator does not exist: {left} {symbol} {right}", sqlstate="42883",
                                    hint="cast the operands to a numeric type, e.g. (body->>'amount')::int")
    result = max(left, right, key=NUMERIC_RANK.__getitem__)
    return "float8" if result == "float4" else result


def refuse_non_deterministic(node: exp.Expr) -> None:
    for found in node.find_all(*NON_DETERMINISTIC, exp.Anonymous):
        name = found.name.lower() if isinstance(found, exp.Anonymous) else found.sql_name().lower()
        if isinstance(found, NON_DETERMINISTIC) or name in NON_DETERMINISTIC_NAMES:
            shown = "now()" if isinstance(found, exp.CurrentTimestamp) else found.sql(dialect="postgres")
            raise FeatureNotSupported(
                f"materialized views cannot use {shown}: its value changes without any input changing, "
                "so the view could not be maintained incrementally",
                hint="filter on time in the SELECT that reads the view, e.g. "
                     "SELECT * FROM v WHERE received_at > now() - interval '1 hour'")


def type_of(node: exp.Expr, columns: Columns) -> str:
    """The PostgreSQL type of a scalar expression over `columns` (name -> type); raises if unsupported."""
    if isinstance(node, exp.Column):
        if isinstance(node.this, exp.Star):
            raise FeatureNotSupported("* is only allowed as the whole select list of a non-aggregating view")
        if node.name not in columns:
            raise UndefinedColumn(f'column "{node.name}" does not exist')
        return columns[node.name]
    if isinstance(node, exp.Literal):
        if node.is_string:
            return "unknown"
        text = node.this
        if any(ch in text for ch in ".eE"):
            return "numeric"
        return "int4" if abs(int(text)) < 2**31 else "int8"
    if isinstance(node, exp.Boolean):
        return "bool"
    if isinstance(node, exp.Null):
        return "unknown"
    if isinstance(node, exp.Paren):
        return type_of(node.this, columns)
    if isinstance(node, exp.Neg):
        operand = type_of(node.this, columns)
        if operand not in (*NUMERIC_RANK, "unknown"):  # PostgreSQL names the prefix operator: `- text`
            raise InvalidViewExpression(f"operator does not exist: - {_shown_type(operand)}", sqlstate="42883",
                                        hint="cast the operand to a numeric type, e.g. -(body->>'amount')::int")
        return numeric_result(operand, "int4", "-")
    if isinstance(node, exp.Cast):
        source, target = type_of(node.this, columns), cast_target(node.to)
        if target in ("text", "varchar"):
            check_text_form(node.this, source, columns)
        return target
    if isinstance(node, (exp.JSONExtract, exp.JSONExtractScalar)):
        operand = type_of(node.this, columns)
        if operand not in ("jsonb", "json"):
            raise InvalidViewExpression(f"operator does not exist: {operand} {'->' if isinstance(node, exp.JSONExtract) else '->>'} unknown",
                                        sqlstate="42883", hint="-> and ->> apply to jsonb values such as body")
        if not isinstance(node.expression, exp.JSONPath):
            raise FeatureNotSupported("a view's -> and ->> need a constant key or index, e.g. body->>'id'")
        return "jsonb" if isinstance(node, exp.JSONExtract) else "text"
    if isinstance(node, ARITHMETIC):
        symbol = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%"}[type(node)]
        left, right = type_of(node.this, columns), type_of(node.expression, columns)
        if symbol in "+-" and "timestamptz" in (left, right):
            raise FeatureNotSupported("timestamp arithmetic is not supported in materialized views yet",
                                      hint="group by date_trunc('hour', ts) instead")
        return numeric_result(left, right, symbol)
    if isinstance(node, exp.DPipe):
        left, right = type_of(node.this, columns), type_of(node.expression, columns)
        if left in ("jsonb", "json") and right in ("jsonb", "json", "unknown") or \
                right in ("jsonb", "json") and left == "unknown":
            raise FeatureNotSupported(f"jsonb || jsonb is not supported in materialized views yet: "
                                      f"{node.sql(dialect='postgres')}")
        check_text_form(node.this, left, columns)
        check_text_form(node.expression, right, columns)
        return "text"
    if isinstance(node, COMPARISONS):
        symbol = {exp.EQ: "=", exp.NEQ: "<>", exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}[type(node)]
        left, right = type_of(node.this, columns), type_of(node.expression, columns)
        check_comparable(left, right, symbol)
        check_literal_against(node.this, right)
        check_literal_against(node.expression, left)
        return "bool"
    if isinstance(node, (exp.And, exp.Or)):
        for side in (node.this, node.expression):
            if type_of(side, columns) not in ("bool", "unknown"):
                raise InvalidViewExpression(f"argument of {node.key.upper()} must be type boolean")
        return "bool"
    if isinstance(node, exp.Not):
        if isinstance(node.this, exp.Is) and not node.this.args.get("negate"):
            # sqlglot reads `x IS NOT FALSE` as NOT (x IS FALSE): type it as the IS NOT it is, for the message
            type_of(exp.Is(this=node.this.this, expression=node.this.expression, negate=True), columns)
        else:
            type_of(node.this, columns)
        return "bool"
    if isinstance(node, exp.Is):
        operand = type_of(node.this, columns)
        if not isinstance(node.expression, (exp.Null, exp.Boolean)):
            raise FeatureNotSupported("IS supports NULL, TRUE and FALSE in materialized views")
        if isinstance(node.expression, exp.Boolean) and operand not in ("bool", "unknown"):
            test = f"IS {'NOT ' if node.args.get('negate') else ''}{'TRUE' if node.expression.this else 'FALSE'}"
            raise InvalidViewExpression(f"argument of {test} must be type boolean, not type {_shown_type(operand)}")
        return "bool"
    if isinstance(node, exp.In):
        if node.args.get("query") is not None:
            raise FeatureNotSupported("subqueries are not supported in materialized views",
                                      hint="IN takes a list of constants here, e.g. x IN ('a', 'b')")
        subject = type_of(node.this, columns)
        for child in node.expressions:
            check_comparable(subject, type_of(child, columns), "=")
            check_literal_against(child, subject)
        return "bool"
    if isinstance(node, exp.Between):
        subject = type_of(node.this, columns)
        check_comparable(subject, type_of(node.args["low"], columns), ">=")
        check_comparable(subject, type_of(node.args["high"], columns), "<=")
        check_literal_against(node.args["low"], subject)
        check_literal_against(node.args["high"], subject)
        return "bool"
    if isinstance(node, (exp.Like, exp.ILike)):
        type_of(node.this, columns), type_of(node.expression, columns)
        return "bool"
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
        types = [type_of(child, columns) for child in (node.this, *node.expressions)]
        return _common_type(types)
    if isinstance(node, exp.Nullif):
        result = type_of(node.this, columns)
        type_of(node.expression, columns)
        return result
    if isinstance(node, exp.Case):
        if node.this is not None:
            type_of(node.this, columns)
        types = []
        for branch in node.args.get("ifs") or []:
            type_of(branch.this, columns)
            types.append(type_of(branch.args["true"], columns))
        if node.args.get("default") is not None:
            types.append(type_of(node.args["default"], columns))
        return _common_type(types)
    if isinstance(node, exp.Length):
        type_of(node.this, columns)
        return "int4"
    if isinstance(node, TEXT_FUNCTIONS):
        for child in node.iter_expressions():
            type_of(child, columns)
        return "text"
    if isinstance(node, (exp.Abs, exp.Floor, exp.Ceil, exp.Round)):
        operand = type_of(node.this, columns)
        for child in list(node.iter_expressions())[1:]:
            type_of(child, columns)
        if operand not in NUMERIC_RANK:
            raise InvalidViewExpression(f"function {node.sql_name().lower()}({operand}) does not exist", sqlstate="42883")
        decimals = node.args.get("decimals") if isinstance(node, exp.Round) else None
        if decimals is not None and operand in ("float4", "float8"):
            raise InvalidViewExpression(f"function round({operand}, {type_of(decimals, columns)}) does not exist",
                                        sqlstate="42883", hint="cast the value to numeric first")
        if decimals is not None and not (isinstance(decimals, exp.Literal) and not decimals.is_string):
            raise FeatureNotSupported(f"{node.sql(dialect='postgres')}: round's scale must be a constant in "
                                      "materialized views")
        return operand if isinstance(node, exp.Abs) else ("numeric" if operand in ("int2", "int4", "int8", "numeric") and isinstance(node, exp.Round) else operand)
    if isinstance(node, exp.TimestampTrunc):
        if type_of(node.this, columns) != "timestamptz":
            raise InvalidViewExpression("date_trunc applies to timestamptz values here", sqlstate="42883")
        return "timestamptz"
    if isinstance(node, (exp.Subquery, exp.Select, exp.Exists)):
        raise FeatureNotSupported("subqueries are not supported in materialized views",
                                  hint="materialize the inner query as its own view and read that view")
    if isinstance(node, exp.Window):
        raise FeatureNotSupported("window functions are not supported in materialized views",
                                  hint="window functions are not maintained incrementally; apply them in "
                                       "the SELECT that reads the view")
    if isinstance(node, (exp.Placeholder, exp.Parameter)):
        raise FeatureNotSupported("materialized views cannot have parameters")
    refuse_non_deterministic(node)
    shown = node.sql(dialect="postgres")
    raise FeatureNotSupported(f"{shown} is not supported in materialized views yet",
                              hint="views support columns, constants, casts, -> and ->>, arithmetic, comparisons, "
                                   "AND/OR/NOT, IS [NOT] NULL, IN (...), BETWEEN, LIKE, ||, CASE, coalesce, nullif, "
                                   "greatest, least, lower, upper, length, substr, trim, replace, left, right, "
                                   "split_part, md5, abs, round, floor, ceil and date_trunc")


_COMPARABLE_FAMILIES = ({*NUMERIC_RANK}, {"text", "varchar"}, {"bool"}, {"timestamptz"}, {"date"}, {"timestamp"},
                        {"uuid"}, {"interval"}, {"jsonb"}, {"json"})


def date_literal_days(text: str) -> int:
    """A date literal as the day number dates travel as (ISO form only; else 22007 at CREATE)."""
    try:
        return (datetime.date.fromisoformat(text.strip()) - datetime.date(1970, 1, 1)).days
    except ValueError:
        raise HeadraceError(f'invalid input syntax for type date: "{text}"', sqlstate="22007") from None


def timestamp_literal_micros(text: str) -> int:
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise HeadraceError(f'invalid input syntax for type timestamp: "{text}"', sqlstate="22007") from None
    moment = moment.replace(tzinfo=None)  # PostgreSQL ignores a zone given for a timestamp without time zone
    return (moment - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1)



def check_literal_against(node: exp.Expr, other: str) -> None:
    """Parse a string literal compared with a date or timestamp now, so a bad one fails CREATE, not the pipeline."""
    if isinstance(node, exp.Literal) and node.is_string:
        if other == "date":
            date_literal_days(node.this)
        elif other == "timestamp":
            timestamp_literal_micros(node.this)


def check_comparable(left: str, right: str, symbol: str) -> None:
    """Refuse a comparison PostgreSQL has no operator for (text = integer: 42883), or one across date/time types
    (date < timestamptz), whose promotion the pipeline does not reproduce (0A000)."""
    if "unknown" in (left, right):
        return  # a string literal or NULL takes the other side's type
    if any(left in family and right in family for family in _COMPARABLE_FAMILIES):
        return
    temporal = {"date", "timestamp", "timestamptz"}
    if left in temporal and right in temporal:
        raise FeatureNotSupported(f"comparing {_shown_type(left)} with {_shown_type(right)} is not supported in "
                                  "materialized views", hint="cast one side so both have the same type")
    raise InvalidViewExpression(f"operator does not exist: {_shown_type(left)} {symbol} {_shown_type(right)}",
                                sqlstate="42883", hint="cast one side so both have the same type")


def check_text_form(node: exp.Expr, source: str, columns: Columns) -> None:
    """Refuse a conversion to text whose PostgreSQL output the pipeline cannot reproduce (0A000).

    Spark prints doubles as Java does (1.0E10, 3.0) where PostgreSQL prints the shortest exact form (10000000000,
    3); a numeric's text keeps each value's own display scale, which the pipeline does not carry (it computes on
    decimal(38,10)); jsonb's text has PostgreSQL's spacing and key order."""
    if source in ("float4", "float8", "jsonb", "json", "interval"):
        raise FeatureNotSupported(
            f"materialized views cannot compute {node.sql(dialect='postgres')}::text as PostgreSQL does "
            f"({source}'s text form is not reproduced by the pipeline)",
            hint="keep the value in its own type in the view and format it in the SELECT that reads the view")
    if source == "numeric":
        numeric_display_scale(node, columns)


def numeric_display_scale(node: exp.Expr, columns: Columns) -> int:
    """The display scale PostgreSQL gives every value of a numeric expression, where it is fixed by the expression:
    floor/ceil/round(x) 0, round(x, s) s, an integer cast to numeric 0. Otherwise refused (0A000)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, (exp.Floor, exp.Ceil)):
        return 0
    if isinstance(node, exp.Round):
        decimals = node.args.get("decimals")
        return max(int(decimals.this), 0) if decimals is not None else 0
    if isinstance(node, exp.Cast) and type_of(node.this, columns) in INTEGER_TYPES:
        return 0
    raise FeatureNotSupported(
        f"materialized views cannot compute {node.sql(dialect='postgres')}::text as PostgreSQL does "
        "(a numeric's text keeps each value's own display scale, which the pipeline does not carry)",
        hint="round it first, e.g. round(x, 2)::text, or format it in the SELECT that reads the view")


def _shown_type(pg_type: str) -> str:
    return {"int2": "smallint", "int4": "integer", "int8": "bigint", "float4": "real", "float8": "double precision",
            "timestamptz": "timestamp with time zone", "bool": "boolean"}.get(pg_type, pg_type)


def _common_type(types: list[str]) -> str:
    known = [t for t in types if t != "unknown"]
    if not known:
        return "text"
    if all(t in NUMERIC_RANK for t in known):
        return max(known, key=NUMERIC_RANK.__getitem__)
    return known[0]


_BINDS_LIKE_ARROW_OR_LOOSER = (
    exp.JSONExtract, exp.JSONExtractScalar, exp.DPipe, exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE,
    exp.Is, exp.And, exp.Or, exp.Like, exp.ILike,
)


def normalize_arrows(root: exp.Expr) -> exp.Expr:
    """sqlglot reads `f(body->'a')` inside a function's arguments as a lambda `body -> 'a'`; PostgreSQL has
    no lambdas, so re-associate it as `(body -> 'a')` (as sql/expr.py does), with a JSONPath operand."""

    def rewrite(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Lambda):
            return node
        parameters = node.expressions
        if len(parameters) != 1 or not isinstance(parameters[0], exp.Identifier):
            raise FeatureNotSupported(f"{node.sql(dialect='postgres')} is not supported in materialized views")
        body = node.this.copy()
        parent: exp.Expr | None = None
        leftmost = body
        while isinstance(leftmost, _BINDS_LIKE_ARROW_OR_LOOSER):
            parent, leftmost = leftmost, leftmost.this
        arrow = exp.JSONExtract(this=exp.Column(this=parameters[0].copy()), expression=_json_path(leftmost))
        if parent is None:
            return arrow
        parent.set("this", arrow)
        return body

    return root.transform(rewrite, copy=False)


def _json_path(step: exp.Expr) -> exp.Expr:
    if isinstance(step, exp.Literal):
        part = exp.JSONPathKey(this=step.this) if step.is_string else exp.JSONPathSubscript(this=int(step.this))
        return exp.JSONPath(expressions=[exp.JSONPathRoot(), part])
    return step  # a computed key: type_of refuses it with a message
