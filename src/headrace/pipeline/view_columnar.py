"""A view's partial documents as columns, reduced with the stored rows as columns (materialize/columnar.py).

For a view whose aggregates all keep sum or extreme states (count, sum, avg, bool_and/or, and min/max over an
append-only input: pipeline/view_partials.py ARROW_GROUPED), the per-transaction partials are already an Arrow table
grouped by pyarrow. Instead of a Python document per group (then a JSON Load, Loaded, Store per group and a Python
reduction and finalization each), the table goes to the runtime as it is: the keys are Loaded as one LoadColumns,
and `ViewColumnarReducer` reduces and finalizes every group in ONE DuckDB statement over the partials and the loaded
rows (an in-memory DuckDB of the pipeline process, not the serving store): the same arithmetic as the view's reduce
schema (sum strategies for counts and sums, minimize / maximize for extremes) followed by ViewPlan.finalize (value of
each aggregate from its state; a group whose row count falls to 0 is deleted). The state is written as the document
path writes it (absent extremes omitted, an emptied sum kept as {"s": 0, "n": 0}), so both paths read each other's
rows: the backfill and views over views keep the document path.

Measured at 10,000 groups x 6 aggregates: see docs/views.md (columnar reduction)."""

from __future__ import annotations

import json
import threading
import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from headrace.materialize.columnar import ColumnarStores
from headrace.sql.view_aggregates import Aggregate, Maintenance, integer_avg, integer_sum
from headrace.sql.views import KEY_FIELD, ROWS_FIELD, STATE_FIELD, ViewPlan

_EXTREME_TYPES = {"int2": "BIGINT", "int4": "BIGINT", "int8": "BIGINT", "float4": "DOUBLE", "float8": "DOUBLE",
                  "text": "VARCHAR", "varchar": "VARCHAR", "bool": "BOOLEAN",
                  "timestamptz": "BIGINT"}


def columnar_reducible(plan: ViewPlan) -> bool:
    """Every aggregate keeps a count, sum, bool-count or (non-JSON, non-numeric) extreme state, and no group key is
    numeric (its text is the document path's finalize)."""
    from headrace.pipeline.view_partials import arrow_groupable

    return arrow_groupable(plan) and "numeric" not in plan.group_key_types and all(
        (a.maintenance is not Maintenance.EXTREME or a.arg_types[0] in _EXTREME_TYPES)
        and not (integer_sum(a) and a.arg_types[0] == "int8")  # decimal text sums: the document path
        for a in plan.aggregates)


def partials_table(plan: ViewPlan, grouped: pa.Table) -> pa.Table:
    """The grouped partials (k*, rows, contribution columns) with hr_key first: the canonical JSON of the group's
    key values, computed exactly as the document path computes it (so both paths address the same rows)."""
    from headrace.pipeline.views import _canonical, _from_doc

    key_columns = [grouped[f"k{i}"].to_pylist() for i in range(len(plan.group_keys))]
    types = plan.group_key_types
    keys = [_canonical([_from_doc(v, t) for v, t in zip(values, types)]) for values in zip(*key_columns)] \
        if key_columns else [_canonical([])] * grouped.num_rows
    return grouped.add_column(0, KEY_FIELD, pa.array(keys, pa.string()))


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class ViewColumnarReducer:
    """reduce(partials, loaded) -> ColumnarStores for one view (see module docstring). Not shared across threads."""

    def __init__(self, plan: ViewPlan) -> None:
        assert columnar_reducible(plan)
        self.plan = plan
        self._sql = _reduce_sql(plan)
        # One thread: 10k-row statements gain nothing from more, and the pipeline shares 2 cores with Spark.
        self._connection = duckdb.connect(":memory:", config={"threads": 1})
        self._lock = threading.Lock()

    def __call__(self, partials: pa.Table, loaded: pa.Table | None) -> ColumnarStores:
        if loaded is None:
            loaded = pa.table({KEY_FIELD: pa.array([], pa.string()), STATE_FIELD: pa.array([], pa.string())})
        with self._lock:
            cursor = self._connection.cursor()
            try:
                cursor.register("hr_partials", partials)
                cursor.register("hr_loaded", loaded.select([KEY_FIELD, STATE_FIELD]))
                result = cursor.execute(self._sql).fetch_arrow_table()
            finally:
                cursor.close()
        result = _numeric_values(self.plan, result)
        exists, live = result["hr_exists"], pc.greater(result["hr_rows"], 0)
        stored = [KEY_FIELD, *self.plan.stored_fields]
        rows = result.filter(pc.and_(pc.invert(exists), live)).select(stored)
        updated = result.filter(pc.and_(exists, live)).select(stored)
        deleted = result.filter(pc.and_(exists, pc.invert(live))).select([KEY_FIELD])
        return ColumnarStores(rows=rows if rows.num_rows else None, updated=updated if updated.num_rows else None,
                              deleted=deleted if deleted.num_rows else None)


