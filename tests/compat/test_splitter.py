"""The psql-style splitter, the comparison and the baseline check, without servers."""

from __future__ import annotations

from tests.compat.compare import DIFFERS, ERROR_DIFFERS, ERROR_SAME, HR_ERROR, SAME, compare
from tests.compat.session import Outcome
from tests.compat.splitter import Kind, has_top_level_order_by, split


def sql_of(script: str) -> list[str]:
    return [s.sql for s in split(script) if s.kind is Kind.SQL]


def test_statements_end_at_semicolons_outside_quotes_comments_and_parentheses() -> None:
    script = """SELECT 'a;b', "x;y" FROM t; -- comment; not a statement
/* block ; /* nested ; */ still comment; */ SELECT E'it\\'s;' AS v;
CREATE FUNCTION f() RETURNS int AS $body$ SELECT 1; $body$ LANGUAGE sql;
SELECT $$;$$, $1;
SELECT (1;
2);
"""
    assert sql_of(script) == [
        """SELECT 'a;b', "x;y" FROM t;""",
        "SELECT E'it\\'s;' AS v;",
        "CREATE FUNCTION f() RETURNS int AS $body$ SELECT 1; $body$ LANGUAGE sql;",
        "SELECT $$;$$, $1;",
        "SELECT (1;\n2);",
    ]


def test_standard_strings_do_not_escape_with_backslash() -> None:
    assert sql_of("SELECT 'a\\'; SELECT 2;") == ["SELECT 'a\\';", "SELECT 2;"]


def test_meta_commands_are_skipped_and_gset_ends_a_skipped_statement() -> None:
    statements = split("\\pset null '(null)'\nSELECT 1 AS x \\gset\nSELECT :x;\nSELECT 2 \\g\n")
    assert [(s.kind, s.sql) for s in statements] == [
        (Kind.SKIPPED, "\\pset null '(null)'"), (Kind.SKIPPED, "SELECT 1 AS x"), (Kind.SQL, "SELECT :x;"),
        (Kind.SQL, "SELECT 2")]
    assert statements[1].reason == "ended by \\gset"


def test_copy_from_stdin_takes_its_data_lines() -> None:
    statements = split("COPY t (a, b) FROM stdin;\n1\tx\n2\t\\N\n\\.\nSELECT 1;\n")
    assert [s.sql for s in statements] == ["COPY t (a, b) FROM stdin;", "SELECT 1;"]
    assert statements[0].copy_data == "1\tx\n2\t\\N\n"
    assert statements[1].line == 5


def test_copy_from_a_psql_variable_reads_the_data_file() -> None:
    statements = split("\\getenv abs_srcdir PG_ABS_SRCDIR\n\\set filename :abs_srcdir '/data/agg.data'\n"
                       "COPY aggtest FROM :'filename';\n")
    copy = [s for s in statements if s.kind is Kind.SQL]
    assert copy[0].sql == "COPY aggtest FROM STDIN;" and copy[0].copy_file == "data/agg.data"


def test_line_numbers_and_select_detection() -> None:
    statements = split("-- header\n\nSELECT 1;\nWITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x;\nVALUES (1);\n")
    assert [s.line for s in statements] == [3, 4, 5]
    assert [s.is_select for s in statements] == [True, False, True]


def test_order_by_counts_only_at_the_top_level() -> None:
    assert has_top_level_order_by("SELECT a FROM t ORDER BY a")
    assert not has_top_level_order_by("SELECT row_number() OVER (ORDER BY a) FROM t")
    assert not has_top_level_order_by("SELECT 'order by' FROM (SELECT a FROM t ORDER BY a) s")


def test_comparison_verdicts() -> None:
    rows = Outcome("ok", columns=["a"], rows=[("1",), ("2",)], tag="SELECT 2")
    swapped = Outcome("ok", columns=["a"], rows=[("2",), ("1",)], tag="SELECT 2")
    assert compare(rows, swapped, ordered=False).verdict == SAME
    assert compare(rows, swapped, ordered=True).verdict == DIFFERS
    renamed = Outcome("ok", columns=["b"], rows=rows.rows, tag="SELECT 2")
    assert compare(rows, renamed, ordered=False).verdict == DIFFERS
    assert compare(rows, Outcome("error", sqlstate="42703"), ordered=False).verdict == HR_ERROR
    failed = Outcome("error", sqlstate="22012")
    assert compare(failed, Outcome("error", sqlstate="22012"), ordered=False).verdict == ERROR_SAME
    assert compare(failed, rows, ordered=False).verdict == ERROR_DIFFERS
    assert compare(Outcome("ok", tag="INSERT 0 1"), Outcome("ok", tag="INSERT 0 2"), ordered=False).verdict == DIFFERS


def test_begin_atomic_bodies_keep_their_semicolons() -> None:
    script = """CREATE FUNCTION f(x int) RETURNS int LANGUAGE SQL
BEGIN ATOMIC
  SELECT CASE WHEN x > 0 THEN 1 ELSE 0 END;
  SELECT 2;
END;
BEGIN;
SELECT 3;
"""
    assert sql_of(script) == [
        "CREATE FUNCTION f(x int) RETURNS int LANGUAGE SQL\nBEGIN ATOMIC\n  SELECT CASE WHEN x > 0 THEN 1 ELSE 0 END;\n"
        "  SELECT 2;\nEND;", "BEGIN;", "SELECT 3;"]


def test_psql_variables_are_interpolated_and_lexed() -> None:
    script = "\\set init 'truncate t; insert into t VALUES (''a'', 1)'\n:init;\nSELECT 1::int, ':init';\n"
    assert sql_of(script) == ["truncate t;", "insert into t VALUES ('a', 1);", "SELECT 1::int, ':init';"]


def test_backslash_escapes_follow_standard_conforming_strings() -> None:
    script = "set standard_conforming_strings = off;\nselect 'ab\\\\\\'cd;';\nRESET standard_conforming_strings;\n" \
             "select 'a\\';\n"
    assert sql_of(script) == ["set standard_conforming_strings = off;", "select 'ab\\\\\\'cd;';",
                              "RESET standard_conforming_strings;", "select 'a\\';"]


def test_baseline_regressions_compare_exact_fractions() -> None:
    from tests.compat.baseline import regressions
    recorded = {"int2": {"same": 20, "pg_ok": 28, "score": 0.7143}}
    assert regressions("int2", 20, 28, recorded) is None  # equal, though 20/28 < the rounded 0.7143
    assert regressions("int2", 21, 28, recorded) is None
    assert regressions("int2", 19, 28, recorded) is not None
    assert regressions("int4", 1, 1, recorded) is not None  # no baseline is a failure, not a pass
