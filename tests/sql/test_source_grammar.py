"""CREATE / ALTER / DROP SOURCE and SECRET: grammar, the items they describe, canonical statements."""

from __future__ import annotations

import re

import pytest

from headrace.catalog.items import DEFAULT_WINDOW_US, CheckOption, HeaderColumn
from headrace.errors import DuplicateObject, HeadraceError, InvalidParameterValue, SyntaxError_
from headrace.sql.ast import AlterSourceWindow, CreateSecret, CreateWebhookSource, DropObject, ShowObjects
from headrace.sql.ddl import (
    check_columns,
    item_from_create_sql,
    key_columns,
    parse_window,
    render_create_source,
    validate_expressions,
    with_window,
)
from headrace.sql.expr import SqlType
from headrace.sql.parser import parse_statement

HOUR = 3_600_000_000

FULL = ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON ARRAY "
        "INCLUDE HEADER 'X-Sig' AS sig BYTES, INCLUDE HEADER 'x-event' AS event "
        "INCLUDE HEADERS (NOT 'authorization', 'x-a') "
        "CHECK (WITH (BODY AS raw BYTES, HEADERS AS h, SECRET hook_key AS k BYTES) "
        "constant_time_eq(hmac(raw, k, 'sha256'), decode(h->'x-sig', 'hex'))) "
        "IDEMPOTENT (body->>'id') WINDOW '3 days'")


def test_full_statement_describes_every_clause() -> None:
    assert isinstance(parse_statement(FULL), CreateWebhookSource)
    source = item_from_create_sql("u3", FULL)
    assert source.body_format == "json_array" and source.include_headers
    assert source.headers_allowed == ("x-a",) and source.headers_excluded == ("authorization",)
    assert source.header_columns == (HeaderColumn("x-sig", "sig", True), HeaderColumn("x-event", "event", False))
    assert source.check_options == (CheckOption("body", "raw", True), CheckOption("headers", "h"),
                                    CheckOption("secret", "k", True, "hook_key"))
    assert source.check_expr == "constant_time_eq(hmac(raw, k, 'sha256'), decode(h->'x-sig', 'hex'))"
    assert source.idempotent_expr == "body->>'id'"
    assert source.window_us == 72 * HOUR
    assert source.column_names() == ["body", "headers", "sig", "event", "received_at", "idempotency_key"]
    assert source.secret_names() == ["hook_key"]
    assert check_columns(source) == {"raw": SqlType.BYTEA, "h": SqlType.MAP, "k": SqlType.BYTEA}
    assert key_columns(source) == {"body": SqlType.JSONB, "headers": SqlType.MAP, "sig": SqlType.BYTEA,
                                   "event": SqlType.TEXT}
    validate_expressions(source)


def test_canonical_statement_round_trips() -> None:
    source = item_from_create_sql("u3", FULL)
    again = item_from_create_sql("u3", source.create_sql)
    assert again == source
    assert source.create_sql == (
        "CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON ARRAY INCLUDE HEADER 'x-sig' AS sig BYTES "
        "INCLUDE HEADER 'x-event' AS event INCLUDE HEADERS ('x-a', NOT 'authorization') "
        "CHECK (WITH (BODY AS raw BYTES, HEADERS AS h, SECRET hook_key AS k BYTES) "
        "constant_time_eq(hmac(raw, k, 'sha256'), decode(h->'x-sig', 'hex'))) "
        "IDEMPOTENT (body->>'id') WINDOW '3 days'")


@pytest.mark.parametrize(("fmt", "expected"), [("TEXT", "text"), ("JSON", "json"), ("JSON ARRAY", "json_array"),
                                               ("BYTES", "bytes"), ("json array", "json_array")])
def test_body_formats(fmt: str, expected: str) -> None:
    source = item_from_create_sql("u1", f"CREATE SOURCE s FROM WEBHOOK BODY FORMAT {fmt}")
    assert source.body_format == expected
    assert source.window_us == DEFAULT_WINDOW_US and source.column_names() == ["body", "received_at"]


def test_quoted_names_and_literals_survive_rendering() -> None:
    source = item_from_create_sql("u1", "CREATE SOURCE \"My Src\" FROM WEBHOOK BODY FORMAT TEXT "
                                        "INCLUDE HEADER 'it''s' AS \"Col\" IDEMPOTENT (body || 'x''y')")
    assert source.name == "My Src" and source.header_columns == (HeaderColumn("it's", "Col"),)
    assert item_from_create_sql("u1", source.create_sql) == source


def test_defaults_when_with_renames_nothing() -> None:
    source = item_from_create_sql("u1", "CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON CHECK (body <> '')")
    assert check_columns(source) == {"body": SqlType.TEXT, "headers": SqlType.MAP}
    validate_expressions(source)