def _numeric_values(plan: ViewPlan, result: pa.Table) -> pa.Table:
    """Integer sums shown as numeric (avg of int2/int4) as ViewPlan.finalize shows them: PostgreSQL's
    numeric text, avg as numeric division of the exact sum by the count."""
    for aggregate in plan.aggregates:
        if aggregate.output_type != "numeric":
            continue
        name = aggregate.field
        sums, counts = result[f"hr_s_{name}"].to_pylist(), result[f"hr_n_{name}"].to_pylist()
        if aggregate.function == "avg":
            values = [None if s is None or not n or n <= 0 else integer_avg(s, n) for s, n in zip(sums, counts)]
        else:
            values = [None if s is None or not n or n <= 0 else str(s) for s, n in zip(sums, counts)]
        result = result.set_column(result.schema.get_field_index(name), name, pa.array(values, pa.string()))
    return result


def _state_type(plan: ViewPlan) -> str:
    """The DuckDB structure of hr_state for from_json."""
    fields = {ROWS_FIELD: "BIGINT"}
    for aggregate in plan.aggregates:
        m = aggregate.maintenance
        if m is Maintenance.COUNT:
            fields[aggregate.field] = "BIGINT"
        elif m is Maintenance.SUM:
            fields[aggregate.field] = {"s": _sum_type(aggregate), "n": "BIGINT"}  # type: ignore[assignment]
        elif m is Maintenance.BOOL_COUNTS:
            fields[aggregate.field] = {"t": "BIGINT", "f": "BIGINT"}  # type: ignore[assignment]
        else:
            fields[aggregate.field] = _EXTREME_TYPES[aggregate.arg_types[0]]
    return json.dumps(fields)


def _sum_type(aggregate: Aggregate) -> str:
    return "BIGINT" if integer_sum(aggregate) else "DOUBLE"


def _reduce_sql(plan: ViewPlan) -> str:
    """One statement: reduce each group's partial with its loaded state (merged: the sum / minimize / maximize of
    the reduce schema), then finalize (ViewPlan.finalize: aggregate values, pruned state)."""
    def old(*path: str) -> str:
        expression = "l.st"
        for step in path:
            expression = f"struct_extract({expression}, '{step}')"
        return expression

    reduced = [f"p.{_q(KEY_FIELD)}", *(f"p.{_q(f'k{i}')}" for i in range(len(plan.group_keys))),
               f"l.{_q(KEY_FIELD)} IS NOT NULL AS hr_exists",
               f"coalesce({old(ROWS_FIELD)}, 0) + p.{_q(ROWS_FIELD)} AS hr_rows"]
    finals = [_q(KEY_FIELD), *(_q(f"k{i}") for i in range(len(plan.group_keys))), "hr_exists", "hr_rows"]
    state = [f"'{ROWS_FIELD}', hr_rows"]
    for aggregate in plan.aggregates:
        name, m = aggregate.field, aggregate.maintenance
        if m is Maintenance.COUNT:
            reduced.append(f"coalesce({old(name)}, 0) + p.{_q(name + '_n')} AS {name}_n")
            finals.append(f"{name}_n AS {_q(name)}")
            state.append(f"'{name}', {name}_n")
        elif m in (Maintenance.SUM, Maintenance.BOOL_COUNTS):
            first, second = ("s", "n") if m is Maintenance.SUM else ("t", "f")
            for part in (first, second):
                reduced.append(f"coalesce({old(name, part)}, 0) + p.{_q(f'{name}_{part}')} AS {name}_{part}")
            count = f"{name}_n" if m is Maintenance.SUM else f"({name}_t + {name}_f)"
            if m is Maintenance.SUM:
                value = f"{name}_s" if aggregate.function == "sum" else f"{name}_s / {name}_n"
            else:
                value = f"{name}_f = 0" if aggregate.function == "bool_and" else f"{name}_t > 0"
            finals.append(f"CASE WHEN {count} <= 0 THEN NULL ELSE {value} END AS {_q(name)}")
            if aggregate.output_type == "numeric":  # the value is made exact by _numeric_values
                finals.extend((f"{name}_s AS {_q('hr_s_' + name)}", f"{name}_n AS {_q('hr_n_' + name)}"))
            zero = "0.0" if _sum_type(aggregate) == "DOUBLE" and m is Maintenance.SUM else "0"
            state.append(f"'{name}', CASE WHEN {count} <= 0 THEN json_object('{first}', {zero}, '{second}', 0) "
                         f"ELSE json_object('{first}', {name}_{first}, '{second}', {name}_{second}) END")
        else:  # EXTREME: minimize / maximize, NULL on either side keeps the other
            pick = "least" if aggregate.function == "min" else "greatest"
            before, now = old(name), f"p.{_q(name + '_v')}"
            reduced.append(f"CASE WHEN {before} IS NULL THEN {now} WHEN {now} IS NULL THEN {before} "
                           f"ELSE {pick}({before}, {now}) END AS {name}_v")
            finals.append(f"{name}_v AS {_q(name)}")
            state.append(f"'{name}', {name}_v")
    # json_merge_patch onto {} drops NULL members: an extreme without a value is absent, as in the document path.
    finals.append(f"CAST(json_merge_patch('{{}}', json_object({', '.join(state)})) AS VARCHAR) AS {_q(STATE_FIELD)}")
    return (f"WITH l AS (SELECT {_q(KEY_FIELD)}, from_json({_q(STATE_FIELD)}, '{_state_type(plan)}') AS st "
            f"FROM hr_loaded), "
            f"m AS (SELECT {', '.join(reduced)} FROM hr_partials AS p LEFT JOIN l ON p.{_q(KEY_FIELD)} = l.{_q(KEY_FIELD)}) "
            f"SELECT {', '.join(finals)} FROM m")
