"""Inputs the fuzz suite (tests/fuzz) answered with XX000, each with PostgreSQL 15's answer (checked on a real one)."""

from __future__ import annotations

import pytest

from headrace.errors import HeadraceError
from headrace.sql.parser import parse_client_statement
from headrace.sql.select import plan_select


def plan(sql: str) -> str:
    return plan_select(parse_client_statement(sql), lambda schema, name: True).duckdb_sql


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT U&'\\D800'", "invalid Unicode surrogate pair"),
    ("SELECT U&'\\DC00'", "invalid Unicode surrogate pair"),
    ("SELECT U&'\\D800x'", "invalid Unicode surrogate pair"),
    ("SELECT U&'\\0000'", "invalid Unicode escape value"),
    ("SELECT U&'\\+110000'", "invalid Unicode escape value"),
])
def test_unicode_escapes_postgresql_refuses(sql: str, message: str) -> None:
    with pytest.raises(HeadraceError) as refused:
        plan(sql)
    assert (refused.value.sqlstate, refused.value.message) == ("42601", message)


def test_unicode_escapes_postgresql_takes() -> None:
    assert "'𐀀'" in plan("SELECT U&'\\D800\\DC00'")
    assert "'data'" in plan("SELECT U&'d\\0061t\\+000061'")
    assert "\\D800" in plan("SELECT U&'\\\\D800'")  # an escaped backslash: no escape follows


@pytest.mark.parametrize("count", ["1e-400", "1.5"])
def test_fetch_count_must_be_an_integer(count: str) -> None:
    with pytest.raises(HeadraceError) as refused:
        parse_client_statement(f"FETCH {count} c")
    assert (refused.value.sqlstate, refused.value.message) == ("42601", f'syntax error at or near "{count}"')
