"""Limits on SQL text (sql/limits.py) and the planner's PostgreSQL errors for what a client can send: statement size
(54000), expression depth (54001), $0 (42P02), over 1664 output columns (54011), DuckDB's file and settings
functions (42883). The scan that splits large text agrees with sqlglot's tokenizer on quoting and comments."""

from __future__ import annotations

import time

import pytest

from headrace.errors import HeadraceError
from headrace.sql import limits
from headrace.sql.parser import SCAN_SPLIT_CHARS, parse_client_statement, parse_statement, split_statements
from headrace.sql.select import STORE_ONLY_FUNCTIONS, plan_select


def plan(sql: str) -> object:
    return plan_select(parse_statement(sql), lambda schema, name: True)


def sqlstate_of(call: object) -> str:
    with pytest.raises(HeadraceError) as raised:
        call()  # type: ignore[operator]
    return raised.value.sqlstate


@pytest.mark.parametrize("text", [
    "SELECT 1; SELECT 2",
    "SELECT 'a;b'; SELECT E'x\\';y'; SELECT $$ ; $$",
    "SELECT 'a\\'; SELECT 2",  # standard_conforming_strings: the backslash is a character
    "SELECT \"a;b\" FROM t;;",
    "SELECT $tag$ a;$$ $tag$; select 3",
    "SELECT 1 /* ; /* ; */ ; */ + 1; SELECT 2",
    "SELECT f($1, ';'); SELECT (1; 2)",
    "-- only a comment\n",
    "",
])
def test_scan_splits_like_the_tokenizer(text: str) -> None:
    assert limits.scan(text).statements == split_statements(text)


