"""compile_expression: PostgreSQL semantics for the expressions webhook sources evaluate."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import DataError, FeatureNotSupported, HeadraceError, SyntaxError_, UndefinedColumn
from headrace.sql.expr import JSON_NULL, SqlType, compile_expression
from headrace.sql.expr_values import jsonb_text, parse_json_document, parse_text_array

COLUMNS = ["body", "headers"]
BODY = parse_json_document(
    '{"id": 12345, "name": "Ada", "price": 1.50, "big": 1e3, "flag": true, "none": null,'
    ' "nested": {"b": "x", "z": [1, "two", {"k": "v"}]}, "tags": ["a", "b", "c"], "n": "42"}'
)
HEADERS = {"x-request-id": "req-7", "content-type": "application/json"}
ROW = {"body": BODY, "headers": HEADERS}


def evaluate(sql: str, row: dict[str, Any] | None = None) -> Any:
    return compile_expression(sql, COLUMNS)(ROW if row is None else row)


def as_text(sql: str, row: dict[str, Any] | None = None) -> str | None:
    return compile_expression(sql, COLUMNS).text(ROW if row is None else row)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("body->>'name'", "Ada"),
        ("body->'nested'->>'b'", "x"),
        ("body->'nested'->'z'->>1", "two"),
        ("body->'tags'->>-1", "c"),  # negative indexes count from the end
        ("body->'tags'->>3", None),
        ("body->'tags'->>'0'", None),  # a text key on an array finds nothing
        ("body->'name'->>'x'", None),
        ("body->>'missing'", None),
        ("body->>'none'", None),  # JSON null becomes SQL NULL with ->>
        ("body->>'id'", "12345"),
        ("body->>'price'", "1.50"),  # numeric keeps its scale, as jsonb does
        ("body->>'big'", "1000"),
        ("body->>'flag'", "true"),
        ("body->>'nested'", '{"b": "x", "z": [1, "two", {"k": "v"}]}'),
        ("body #>> '{nested,z,2,k}'", "v"),
        ("body #>> '{nested,z,-1,k}'", "v"),
        ("body #>> '{\"nested\", b}'", "x"),
        ("body #>> '{nested,z,x}'", None),
        ("headers->>'x-request-id'", "req-7"),
        ("BODY->>'name'", "Ada"),  # unquoted identifiers fold to lower case
    ],
)
def test_json_access(sql: str, expected: Any) -> None:
    assert evaluate(sql) == expected


def test_empty_path_is_the_whole_document() -> None:
    assert evaluate("body #> '{}'") == BODY
    assert evaluate("body #>> '{}'") == as_text("body")


def test_arrow_keeps_json_null_apart_from_sql_null() -> None:
    assert evaluate("body->'none'") is JSON_NULL
    assert evaluate("body->'none' IS NULL") is False
    assert evaluate("body->'missing' IS NULL") is True
    assert evaluate("body->>'none' IS NULL") is True
    assert as_text("body->'none'") == "null"
    assert evaluate("body", {"body": None, "headers": {}}) is JSON_NULL


def test_jsonb_text_output_matches_postgresql() -> None:
    # jsonb prints keys shorter-first then bytewise, with ", " and ": " separators.
    document = parse_json_document('{"bb": 1, "a": [true, null, "q\\"uote"], "ccc": {}, "é": 0.10}')
    assert jsonb_text(document) == '{"a": [true, null, "q\\"uote"], "bb": 1, "é": 0.10, "ccc": {}}'
    assert as_text("body->'name'") == '"Ada"'  # a jsonb string cast to text keeps its quotes
    assert as_text("body->'id'") == "12345"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("'a' || 'b'", "ab"),
        ("$$it's$$ || E'\\n'", "it's\n"),
        ("body->>'name' || '-' || (body->>'id')", "Ada-12345"),
        ("body->>'missing' || 'x'", None),
        ("'n' || 1", "n1"),
        ("lower(body->>'name')", "ada"),
        ("upper('x' || (headers->>'x-request-id'))", "XREQ-7"),
        ("lower(body->'nested'->>'b' || 'Y')", "xy"),  # ->, ->> and || in a function argument
        ("coalesce(body->'tags'->>0, 'none')", "a"),
        ("coalesce(body->>'missing', body->'nested'->'z'->>1)", "two"),
        ("trim('  pad  ')", "pad"),
        ("trim(both 'x' from 'xxaxx')", "a"),
        ("ltrim('  a ')", "a "),
        ("rtrim('xay', 'y')", "xa"),
        ("coalesce(body->>'missing', body->>'none', headers->>'x-request-id')", "req-7"),
        ("coalesce(body->>'missing', NULL)", None),
        ("coalesce((body->>'missing')::int, 7)", 7),
    ],
)
def test_text_functions(sql: str, expected: Any) -> None:
    assert evaluate(sql) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("(body->>'n')::int", 42),
        ("(body->>'n')::bigint", 42),
        ("' -7 '::integer", -7),
        ("(body->'price')::int", 2),  # numeric to int rounds half away from zero
        ("(body->>'price')::numeric", Decimal("1.50")),
        ("(body->'id')::numeric", Decimal(12345)),
        ("'yes'::boolean", True),
        ("'of'::boolean", False),
        ("(body->'flag')::boolean", True),
        ("(body->>'flag')::boolean", True),
        ("12::text", "12"),
        ("true::text", "true"),
        ("'{\"a\": [1]}'::jsonb", {"a": [1]}),
        ("'null'::jsonb IS NULL", False),
        ("NULL::int IS NULL", True),
        ("-(body->>'n')::int", -42),
    ],
)
def test_casts(sql: str, expected: Any) -> None:
    result = evaluate(sql)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("(body->>'name')::int", 'invalid input syntax for type integer: "Ada"'),
        ("'1.5'::int", "invalid input syntax for type integer"),
        ("'3000000000'::int", "integer out of range"),
        ("(body->'name')::int", "cannot cast jsonb string to type integer"),
        ("(body->'none')::boolean", "cannot cast jsonb null to type boolean"),
        ("'maybe'::boolean", "invalid input syntax for type boolean"),
        ("'{'::jsonb", "invalid input syntax for type json"),
        ("'NaN'::jsonb", "invalid input syntax for type json"),
        ("'abc'::numeric", "invalid input syntax for type numeric"),
    ],
)
def test_bad_casts_raise_data_error(sql: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        evaluate(sql)


def test_cast_error_is_raised_per_row_not_at_compile_time() -> None:
    compiled = compile_expression("(body->>'v')::int", COLUMNS)
    assert compiled({"body": {"v": "5"}, "headers": {}}) == 5
    with pytest.raises(DataError):
        compiled({"body": {"v": "five"}, "headers": {}})


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("(body->>'n')::int = 42", True),
        ("(body->>'n')::int = '42'", True),  # the untyped literal takes the other side's type
        ("(body->>'n')::int < 41.5", False),
        ("body->>'name' = 'Ada'", True),
        ("body->>'name' <> 'Ada'", False),
        ("body->>'name' >= 'B'", False),
        ("body->>'missing' = 'x'", None),
        ("body->'id' = '12345.0'::jsonb", True),
        ("body->'flag' = '1'::jsonb", False),  # jsonb true is not the number 1
        ("body->'nested' = '{\"z\": [1, \"two\", {\"k\": \"v\"}], \"b\": \"x\"}'::jsonb", True),
        ("body->>'missing' IS DISTINCT FROM NULL", False),
        ("body->>'name' IS NOT DISTINCT FROM 'Ada'", True),
        ("body->>'name' IS NOT NULL", True),
    ],
)
def test_comparisons(sql: str, expected: Any) -> None:
    assert evaluate(sql) is expected


NULLABLE_BOOLEANS = {"true": True, "false": False, "null": None}


@pytest.mark.parametrize("left", NULLABLE_BOOLEANS)
@pytest.mark.parametrize("right", NULLABLE_BOOLEANS)
def test_three_valued_logic(left: str, right: str) -> None:
    a, b = NULLABLE_BOOLEANS[left], NULLABLE_BOOLEANS[right]
    expected_and = False if False in (a, b) else (None if None in (a, b) else True)
    expected_or = True if True in (a, b) else (None if None in (a, b) else False)
    row = {"body": {"a": a, "b": b}, "headers": {}}
    # Through ->> and a cast, so NULL comes from the data, not from a folded constant.
    operands = "(body->>'a')::boolean", "(body->>'b')::boolean"
    assert evaluate(f"{operands[0]} AND {operands[1]}", row) is expected_and
    assert evaluate(f"{operands[0]} OR {operands[1]}", row) is expected_or
    assert evaluate(f"NOT {operands[0]}", row) is (None if a is None else not a)
    assert evaluate(f"{operands[0]} IS TRUE", row) is (a is True)
    assert evaluate(f"{operands[0]} IS NOT FALSE", row) is (a is not False)


def test_and_short_circuits_past_a_failing_cast() -> None:
    row = {"body": {"kind": "text", "v": "abc"}, "headers": {}}
    assert evaluate("body->>'kind' = 'int' AND (body->>'v')::int > 0", row) is False


@pytest.mark.parametrize(
    ("sql", "error", "message"),
    [
        ("payload->>'id'", UndefinedColumn, 'column "payload" does not exist'),
        ('"Body"->>id', UndefinedColumn, '"Body"'),
        ("body->>'a' + 1", DataError, 'invalid input syntax for type integer: "a"'),  # PostgreSQL: body ->> ('a' + 1)
        ("(body->>'a') + 1", HeadraceError, "operator does not exist: text \\+ integer"),
        ("hmac(body, 'k', 'sha256')", HeadraceError, "function hmac\\(jsonb, unknown, unknown\\) does not exist"),
        ("no_such_function(1)", FeatureNotSupported, "function no_such_function"),
        ("body->>'a' LIKE 'x%'", FeatureNotSupported, "Like"),
        ("body::timestamp", FeatureNotSupported, "cast to type timestamp"),
        ("(body->>'a')::varchar(3)", FeatureNotSupported, "cast to type varchar"),
        ("body || 'x'", FeatureNotSupported, "jsonb concatenation"),
        ("body->'a' < body->'b'", FeatureNotSupported, "ordering jsonb"),
        ("t.body", FeatureNotSupported, "qualified column"),
        ("SELECT 1", FeatureNotSupported, "Select"),
        ("body #> (headers->>'p')", FeatureNotSupported, "text\\[\\] literal"),
        ("body->>'a' = 1", HeadraceError, "operator does not exist: text = integer"),
        ("(body->>'a')->>'b'", HeadraceError, "operator does not exist: text ->>"),
        ("body->>'a' AND true", HeadraceError, "argument of AND must be type boolean"),
        ("coalesce(body->>'a', body->'a')", HeadraceError, "COALESCE types text and jsonb"),
        ("coalesce(body -> headers->>'k')", HeadraceError, "operator does not exist: jsonb -> jsonb"),
        ("'x' || headers->>'k'", FeatureNotSupported, "jsonb concatenation"),  # PostgreSQL: ('x' || headers) ->> 'k'
        ("lower(body)", HeadraceError, "function lower\\(jsonb\\) does not exist"),
        ("body->>", SyntaxError_, "syntax error"),
        ("", SyntaxError_, "syntax error"),
        ("body->>'unterminated", SyntaxError_, "syntax error"),
    ],
)
def test_compile_errors(sql: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        compile_expression(sql, COLUMNS)


def test_type_errors_carry_postgresql_sqlstates() -> None:
    with pytest.raises(HeadraceError) as raised:
        compile_expression("body->>'a' = 1", COLUMNS)
    assert raised.value.sqlstate == "42883" and raised.value.http_status == 400


def test_result_types() -> None:
    assert compile_expression("body->'a'", COLUMNS).result_type is SqlType.JSONB
    assert compile_expression("body->>'a'", COLUMNS).result_type is SqlType.TEXT
    assert compile_expression("'lit'", COLUMNS).result_type is SqlType.TEXT
    assert compile_expression("(body->>'a')::bigint", COLUMNS).result_type is SqlType.BIGINT


def test_text_array_literals() -> None:
    assert parse_text_array('{a, "b c" ,"q\\"x",NULL}') == ["a", "b c", 'q"x', None]
    assert parse_text_array("{}") == []
    with pytest.raises(DataError, match="malformed array literal"):
        parse_text_array("{a,,b}")
    with pytest.raises(DataError):
        compile_expression("body #> 'nope'", COLUMNS)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)


@given(key=st.text(max_size=10), value=json_values)
def test_property_arrow_text_round_trips_through_jsonb(key: str, value: Any) -> None:
    # (body->key)::text parsed back is the same jsonb value, and equal values print alike.
    row = {"body": {key: value}, "headers": {}}
    key_literal = "'" + key.replace("'", "''") + "'"
    arrow = compile_expression(f"body->{key_literal}", COLUMNS)
    printed = arrow.text(row)
    assert printed is not None
    assert arrow({"body": {key: parse_json_document(printed)}, "headers": {}}) == (JSON_NULL if value is None else value)
    printed_literal = "'" + printed.replace("'", "''") + "'"  # not $$...$$: the value may hold "$$" itself
    assert compile_expression(f"body->{key_literal} = {printed_literal}::jsonb", COLUMNS)(row) is True
    text_value = compile_expression(f"body->>{key_literal}", COLUMNS)(row)
    assert text_value == (value if isinstance(value, str) else None if value is None else printed)
