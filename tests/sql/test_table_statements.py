"""CREATE TABLE into a catalog Table (sql/table_statements.py)."""

from __future__ import annotations

import pytest

from headrace.catalog.tables import HIDDEN_ROW_ID, HIDDEN_VERSION
from headrace.errors import HeadraceError
from headrace.sql.table_statements import table_from_create_sql


def test_columns_types_and_keys() -> None:
    table = table_from_create_sql("u3", "CREATE TABLE IF NOT EXISTS s.t (a int PRIMARY KEY, b varchar(5) NOT NULL, "
                                        "c double precision, d jsonb, e timestamptz, f bytea, g boolean, h bigint);")
    assert (table.schema, table.name, table.primary_key) == ("s", "t", ("a",))
    assert [c.pg_type for c in table.columns] == ["int4", "varchar", "float8", "jsonb", "timestamptz", "bytea",
                                                  "bool", "int8"]
    assert table.column("b").max_length == 5 and table.not_null_columns == ("a", "b")
    assert list(table.store_columns())[0] == "a" and table.materialization == "table_u3"
    composite = table_from_create_sql("u4", "CREATE TABLE t (a int, b text, PRIMARY KEY (b, a))")
    assert composite.store_key == ("b", "a") and composite.not_null_columns == ("a", "b")


def test_without_primary_key_a_hidden_row_id() -> None:
    table = table_from_create_sql("u5", "CREATE TABLE n (x int)")
    assert table.store_key == (HIDDEN_ROW_ID,) and table.column_names() == ["x"]
    assert table.store_columns() == {HIDDEN_ROW_ID: "BIGINT", "x": "INTEGER", HIDDEN_VERSION: "BIGINT"}


@pytest.mark.parametrize("sql, sqlstate", [
    ("CREATE TABLE t (a numeric(39,2))", "0A000"),
    ("CREATE TABLE t (a int, a int)", "42701"),
    ("CREATE TABLE t (a int PRIMARY KEY, b int PRIMARY KEY)", "42P16"),
    ("CREATE TABLE t (a int, PRIMARY KEY (z))", "42703"),
    ("CREATE TABLE t (a int DEFAULT random())", "0A000"),
    ("CREATE TABLE t AS SELECT 1", "0A000"),
])
def test_refused_definitions(sql: str, sqlstate: str) -> None:
    with pytest.raises(HeadraceError) as error:
        table_from_create_sql("u1", sql)
    assert error.value.sqlstate == sqlstate
