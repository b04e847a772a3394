"""The simple protocol's single-statement shortcut agrees with the tokenizer's split wherever it answers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.pgwire.simple_query import runs_on_its_own, single_statement
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


def test_statements_that_keep_a_string_out_of_one_implicit_transaction() -> None:
    for statement in ("BEGIN", " /* why */ -- note\n commit", "START TRANSACTION", "end", "ROLLBACK TO s",
                      "SAVEPOINT s", "release s", "PREPARE TRANSACTION 'x'", "COPY t FROM STDIN", "SUBSCRIBE v"):
        assert runs_on_its_own(statement), statement
    for statement in ("SELECT 1", "INSERT INTO begin_log VALUES (1)", "-- begin\nSELECT 1", "PREPARE p AS SELECT 1",
                      "/* commit */ UPDATE t SET x = 1", "beginning"):
        assert not runs_on_its_own(statement), statement