def test_large_text_is_split_by_the_scan() -> None:
    statement = "SELECT '" + ";" * 10 + "', " + ", ".join(["1"] * (SCAN_SPLIT_CHARS // 3))
    assert split_statements(f"{statement}; SELECT 2;") == [statement, "SELECT 2"]


@pytest.mark.parametrize("text, depth", [
    ("SELECT 1", 0), ("SELECT 1 + 2 * 3", 2), ("SELECT ((1))", 2), ("SELECT f(1 + 2, 3)", 2),
    ("SELECT a = 1 AND b = 2 AND c = 3", 1), ("SELECT '((((' || x", 1), ("SELECT 1 -- (((\n", 0),
    ("SELECT x::int", 1),
])
def test_depth_estimate(text: str, depth: int) -> None:
    assert limits.scan(text).depth == depth


def test_flat_lists_are_not_deep() -> None:
    assert limits.scan("SELECT " + " OR ".join(["a = 1"] * 10_000)).depth == 1
    assert limits.scan("SELECT 1 WHERE x IN (" + ", ".join(["1"] * 10_000) + ")").depth == 1


@pytest.mark.parametrize("text", [
    "SELECT " + "+".join(["1"] * 1002),
    "SELECT " + "(" * 1001 + "1" + ")" * 1001,
    "SELECT " + "(" * 100 + "1" + ")" * 100,  # within the scan's estimate, deeper than sqlglot's recursion
])
def test_too_deep_is_54001_with_postgresqls_hint(text: str) -> None:
    with pytest.raises(limits.StackDepthExceeded) as raised:
        parse_client_statement(text)
    assert raised.value.sqlstate == "54001" and raised.value.message == "stack depth limit exceeded"
    assert raised.value.hint is not None and 'max_stack_depth' in raised.value.hint


def test_deeper_than_the_parser_goes_is_54001_for_any_text() -> None:
    with pytest.raises(limits.StackDepthExceeded):  # Python's recursion limit inside sqlglot, mapped
        parse_statement("SELECT " + "(" * 100 + "1" + ")" * 100)


def test_the_catalog_s_own_text_is_not_held_to_the_client_limits() -> None:
    assert len(split_statements("SELECT " + "+".join(["1"] * 40_000) + "; SELECT 2")) == 2


def test_too_long_is_refused_before_any_scan() -> None:
    text = "SELECT " + "+".join(["1"] * 5_000_000)  # 10 MB
    started = time.perf_counter()
    for call in (lambda: parse_client_statement(text), lambda: limits.check_statement(text)):
        with pytest.raises(limits.StatementTooLong) as raised:
            call()
        assert raised.value.sqlstate == "54000" and "statement is too long" in raised.value.message
    assert time.perf_counter() - started < 1.0


def test_the_size_limit_counts_utf8_bytes_and_is_configurable() -> None:
    previous = limits.max_statement_bytes
    try:
        limits.configure(4096)
        limits.check_size("é" * 2048)  # 4,096 bytes
        with pytest.raises(limits.StatementTooLong):
            limits.check_size("é" * 2049)
        with pytest.raises(ValueError):
            limits.configure(10)
    finally:
        limits.configure(previous)


def test_parameter_zero_is_42p02() -> None:
    assert sqlstate_of(lambda: plan("SELECT $0")) == "42P02"
    assert sqlstate_of(lambda: plan("SELECT 1 WHERE 1 = $0")) == "42P02"


def test_target_list_limit_is_54011() -> None:
    plan("SELECT " + ", ".join(["1"] * 1664))
    assert sqlstate_of(lambda: plan("SELECT " + ", ".join(["1"] * 1665))) == "54011"
    assert sqlstate_of(lambda: plan("SELECT * FROM (SELECT " + ", ".join(["1"] * 1665) + ") AS t")) == "54011"


@pytest.mark.parametrize("sql, message", [
    ("SELECT read_text('/etc/passwd')", "function read_text(unknown) does not exist"),
    ("SELECT * FROM read_csv('/etc/passwd', 1)", "function read_csv(unknown, integer) does not exist"),
    ("SELECT * FROM read_parquet('x.parquet')", "function read_parquet(unknown) does not exist"),
    ("SELECT * FROM READ_JSON_AUTO('x')", "function read_json_auto(unknown) does not exist"),
    ("SELECT * FROM pg_catalog.read_blob('x')", "function read_blob(unknown) does not exist"),
    ("SELECT * FROM query('SELECT 1')", "function query(unknown) does not exist"),
    ("SELECT * FROM duckdb_settings()", "function duckdb_settings() does not exist"),
    ("SELECT x FROM (SELECT getvariable('a') AS x) AS t", "function getvariable(unknown) does not exist"),
    ("SELECT 1 WHERE EXISTS (SELECT * FROM sniff_csv('x'))", "function sniff_csv(unknown) does not exist"),
])
def test_store_only_functions_are_unknown(sql: str, message: str) -> None:
    with pytest.raises(HeadraceError) as raised:
        plan(sql)
    assert raised.value.sqlstate == "42883" and raised.value.message == message
    assert raised.value.hint == ("No function matches the given name and argument types. You might need to add "
                                 "explicit type casts.")


def test_postgresql_functions_still_plan() -> None:
    assert "GENERATE_SERIES" in str(plan("SELECT * FROM generate_series(1, 3)"))
    assert "REPEAT" in str(plan("SELECT repeat('a', 3)"))
    assert not STORE_ONLY_FUNCTIONS & {"generate_series", "repeat", "unnest", "json_each"}


# --- the serving store's own lockdown, below the translation --------------------------------------------------

@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_text('/etc/passwd')", "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_json('/etc/passwd')", "SELECT * FROM read_blob('/etc/passwd')",
    "SELECT * FROM read_parquet('/etc/passwd')", "SELECT * FROM glob('/etc/*')",
    "COPY (SELECT 1) TO '{tmp}/copied.csv'", "ATTACH '{tmp}/other.duckdb' AS other", "INSTALL httpfs", "LOAD httpfs",
    "SET enable_external_access = true", "SET threads = 1", "SET GLOBAL integer_division = false",
    "SELECT * FROM query('SELECT * FROM read_text(''/etc/passwd'')')",
])
def test_the_store_itself_refuses_files_extensions_and_settings(tmp_path: object, sql: str) -> None:
    import duckdb

    from headrace.store.query import translate_error
    from headrace.store.serving import ServingStore

    store = ServingStore(tmp_path / "store.duckdb", threads=1)  # type: ignore[operator]
    try:
        with store.cursor() as cursor:
            with pytest.raises(duckdb.Error) as refused:
                cursor.execute(sql.format(tmp=tmp_path))
            assert translate_error(refused.value).sqlstate != "XX000"
            assert cursor.execute("SELECT 7 / 2").fetchone() == (3,)  # PostgreSQL's integer division stays on
    finally:
        store.close()
    assert not (tmp_path / "copied.csv").exists() and not (tmp_path / "other.duckdb").exists()  # type: ignore[operator]


def test_store_errors_for_unknown_functions_and_depth_are_postgresqls() -> None:
    import duckdb

    from headrace.store.query import translate_error
    from headrace.store.serving import locked_down_config

    connection = duckdb.connect(":memory:", config=locked_down_config(1))
    for sql, state in (("SELECT pg_read_file('x')", "42883"), ("SELECT * FROM pg_ls_dir('/')", "42883"),
                       ("SELECT * FROM read_text('/etc/passwd')", "42501"),
                       ("SELECT " + "+".join(["1"] * 1200), "54001")):
        with pytest.raises(duckdb.Error) as refused:
            connection.execute(sql)
        assert translate_error(refused.value).sqlstate == state, sql
