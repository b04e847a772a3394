"""sql/view_numeric.py: numeric as PostgreSQL 15 shows it, checked against a real PostgreSQL: avg of integers and of
numerics (numeric_div's select_div_scale and rounding), sums keeping their inputs' display scale, and the display
scales the compiler gives a view's numeric columns (refusing numeric division)."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from headrace.errors import FeatureNotSupported
from headrace.sql import view_numeric
from headrace.sql.view_aggregates import finalize, fold, Change
from tests.real_servers.postgres import shared_cluster
from tests.sql.view_model import compile_sql


def _random_groups(seed: int) -> list[list[int]]:
    r = random.Random(seed)
    groups = []
    for _ in range(300):
        magnitude = r.choice([1, 9, 10, 99, 10_000, 123_456, 10**9, 2**31 - 1, 10**15, 9 * 10**18])
        groups.append([r.randint(-magnitude, magnitude) for _ in range(r.randint(1, 12))])
    groups += [[1, 2], [1, 1, 1], [1, 2, 2], [-1, -2], [0], [0, 0, 1], [9999, 1], [10000, 3], [5, 2, 2, 2, 2, 2, 2]]
    return groups


@pytest.fixture(scope="module")
def postgres() -> Any:
    with psycopg.connect(shared_cluster().create_database("view_numeric"), autocommit=True) as connection:
        yield connection


def _postgres_avg(postgres: Any, values: list[Any], cast: str) -> str:
    literal = ", ".join(f"({v}::{cast})" for v in values)
    row = postgres.execute(f"SELECT avg(v)::text, sum(v)::text FROM (VALUES {literal}) AS t(v)").fetchone()
    return row


def test_avg_of_integers_is_postgresql_numeric_division(postgres: Any) -> None:
    avg = compile_sql("CREATE MATERIALIZED VIEW v AS SELECT avg((body->>'i')::bigint) AS a, "
                      "sum((body->>'i')::bigint) AS s FROM events").aggregates
    for group in _random_groups(22):
        changes = [Change(seq=i, diff=1, row=f"[{i}]", at=i, args=(v,)) for i, v in enumerate(group)]
        mine = tuple(finalize(a, fold(a, changes))[0] for a in avg)
        assert mine == _postgres_avg(postgres, group, "bigint"), group


def test_numeric_sums_and_avg_keep_postgresql_display_scales(postgres: Any) -> None:
    plan = compile_sql("CREATE MATERIALIZED VIEW v AS SELECT avg((body->>'n')::numeric(14,3)) AS a, "
                       "sum((body->>'n')::numeric(14,3)) AS s FROM events")
    r = random.Random(7)
    for _ in range(200):
        group = [Decimal(r.randint(-10**9, 10**9)).scaleb(-3) for _ in range(r.randint(1, 9))]
        changes = [Change(seq=i, diff=1, row=f"[{i}]", at=i, args=(float(v),)) for i, v in enumerate(group)]
        mine = tuple(finalize(a, fold(a, changes))[0] for a in plan.aggregates)
        assert mine == _postgres_avg(postgres, [str(v) for v in group], "numeric(14,3)"), group


def test_values_keep_their_own_scale_where_the_expression_fixes_none() -> None:
    assert view_numeric.to_text(2.5, None) == "2.5"
    assert view_numeric.to_text(3.0, None) == "3"
    assert view_numeric.to_text(0.001, None) == "0.001"
    assert view_numeric.to_text(1.2e19, None) == "12000000000000000000"
    assert view_numeric.to_text(2.5, 3) == "2.500"
    assert view_numeric.to_text(-0.0, 1) == "0.0"


@pytest.mark.parametrize(("select", "scales"), [
    ("SELECT (body->>'n')::numeric(12,2) AS x FROM events", {"o0": 2}),
    ("SELECT (body->>'n')::numeric(12,2) * 3 AS x FROM events", {"o0": 2}),
    ("SELECT (body->>'n')::numeric(12,2) * 0.5 AS x FROM events", {"o0": 3}),
    ("SELECT (body->>'n')::numeric AS x FROM events", {"o0": None}),
    ("SELECT round((body->>'n')::numeric, 4) AS x FROM events", {"o0": 4}),
    ("SELECT (body->>'i')::int::numeric AS x FROM events", {"o0": 0}),
    ("SELECT body->>'g' AS g, sum((body->>'i')::bigint) AS s, avg((body->>'i')::int) AS a, "
     "max((body->>'n')::numeric(9,1)) AS m FROM events GROUP BY 1", {"a0": 0, "a1": None, "a2": 1}),
])
def test_display_scales_of_numeric_columns(select: str, scales: dict[str, int | None]) -> None:
    plan = compile_sql(f"CREATE MATERIALIZED VIEW v AS {select}")
    assert plan.numeric_scales == scales
    assert all(o.pg_type == "numeric" for o in plan.outputs if o.name != "g")


@pytest.mark.parametrize("select", [
    "SELECT (body->>'n')::numeric / 4 AS x FROM events",
    "SELECT sum((body->>'n')::numeric / 4) AS x FROM events",
    "SELECT body->>'g' AS g FROM events WHERE (body->>'n')::numeric / 3 > 1",
    "SELECT (body->>'n')::numeric(12,2) * 0.000000001 AS x FROM events",  # 11 fractional digits
    "SELECT (body->>'n')::numeric(40,2) AS x FROM events",
])
def test_numeric_the_pipeline_cannot_compute_exactly_is_refused(select: str) -> None:
    with pytest.raises(FeatureNotSupported) as refused:
        compile_sql(f"CREATE MATERIALIZED VIEW v AS {select}")
    assert refused.value.sqlstate == "0A000"


def test_int8_sums_are_exact_beyond_64_bits_through_the_reduction() -> None:
    """sum(int8) is numeric in PostgreSQL and never overflows: partials are decimal text, reduced exactly."""
    from headrace.materialize.reduce import reducer_for_schema

    plan = compile_sql("CREATE MATERIALIZED VIEW v AS SELECT sum((body->>'i')::bigint) AS s, "
                       "avg((body->>'i')::bigint) AS a FROM events")
    reducer = reducer_for_schema(plan.reduce_schema)
    big = 9_000_000_000_000_000_000
    stored = None
    for batch in ([big, big], [big], [-big, 7]):
        changes = [Change(seq=i, diff=1 if v > 0 or v == 7 else -1, row=f"[{i}]", at=i, args=(abs(v) if v != 7 else 7,))
                   for i, v in enumerate(batch)]
        state = {"rows": sum(c.diff for c in changes), **{a.field: fold(a, changes) for a in plan.aggregates}}
        stored = plan.finalize(reducer.full(stored, {"hr_key": "[]", "hr_state": state}))
    assert stored is not None
    assert stored["a0"] == str(2 * big + 7)
    assert stored["a1"] == view_numeric.text(view_numeric.numeric_div(Decimal(2 * big + 7), 0, Decimal(3)))


def test_integer_division_in_integers_gives_numeric_div_digits() -> None:
    r = random.Random(5)
    for _ in range(20_000):
        magnitude = r.choice([1, 9, 99, 9999, 10**5, 10**9, 10**19, 10**30])
        total, count = r.randint(-magnitude, magnitude), r.randint(1, r.choice([3, 10**4, 10**9]))
        assert view_numeric.integer_div_text(total, count) == \
            view_numeric.text(view_numeric.numeric_div(Decimal(total), 0, Decimal(count))), (total, count)


def _array_text(elements: list[str | None]) -> str:
    return "{" + ",".join("NULL" if e is None else e for e in elements) + "}"


@pytest.mark.parametrize("source", ["events", "clicks"])  # retracting (keyed set) and append-only (append)
def test_array_agg_of_numeric_is_an_exact_numeric_array(postgres: Any, source: str) -> None:
    plan = compile_sql(f"CREATE MATERIALIZED VIEW v AS SELECT array_agg((body->>'n')::numeric(12,2)) AS a, "
                       f"array_agg(DISTINCT (body->>'n')::numeric(12,2)) AS d, "
                       f"array_agg(round((body->>'n')::numeric, 3)) AS r FROM {source}")
    assert [o.pg_type for o in plan.outputs] == ["numeric[]"] * 3
    assert plan.numeric_scales == {"a0": 2, "a1": 2, "a2": 3}
    r = random.Random(11)
    for _ in range(50):
        group = [None if r.random() < 0.1 else Decimal(r.randint(-10**6, 10**6)).scaleb(-2) for _ in range(r.randint(1, 7))]
        group += [Decimal("-3"), Decimal("0")]
        changes = [Change(seq=i, diff=1, row=f"[{i}]", at=i, args=(None if v is None else float(v),))
                   for i, v in enumerate(group)]
        mine = tuple(_array_text(finalize(a, fold(a, changes))[0]) for a in plan.aggregates)
        literal = ", ".join(f"({'NULL' if v is None else repr(str(v))}::numeric(12,2))" for v in group)
        truth = postgres.execute(f"SELECT array_agg(v)::text, array_agg(DISTINCT v)::text, "
                                 f"array_agg(round(v, 3))::text FROM (VALUES {literal}) AS t(v)").fetchone()
        assert mine == truth, group


def test_a_tables_numeric_columns_have_the_scale_the_table_holds() -> None:
    from headrace.catalog.tables import Table, TableColumn
    from headrace.pipeline.table_views import table_relation

    table = Table(id="t1", schema="public", name="t", columns=(
        TableColumn(name="id", pg_type="int4"), TableColumn(name="n", pg_type="numeric"),
        TableColumn(name="m", pg_type="numeric", precision=12, scale=2),
        TableColumn(name="w", pg_type="numeric", precision=5)), primary_key=("id",), create_sql="")
    # an unconstrained numeric is held as numeric(38,10) (docs/tables.md): its SELECT shows 2.5000000000, so does a view
    assert dict(table_relation(table).scales) == {"n": 10, "m": 2, "w": 0}


def test_numeric_arrays_are_exact_on_duckdb_too() -> None:
    from headrace.sql.view_serving import public_type

    assert public_type("numeric[]", 2) == "DECIMAL(38,2)[]"
    assert public_type("numeric[]", None) == "DECIMAL(38,16)[]"  # DuckDB's one scale per column (docs/views.md)
    assert public_type("int2[]") == "SMALLINT[]" and public_type("text[]") == "VARCHAR[]"
