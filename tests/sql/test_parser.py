from __future__ import annotations

import pytest

from headrace.errors import SyntaxError_, UndefinedObject
from headrace.sql.ast import CreateWebhookSource, DropObject, ShowObjects, ShowVariable
from headrace.sql.ddl import item_from_create_sql
from headrace.sql.parser import parse_statement, split_statements
from headrace.sql.select import plan_select


def test_create_source_full_form() -> None:
    sql = "CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS IDEMPOTENT (headers->>'idempotency-key')"
    statement = parse_statement(sql)
    assert isinstance(statement, CreateWebhookSource)
    source = item_from_create_sql("u7", sql)
    assert (source.id, source.name, source.body_format, source.include_headers) == ("u7", "s", "json", True)
    assert source.idempotent_expr == "headers->>'idempotency-key'"  # as written
    assert source.column_names() == ["body", "headers", "received_at", "idempotency_key"]
    assert item_from_create_sql("u8", "create source t from webhook body format json").column_names() == ["body", "received_at"]


@pytest.mark.parametrize("sql", [
    "CREATE SOURCE s FROM WEBHOOK BODY FORMAT XML",
    "CREATE SOURCE s FROM KAFKA",
    "CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT",
    "CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON EXTRA",
    "SELEC 1",
])
def test_syntax_errors_are_42601_with_position(sql: str) -> None:
    with pytest.raises(SyntaxError_) as caught:
        parse_statement(sql)
    assert caught.value.sqlstate == "42601"


def test_syntax_error_position_is_one_based() -> None:
    with pytest.raises(SyntaxError_) as caught:
        parse_statement("SELECT FROM WHERE x")
    assert caught.value.position == 13 or caught.value.position == 17
    assert caught.value.message == 'syntax error at or near "WHERE"'


def test_drop_and_show() -> None:
    drop = parse_statement("DROP SOURCE IF EXISTS a, b")
    assert isinstance(drop, DropObject) and drop.args["if_exists"] and [t.name for t in drop.expressions] == ["a", "b"]
    assert isinstance(parse_statement("SHOW SOURCES"), ShowObjects)
    show = parse_statement("SHOW TRANSACTION ISOLATION LEVEL")
    assert isinstance(show, ShowVariable) and show.this == "transaction isolation level"


def test_split_respects_strings_and_comments() -> None:
    assert split_statements("select ';' ; -- x;\n select 2;;") == ["select ';'", "select 2"]
    assert split_statements("  ") == []


def test_select_plan_names_columns_like_postgres() -> None:
    plan = plan_select(parse_statement(
        "SELECT body->>'k', count(*), sum((body->>'n')::int) AS total, received_at, (body->>'n')::int, now() FROM s"
        " GROUP BY 1, 4, 5"), lambda schema, name: name == "s")
    assert plan.column_names == ("?column?", "count", "total", "received_at", "int4", "now")
    assert "FROM s" in plan.duckdb_sql


def test_select_plan_resolves_names_and_ctes() -> None:
    with pytest.raises(UndefinedObject, match='relation "missing" does not exist'):
        plan_select(parse_statement("SELECT * FROM missing"), lambda schema, name: False)
    plan = plan_select(parse_statement("WITH c AS (SELECT 1 AS x) SELECT x FROM c"), lambda schema, name: False)
    assert plan.column_names == ("x",)
    plan = plan_select(parse_statement("SELECT * FROM headrace.public.s"), lambda schema, name: (schema, name) == ("public", "s"))
    assert "headrace" not in plan.duckdb_sql


def test_parameter_types_declared_inferred_and_default() -> None:
    plan = plan_select(parse_statement("SELECT $1::int FROM s WHERE body->>'a' = $2 LIMIT $3"), lambda s, n: True)
    assert plan.param_types == (23, 25, 20)
    plan = plan_select(parse_statement("SELECT $1"), lambda s, n: True, declared_param_types=[20])
    assert plan.param_types == (20,) and "CAST($1 AS BIGINT)" in plan.duckdb_sql