@pytest.mark.parametrize(("window", "micros"), [("24 hours", 24 * HOUR), ("7 days", 168 * HOUR), ("30 days", 720 * HOUR),
                                                ("90 minutes", 90 * 60_000_000), ("1 day 12:00:00", 36 * HOUR)])
def test_window_bounds_accept(window: str, micros: int) -> None:
    assert parse_window(window) == micros


@pytest.mark.parametrize(("window", "message"), [("0 seconds", "positive"), ("-1 hour", "positive"),
                                                 ("31 days", "exceeds the maximum of 30 days"),
                                                 ("soon", "invalid input syntax for type interval")])
def test_window_bounds_refuse(window: str, message: str) -> None:
    with pytest.raises(HeadraceError, match=message):
        parse_window(window)


def test_window_needs_idempotent_and_alter_rewrites_statement() -> None:
    with pytest.raises(SyntaxError_, match="WINDOW"):  # WINDOW belongs to the IDEMPOTENT clause
        item_from_create_sql("u1", "CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON WINDOW '1 day'")
    source = item_from_create_sql("u1", "CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
    altered = with_window(source, parse_window("4 days"))
    assert altered.window_us == 96 * HOUR and altered.create_sql.endswith("WINDOW '4 days'")
    assert item_from_create_sql("u1", altered.create_sql) == altered


@pytest.mark.parametrize(("sql", "error", "message"), [
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT XML", SyntaxError_, "BODY FORMAT"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADER x AS y", SyntaxError_, "string literal"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADER 'x'", SyntaxError_, "AS <column>"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON CHECK (WITH (FOO) true)", SyntaxError_, "BODY, HEADERS or SECRET"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON CHECK (true", SyntaxError_, "syntax error"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON CHECK (true) CHECK (true)", SyntaxError_, "syntax error"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'a') WINDOW 5", SyntaxError_, "syntax error"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADER 'a' AS received_at", DuplicateObject, "received_at"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADER 'a' AS c INCLUDE HEADER 'b' AS c", DuplicateObject, '"c"'),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON CHECK (WITH (BODY, BODY AS b) true)", DuplicateObject, "twice"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'a') WINDOW '40 days'", InvalidParameterValue, "maximum"),
])
def test_create_source_errors(sql: str, error: type[HeadraceError], message: str) -> None:
    with pytest.raises(error) as raised:
        item_from_create_sql("u1", sql)
    assert re.search(message, f"{raised.value.message} {raised.value.detail}")


@pytest.mark.parametrize(("sql", "message"), [
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON CHECK (body->>'x')", "operator does not exist: text ->>"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT TEXT CHECK (length(body))", "CHECK must be a boolean"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT BYTES IDEMPOTENT (body->>'id')", "operator does not exist: bytea ->>"),
    ("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON CHECK (WITH (SECRET k) k = nope)", 'column "nope" does not exist'),
])
def test_expressions_are_checked_at_create(sql: str, message: str) -> None:
    with pytest.raises(HeadraceError, match=message):
        validate_expressions(item_from_create_sql("u1", sql))


def test_secret_statements() -> None:
    create = parse_statement("CREATE SECRET IF NOT EXISTS stripe_key AS 'whsec_abc'")
    assert isinstance(create, CreateSecret) and create.args["value"] == "'whsec_abc'" and create.args["if_not_exists"]
    alter = parse_statement("ALTER SECRET stripe_key AS decode('c2VjcmV0', 'base64')")
    assert isinstance(alter, CreateSecret) and alter.args["alter"] and alter.args["value"] == "decode('c2VjcmV0', 'base64')"
    drop = parse_statement("DROP SECRET IF EXISTS a, b CASCADE")
    assert isinstance(drop, DropObject) and drop.args["kind"] == "secret" and drop.args["cascade"]
    assert not parse_statement("DROP SECRET a RESTRICT").args["cascade"]
    show = parse_statement("SHOW SECRETS")
    assert isinstance(show, ShowObjects) and show.args["kind"] == "secret"


def test_alter_source_statement() -> None:
    for sql in ("ALTER SOURCE s SET (WINDOW = '7 days')", "alter source if exists s set (window '7 days')"):
        statement = parse_statement(sql)
        assert isinstance(statement, AlterSourceWindow) and statement.args["window"] == "7 days"
    with pytest.raises(SyntaxError_) as raised:
        parse_statement("ALTER SOURCE s SET (SIZE = '1')")
    assert "Expected WINDOW" in str(raised.value.detail)
