"""Errors are data (pipeline/view_errors.py): Spark's data errors as PostgreSQL's, failing changes isolated per view,
and each row's error state after a batch. On a real local Spark session, through the real view compiler."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from headrace.pipeline.table_views import change_rows, compile_table_views, view_documents_and_errors
from headrace.pipeline.view_errors import error_entries, isolate, pg_error
from headrace.catalog.views import MaterializedView
from headrace.sql.table_statements import table_from_create_sql
from headrace.store.table_log import RowChange

TABLE = table_from_create_sql("u1", "CREATE TABLE t (id int PRIMARY KEY, v int8, d int, s text)")


def spark_error(spark: Any, sql: str) -> BaseException:
    with pytest.raises(Exception) as caught:
        spark.sql(sql).toArrow()
    return caught.value


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT CAST(3000000000L AS INT)", ("22003", "integer out of range")),
    ("SELECT CAST(CAST(99999 AS INT) AS SMALLINT)", ("22003", "smallint out of range")),
    ("SELECT CAST(rint(1e19D) AS BIGINT)", ("22003", "bigint out of range")),
    ("SELECT 1 / 0", ("22012", "division by zero")),
    ("SELECT 7 % 0", ("22012", "division by zero")),
    ("SELECT 2147483647 + 1", ("22003", "integer out of range")),
    ("SELECT CAST('abc' AS INT)", ("22P02", 'invalid input syntax for type integer: "abc"')),
    ("SELECT CAST('99999999999' AS INT)", ("22003", 'value "99999999999" is out of range for type integer')),
    ("SELECT CAST('maybe' AS BOOLEAN)", ("22P02", 'invalid input syntax for type boolean: "maybe"')),
])
def test_spark_data_errors_become_postgresql_errors(spark: Any, sql: str, expected: tuple[str, str]) -> None:
    assert pg_error(spark_error(spark, sql)) == expected


def test_an_error_that_is_not_a_row_value_is_not_isolated(spark: Any) -> None:
    assert pg_error(spark_error(spark, "SELECT * FROM no_such_table")) is None
    assert pg_error(ValueError("not Spark's")) is None


def test_isolate_leaves_out_exactly_the_failing_changes(spark: Any) -> None:
    values = pa.table({"v": pa.array([1, 3_000_000_000, 2, None, 4_000_000_000, 5], pa.int64())})

    def evaluate(part: pa.Table) -> list[int]:
        return spark.createDataFrame(part).selectExpr("CAST(v AS INT) AS x").toArrow()["x"].to_pylist()

    result, failing = isolate(evaluate, values)
    assert result == [1, 2, None, 5]
    assert failing == {1: ("22003", "integer out of range"), 4: ("22003", "integer out of range")}
    assert isolate(evaluate, values.slice(0, 1)) == ([1], {})


def changes_of(*records: list[RowChange]) -> list[list[RowChange]]:
    return list(records)


def row(id_: int, v: int, d: int = 1) -> dict[str, Any]:
    return {"id": id_, "v": v, "d": d, "s": None}


def test_error_entries_follow_each_rows_last_change() -> None:
    records = changes_of([RowChange("i", (1,), row(1, 1), None)],
                         [RowChange("u", (2,), row(2, 9), row(2, 8))],
                         [RowChange("d", (3,), None, row(3, 7))])
    changes = change_rows(TABLE, records)  # +1 [1]; -1 +1 [2]; -1 [3]
    failing = {0: ("22003", "integer out of range"), 1: ("22012", "division by zero"),
               3: ("22012", "division by zero")}
    assert error_entries("u9", changes, failing) == [
        ["u9", "[1]", "22003", "integer out of range"],  # inserted, fails: set
        ["u9", "[2]", None, None],  # the failing old version retracted, the new one evaluates: cleared
        ["u9", "[3]", None, None],  # deleted: cleared
    ]


def test_a_table_batch_keeps_its_other_views_and_rows_past_a_failing_row(spark: Any) -> None:
    views = [MaterializedView(id="u2", name="totals", create_sql="CREATE MATERIALIZED VIEW totals AS SELECT count(*) "
                              "AS n, sum(v) AS total FROM t", input_schema="public", input_name="t"),
             MaterializedView(id="u3", name="casts", create_sql="CREATE MATERIALIZED VIEW casts AS SELECT id, "
                              "(v * 100000000)::int AS x, 100 / d AS q FROM t", input_schema="public", input_name="t")]
    compiled, failed = compile_table_views(TABLE, views)
    assert not failed
    records = [[RowChange("i", (1,), row(1, 1), None), RowChange("i", (2,), row(2, 30), None),
                RowChange("i", (3,), row(3, 2, 0), None)]]
    documents, errors = view_documents_and_errors(spark, TABLE, compiled, records)
    by_view: dict[int, list[Any]] = {}
    for index, _, doc in documents:
        by_view.setdefault(index, []).append(doc)
    assert [doc["hr_state"]["rows"] for doc in by_view[1]] == [3]  # every row counts in the other view
    assert sorted(doc["o0"] for doc in by_view[2]) == [1]  # only row 1 evaluates in the failing one
    assert sorted(errors) == [["u3", "[2]", "22003", "integer out of range"],
                              ["u3", "[3]", "22012", "division by zero"]]
