"""Parsing the session-level statements (sql/session_statements.py) as PostgreSQL spells them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from headrace.errors import FeatureNotSupported, SyntaxError_
from headrace.sql.ast import (
    CloseCursor,
    CopyStatement,
    DeallocateStatement,
    DeclareCursor,
    DiscardStatement,
    ExecuteStatement,
    FetchCursor,
    PrepareStatement,
    ResetVariable,
    SetTransaction,
    SetVariable,
)
from headrace.sql.parser import parse_statement


def test_prepare_execute_deallocate() -> None:
    prepare = parse_statement("PREPARE q (int, character varying, numeric(10, 2), text[]) AS SELECT $1, $2")
    assert isinstance(prepare, PrepareStatement) and prepare.this == "q"
    assert prepare.args["param_types"] == ["int", "character varying", "numeric(10, 2)", "text[]"]
    assert prepare.args["statement_sql"] == "SELECT $1, $2" and isinstance(prepare.args["statement"], exp.Select)
    execute = parse_statement("EXECUTE q (1, 'a, b', NULL, -2.5)")
    assert isinstance(execute, ExecuteStatement) and len(execute.args["params"]) == 4
    assert parse_statement("EXECUTE q").args["params"] == []
    assert parse_statement("DEALLOCATE PREPARE q").this == "q"
    assert parse_statement("deallocate all").this is None and isinstance(parse_statement("DEALLOCATE ALL"), DeallocateStatement)


def test_declare_fetch_close() -> None:
    declare = parse_statement('DECLARE "Mixed" BINARY NO SCROLL CURSOR WITH HOLD FOR SELECT 1; ')
    assert isinstance(declare, DeclareCursor)
    assert (declare.this, declare.args["hold"], declare.args["binary"]) == ("Mixed", True, True)
    assert parse_statement("DECLARE c CURSOR WITHOUT HOLD FOR SELECT 1").args["hold"] is False
    forms = {"FETCH c": 1, "FETCH NEXT FROM c": 1, "FETCH 5 c": 5, "FETCH FORWARD 7 IN c": 7,
             "FETCH ALL c": None, "FETCH FORWARD ALL FROM c": None, "fetch forward from C": 1}
    for sql, count in forms.items():
        fetch = parse_statement(sql)
        assert isinstance(fetch, FetchCursor) and fetch.this == "c" and fetch.args["count"] == count, sql
    assert parse_statement("FETCH 100 c WITH (timeout = '1s')").args["timeout"] == "1s"
    assert parse_statement("CLOSE ALL").this is None and isinstance(parse_statement("CLOSE c"), CloseCursor)
    directions = {"FETCH PRIOR FROM c": ("backward", 1), "FETCH FIRST c": ("absolute", 1),
                  "FETCH LAST c": ("absolute", -1), "FETCH ABSOLUTE -2 c": ("absolute", -2),
                  "FETCH RELATIVE +3 c": ("relative", 3), "FETCH BACKWARD ALL c": ("backward", None),
                  "FETCH -2 c": ("backward", 2), "FETCH BACKWARD -1 c": ("forward", 1), "MOVE 3 c": ("forward", 3)}
    for sql, (direction, count) in directions.items():
        fetch = parse_statement(sql)
        assert (fetch.args["direction"], fetch.args["count"]) == (direction, count), sql
    assert parse_statement("MOVE LAST IN c").args["move"] is True
    assert parse_statement("DECLARE c SCROLL CURSOR FOR SELECT 1").args["scroll"] is True
    assert parse_statement("DECLARE c NO SCROLL CURSOR FOR SELECT 1").args["scroll"] is False


def test_transactions() -> None:
    for sql in ("BEGIN", "BEGIN WORK", "START TRANSACTION", "BEGIN ISOLATION LEVEL SERIALIZABLE, READ ONLY"):
        assert isinstance(parse_statement(sql), exp.Transaction), sql
    for sql in ("COMMIT", "END", "COMMIT WORK", "END TRANSACTION"):
        assert isinstance(parse_statement(sql), exp.Commit), sql
    for sql in ("ROLLBACK", "ABORT", "ROLLBACK WORK"):
        assert isinstance(parse_statement(sql), exp.Rollback), sql
    assert parse_statement("START TRANSACTION ISOLATION LEVEL REPEATABLE READ").args["modes"] == [
        "isolation level repeatable read"]
    assert parse_statement("ROLLBACK TO SAVEPOINT s").args["action"] == "rollback_to"  # savepoints: coordinator/session_sql.py
    # a comma where a mode belongs is PostgreSQL's syntax error (it was an internal IndexError: tests/fuzz)
    for sql, near in (("BEGIN ,", 'at or near ","'), ("START TRANSACTION READ ONLY, ,", 'at or near ","'),
                      ("BEGIN READ ONLY,", "at end of input")):
        with pytest.raises(SyntaxError_, match=near):
            parse_statement(sql)


def test_set_reset_discard() -> None:
    cases = {
        "SET search_path = public, \"My Schema\"": ("search_path", ["public", "My Schema"], False),
        "SET LOCAL statement_timeout TO '5s'": ("statement_timeout", ["5s"], True),
        "SET SESSION extra_float_digits = -3": ("extra_float_digits", ["-3"], False),
        "SET TIME ZONE 'UTC'": ("timezone", ["UTC"], False),
        "SET datestyle TO DEFAULT": ("datestyle", None, False),
        "set application_name = E'a\\tb'": ("application_name", ["a\tb"], False),
        "SET myapp.tenant = 7": ("myapp.tenant", ["7"], False),
    }
    for sql, (name, values, local) in cases.items():
        parsed = parse_statement(sql)
        assert isinstance(parsed, SetVariable), sql
        assert (parsed.this, parsed.args.get("values"), bool(parsed.args.get("local"))) == (name, values, local), sql
    assert isinstance(parse_statement("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), SetTransaction)
    assert parse_statement("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED").args["session"]
    assert parse_statement("RESET ALL").this == "all" and parse_statement("RESET TIME ZONE").this == "timezone"
    assert isinstance(parse_statement("RESET search_path"), ResetVariable)
    assert parse_statement("DISCARD ALL").this == "all" and isinstance(parse_statement("DISCARD TEMP"), DiscardStatement)


def test_copy_forms() -> None:
    copy = parse_statement("COPY (SELECT 1 AS a) TO STDOUT WITH (FORMAT csv, HEADER, DELIMITER ';', FORCE_QUOTE *)")
    assert isinstance(copy, CopyStatement) and copy.args["direction"] == "to"
    assert copy.args["query_sql"] == "SELECT 1 AS a"
    assert copy.args["options"] == {"format": "csv", "header": True, "delimiter": ";", "force_quote": "*"}
    legacy = parse_statement("COPY public.t (a, b) FROM STDIN WITH CSV HEADER DELIMITER AS '|' NULL AS 'nil'")
    assert legacy.args["table"] == ("public", "t") and legacy.args["columns"] == ["a", "b"]
    assert legacy.args["options"] == {"format": "csv", "header": True, "delimiter": "|", "null": "nil"}
    assert parse_statement("COPY t TO STDOUT (FORMAT binary)").args["options"] == {"format": "binary"}
    assert parse_statement("COPY t TO STDOUT BINARY").args["options"] == {"format": "binary"}
    assert parse_statement("COPY t FROM STDIN (HEADER false)").args["options"] == {"header": "false"}
    with pytest.raises(FeatureNotSupported):
        parse_statement("COPY t FROM '/etc/passwd'")
    with pytest.raises(SyntaxError_):
        parse_statement("COPY (SELECT 1) FROM STDIN")


@pytest.mark.parametrize("sql", ["DECLARE c CURSOR FOR", "FETCH", "SET x", "PREPARE p SELECT 1", "CLOSE", "RESET",
                                 "EXECUTE", "DISCARD EVERYTHING"])
def test_syntax_errors_have_positions(sql: str) -> None:
    with pytest.raises(SyntaxError_) as raised:
        parse_statement(sql)
    assert raised.value.sqlstate == "42601" and raised.value.position is not None


names = st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True).filter(
    lambda name: name not in {"all", "from", "in", "next", "forward", "to", "default", "local", "session"})


@settings(deadline=None)
@given(names, st.integers(min_value=0, max_value=10**6))
def test_fetch_round_trips_names_and_counts(name: str, count: int) -> None:
    fetch = parse_statement(f'FETCH FORWARD {count} FROM "{name}"')
    assert (fetch.this, fetch.args["count"]) == (name, count)


@settings(deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20))
def test_set_string_values_round_trip(value: str) -> None:
    quoted = "'" + value.replace("'", "''") + "'"
    assert parse_statement(f"SET application_name = {quoted}").args["values"] == [value]
