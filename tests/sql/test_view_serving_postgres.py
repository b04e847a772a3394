"""A view's public relation in PostgreSQL's dialect (sql/view_serving.py, dialect="postgres") runs on a real
PostgreSQL 15 over the stored table and shows the view's columns with PostgreSQL's types and values."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from headrace.sql.parser import parse_statement
from headrace.sql.view_serving import public_relation_sql, view_binding
from headrace.sql.views import InputRelation, ViewPlan, compile_view
from headrace.store.postgres_serving import PostgresServingStore
from tests.real_servers.postgres import new_store_database

TABLE = InputRelation(kind="table", item_id="u1", name="t",
                      columns={"id": "int4", "g": "int2", "n": "numeric", "f": "float4", "v": "varchar",
                               "j": "jsonb", "a": "int4[]"},
                      key=("id",), append_only=False)


def _plan(select: str) -> ViewPlan:
    return compile_view(parse_statement(f"CREATE MATERIALIZED VIEW v AS {select}"),  # type: ignore[arg-type]
                        lambda schema, name: TABLE if name == "t" else None)


@pytest.fixture(scope="module")
def conninfo() -> Iterator[str]:
    url = new_store_database("viewserving")
    PostgresServingStore(url).close()  # its schemas
    yield url


def _create(conninfo: str, plan: ViewPlan, rows: list[tuple[object, ...]],
            view_id: str) -> psycopg.Connection[tuple[object, ...]]:
    store = PostgresServingStore(conninfo)
    try:
        store.apply(view_binding(plan, view_id))
    finally:
        store.close()
    conn = psycopg.connect(conninfo, autocommit=True)
    fields = ", ".join(f'"{name}"' for name in ("hr_key", *plan.stored_fields))
    for row in rows:
        conn.execute(f'INSERT INTO headrace_internal."view_{view_id}" ({fields}) VALUES '
                     f'({", ".join(["%s"] * len(row))})', list(row))
    conn.execute("DROP VIEW IF EXISTS public.v")
    conn.execute(public_relation_sql(plan, view_id, dialect="postgres"))
    return conn


def _types(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    return [row[0] for row in conn.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'public.v'::regclass "
        "AND attnum > 0 ORDER BY attnum").fetchall()]


def test_non_aggregating_view_keeps_postgres_types(conninfo: str) -> None:
    plan = _plan("SELECT id, g, n, f, v, j, a FROM t")
    conn = _create(conninfo, plan, [('[1]', 1, 2, 1.5, 2.5, "x", '{"k": 1}', "[1, 2, 3]"),
                                    ('[2]', 2, None, None, None, None, None, "[]")], "x1")
    assert _types(conn) == ["integer", "smallint", "numeric", "real", "character varying", "jsonb", "integer[]"]
    with conn.cursor() as cursor:
        cursor.execute("SELECT id::text, g::text, n::text, f::text, v, j::text, a::text FROM v ORDER BY id")
        assert cursor.fetchall() == [("1", "2", "1.5", "2.5", "x", '{"k": 1}', "{1,2,3}"),
                                     ("2", None, None, None, None, None, "{}")]


def test_aggregating_view_divides_as_postgres(conninfo: str) -> None:
    plan = _plan("SELECT g, sum(id) / count(*) AS mean, count(*) AS n FROM t GROUP BY g")
    fields = plan.stored_fields
    assert fields[0] == "k0"
    row = {"hr_key": "[1]", "k0": 1}
    values = {"sum": 7, "count_star": 2}
    for aggregate in plan.aggregates:
        row[aggregate.field] = values.get(aggregate.function, 2)
    conn = _create(conninfo, plan, [tuple(row.get(name) for name in ("hr_key", *fields))], "x2")
    with conn.cursor() as cursor:
        cursor.execute("SELECT g, mean, n FROM v")
        assert cursor.fetchall() == [(1, 3, 2)]  # integer division, as PostgreSQL's 7 / 2
    assert _types(conn)[:3] == ["smallint", "bigint", "bigint"]


def test_global_aggregate_shows_its_empty_row(conninfo: str) -> None:
    plan = _plan("SELECT count(*) AS n, sum(n) AS total FROM t")
    conn = _create(conninfo, plan, [], "x3")
    assert conn.execute("SELECT n, total FROM v").fetchall() == [(0, None)]
