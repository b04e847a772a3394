"""The simple protocol's single-statement shortcut agrees with the tokenizer's split wherever it answers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.pgwire.simple_query import single_statement
from headrace.sql.parser import split_statements


def test_single_statement_shortcut() -> None:
    assert single_statement("  SELECT v FROM kv WHERE k = 1 ;; ") == "SELECT v FROM kv WHERE k = 1"
    assert single_statement("SELECT 1; SELECT 2") is None
    assert single_statement("SELECT ';'") is None  # the tokenizer decides
    assert single_statement("-- nothing") is None
    assert single_statement(" ; ") is None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="SELCT 1'x;-/*\n\"", max_size=40))
def test_shortcut_matches_the_tokenizer(sql: str) -> None:
    single = single_statement(sql)
    if single is None:
        return
    try:
        split = split_statements(sql)
    except Exception:  # noqa: BLE001 - text the tokenizer refuses is refused again when parsed
        return
    assert split == [single]
