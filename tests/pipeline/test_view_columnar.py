"""pipeline/view_columnar.py: a view's partials reduced and finalized as columns (one DuckDB statement) store exactly
what the document path (the view's reduce schema through the real SchemaReducer, then ViewPlan.finalize) stores, over
several transactions, including when the two paths take turns on the same rows (the backfill writes documents)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.materialize.reduce import reducer_for_schema
from headrace.pipeline.view_columnar import ViewColumnarReducer, columnar_reducible, partials_table
from headrace.pipeline.views import _from_doc, _partial_state
from headrace.sql.view_aggregates import Maintenance, integer_sum
from headrace.sql.views import KEY_FIELD, ROWS_FIELD, STATE_FIELD, ViewPlan
from tests.sql.view_model import compile_sql

BENCH_VIEW = compile_sql(
    "CREATE MATERIALIZED VIEW v AS SELECT body->>'g' AS g, count(*) AS n, sum((body->>'v')::int) AS total, "
    "min((body->>'v')::int) AS lo, max((body->>'v')::int) AS hi, avg((body->>'v')::int) AS mean, "
    "bool_or((body->>'f')::bool) AS any_f FROM clicks GROUP BY body->>'g'")
WIDE_VIEW = compile_sql(
    "CREATE MATERIALIZED VIEW w AS SELECT body->>'g' AS g, (body->>'h')::int AS h, count(body->>'x') AS c, "
    "sum((body->>'x')::float8) AS fs, bool_and((body->>'f')::bool) AS every_f, min(body->>'name') AS first_name, "
    "max((body->>'x')::float8) AS top, min(received_at) AS since FROM clicks GROUP BY 1, 2")
GLOBAL_VIEW = compile_sql("CREATE MATERIALIZED VIEW t AS SELECT count(*) AS n, sum((body->>'v')::int) AS s FROM events")

_ARROW = {"int4": pa.int32(), "int8": pa.int64(), "float8": pa.float64(), "text": pa.string(), "bool": pa.bool_(),
          "timestamptz": pa.int64()}


def _values(pg_type: str) -> st.SearchStrategy[Any]:
    if pg_type in ("int4", "int8", "timestamptz"):
        return st.integers(-1000, 1000)
    if pg_type == "float8":
        return st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: round(f, 3))
    return st.text(alphabet='ab"\\é\n', max_size=4)


@st.composite
def grouped_partials(draw: st.DrawFn, plan: ViewPlan) -> pa.Table:
    """A transaction's grouped partials (as GroupedProjection.grouped makes them): distinct keys from a small pool,
    row counts that may retract (negative), and contribution columns consistent enough to exercise every branch."""
    key_pool = [("g1", 1), ("g2", 1), ("g\"3", 2), (None, None)]
    keys = draw(st.lists(st.sampled_from(key_pool), unique=True, min_size=1)) if plan.group_keys else [()]
    columns: dict[str, list[Any]] = {f"k{i}": [key[i] for key in keys] for i in range(len(plan.group_keys))}
    columns[ROWS_FIELD] = [draw(st.integers(-2, 3)) for _ in keys]
    types = {f"k{i}": _ARROW[t] for i, t in enumerate(plan.group_key_types)}
    types[ROWS_FIELD] = pa.int64()
    for aggregate in plan.aggregates:
        name, m = aggregate.field, aggregate.maintenance
        if m is Maintenance.COUNT:
            columns[f"{name}_n"] = [draw(st.integers(-2, 3)) for _ in keys]
            types[f"{name}_n"] = pa.int64()
        elif m is Maintenance.SUM:
            number = "int8" if integer_sum(aggregate) else "float8"
            columns[f"{name}_s"] = [draw(_values(number)) for _ in keys]
            columns[f"{name}_n"] = [draw(st.integers(-2, 3)) for _ in keys]
            types.update({f"{name}_s": _ARROW[number], f"{name}_n": pa.int64()})
        elif m is Maintenance.BOOL_COUNTS:
            for part in ("t", "f"):
                columns[f"{name}_{part}"] = [draw(st.integers(-1, 2)) for _ in keys]
                types[f"{name}_{part}"] = pa.int64()
        else:
            columns[f"{name}_v"] = [draw(st.none() | _values(aggregate.arg_types[0])) for _ in keys]
            types[f"{name}_v"] = _ARROW[aggregate.arg_types[0]]
    return pa.table({name: pa.array(values, types[name]) for name, values in columns.items()})


class DocumentPath:
    """The runtime's document path: partial document per group, SchemaReducer.full with the loaded one, finalize."""

    def __init__(self, plan: ViewPlan) -> None:
        self.plan = plan
        self.reducer = reducer_for_schema(plan.reduce_schema)

    def apply(self, store: dict[str, dict[str, Any]], grouped: pa.Table) -> None:
        for row in grouped.to_pylist():
            key_values = [_from_doc(row[f"k{i}"], t) for i, t in enumerate(self.plan.group_key_types)]
            key = json.dumps(key_values, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
            state: dict[str, Any] = {ROWS_FIELD: row[ROWS_FIELD]}
            for aggregate in self.plan.aggregates:
                partial = _partial_state(aggregate, row)
                if partial is not None:
                    state[aggregate.field] = partial
            doc = {KEY_FIELD: key, **{f"k{i}": v for i, v in enumerate(key_values)}, STATE_FIELD: state}
            reduced = self.reducer.full(store.get(key), doc)
            final = self.plan.finalize(reduced) if reduced is not None else None
            if final is None:
                store.pop(key, None)
            else:  # as the serving store keeps it: only the stored columns
                store[key] = {name: final.get(name) for name in (KEY_FIELD, *self.plan.stored_fields)}


class ColumnarPath:
    def __init__(self, plan: ViewPlan) -> None:
        self.plan = plan
        self.reducer = ViewColumnarReducer(plan)

    def apply(self, store: dict[str, dict[str, Any]], grouped: pa.Table) -> None:
        partials = partials_table(self.plan, grouped)
        requested = set(partials[KEY_FIELD].to_pylist())
        held = [doc for key, doc in store.items() if key in requested]
        loaded = None
        if held:  # LoadedColumns' form: hr_state as JSON text
            loaded = pa.table({KEY_FIELD: [doc[KEY_FIELD] for doc in held],
                               STATE_FIELD: [json.dumps(doc[STATE_FIELD]) for doc in held]})
        stores = self.reducer(partials, loaded)
        for table, exists in ((stores.rows, False), (stores.updated, True)):
            for row in (table.to_pylist() if table is not None else []):
                assert (row[KEY_FIELD] in store) == exists
                row[STATE_FIELD] = json.loads(row[STATE_FIELD])
                store[row[KEY_FIELD]] = row
        for key in (stores.deleted[KEY_FIELD].to_pylist() if stores.deleted is not None else []):
            assert key in store
            del store[key]


def _normal(store: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Stored rows compared by value (an integral double may come back as an int from JSON)."""
    return json.loads(json.dumps(store, sort_keys=True), parse_float=lambda text: round(float(text), 6),
                      parse_int=lambda text: round(float(text), 6))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_columnar_reduction_stores_what_the_document_path_stores(data: st.DataObject) -> None:
    for plan in (BENCH_VIEW, WIDE_VIEW, GLOBAL_VIEW):
        assert columnar_reducible(plan)
        transactions = data.draw(st.lists(grouped_partials(plan), min_size=1, max_size=4))
        turns = data.draw(st.lists(st.booleans(), min_size=len(transactions), max_size=len(transactions)))
        documents, columnar, mixed = DocumentPath(plan), ColumnarPath(plan), {}
        expected: dict[str, dict[str, Any]] = {}
        actual: dict[str, dict[str, Any]] = {}
        for grouped, columnar_turn in zip(transactions, turns):
            documents.apply(expected, grouped)
            columnar.apply(actual, grouped)
            (columnar if columnar_turn else documents).apply(mixed, grouped)
            assert _normal(actual) == _normal(expected)
            assert _normal(mixed) == _normal(expected)


def test_views_with_list_shaped_states_are_not_columnar() -> None:
    assert not columnar_reducible(compile_sql(
        "CREATE MATERIALIZED VIEW m AS SELECT body->>'g' AS g, min((body->>'v')::int) AS lo FROM events GROUP BY 1"))
    assert not columnar_reducible(compile_sql(
        "CREATE MATERIALIZED VIEW d AS SELECT body->>'g' AS g, count(DISTINCT body->>'u') AS u FROM clicks GROUP BY 1"))
