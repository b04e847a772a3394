"""Parameter types as PostgreSQL infers them: a parameter compared with (or added to) an expression takes that
expression's type. plan_select builds a probe query of the partner expressions; the coordinator describes it
in the store (here: a real DuckDB) and plans again with the types found."""

from __future__ import annotations

import duckdb
import pytest

from headrace.sql.parser import parse_statement
from headrace.sql.select import parameter_types_from_probe, plan_select
from headrace.sql.types import oid_of_duckdb_type

INT4, INT8, TEXT, DATE, BOOL = 23, 20, 25, 1082, 16


@pytest.fixture(scope="module")
def store() -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    connection.execute("CREATE TABLE kv (k INTEGER, v VARCHAR, d DATE, n BIGINT, f BOOLEAN)")
    return connection


def inferred(store: duckdb.DuckDBPyConnection, sql: str, declared: tuple[int, ...] = ()) -> tuple[int, ...]:
    ast = parse_statement(sql)
    plan = plan_select(ast, lambda schema, name: True, declared)
    if plan.param_probe is None:
        return plan.param_types
    types = [str(t) for t in store.sql(plan.param_probe[1]).types]
    again = plan_select(ast, lambda schema, name: True, parameter_types_from_probe(plan, declared, types,
                                                                                 oid_of_duckdb_type))
    assert again.param_probe is None or set(again.param_probe[0]).isdisjoint(plan.param_probe[0])
    return again.param_types


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT v FROM kv WHERE k = $1", (INT4,)),
    ("SELECT v FROM kv WHERE $1 = k", (INT4,)),
    ("SELECT v FROM kv WHERE k = $1 AND v = $2 AND d >= $3 AND n < $4 AND f <> $5", (INT4, TEXT, DATE, INT8, BOOL)),
    ("SELECT v FROM kv WHERE k IN ($1, $2)", (INT4, INT4)),
    ("SELECT v FROM kv WHERE n BETWEEN $1 AND $2", (INT8, INT8)),
    ("SELECT k + $1 FROM kv", (INT4,)),
    ("SELECT v FROM kv WHERE k + $1 > 0 LIMIT $2", (INT4, INT8)),
    ("SELECT $1", (TEXT,)),  # nothing to infer from: unknown -> text, as PostgreSQL does for a bare $1
    ("SELECT v FROM kv WHERE k = $1::text", (TEXT,)),  # a cast says it
    ("SELECT v FROM kv WHERE k = (SELECT max(k) FROM kv WHERE v = $1)", (TEXT,)),  # only the top level
])
def test_parameters_take_their_partner_type(store: duckdb.DuckDBPyConnection, sql: str,
                                            expected: tuple[int, ...]) -> None:
    assert inferred(store, sql) == expected


def test_declared_types_win(store: duckdb.DuckDBPyConnection) -> None:
    assert inferred(store, "SELECT v FROM kv WHERE k = $1 AND n = $2", (INT8, 0)) == (INT8, INT8)
