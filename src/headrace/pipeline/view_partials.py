"""Partial documents of an aggregating view without a Spark shuffle: Spark projects, Arrow groups.

Spark still parses the JSON, evaluates WHERE, the group keys, every aggregate's argument and FILTER, and
turns each change into its *contribution* columns (diff where the aggregate counts it, diff * x for a sum,
the value for a min/max); the projection is collected as Arrow and grouped by `pyarrow`'s hash aggregation
(sum / min / max) on the pipeline driver. Used when every aggregate's state is such a sum or extreme
(COUNT, SUM, BOOL_COUNTS, EXTREME: count, sum, avg, bool_and/or, and min/max over append-only input);
list-shaped states (value counts, keyed sets, first/last) keep Spark's groupBy (pipeline/views.py).

Why not Spark's groupBy here: on local[2] with 100k changes, 10k groups and 6 aggregates, groupBy (partial
aggregate, shuffle, final aggregate, collect) cost 1.9-2.4 CPU-s per batch; the projection collected plus
pyarrow's group_by 0.6-0.8 CPU-s; a per-partition pyarrow aggregation inside Spark (mapInArrow, partials
combined afterwards) 1.1-1.5 CPU-s, because each batch's rows then cross to a Python worker and back. The
batch is collected to the driver anyway (the source's own rows), so grouping there adds no data movement.
On a cluster, the same contribution columns would be grouped per partition by mapInArrow instead."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from headrace.sql.view_aggregates import KEEPS_NULLS, Aggregate, Maintenance, integer_sum
from headrace.sql.views import ROWS_FIELD, ViewPlan

ARROW_GROUPED = frozenset({Maintenance.COUNT, Maintenance.SUM, Maintenance.BOOL_COUNTS, Maintenance.EXTREME})


def arrow_groupable(plan: ViewPlan) -> bool:
    return plan.aggregating and all(a.maintenance in ARROW_GROUPED for a in plan.aggregates)


def aggregate_inputs(aggregate: Aggregate, translate: Any) -> tuple[list[Column], Column]:
    """An aggregate's argument columns and the condition under which a change counts (its FILTER, and a non-NULL
    first argument unless the function keeps NULLs)."""
    args = [translate(a) for a in aggregate.args]
    condition: Column = F.lit(True)
    if aggregate.filter is not None:
        condition = F.coalesce(translate(aggregate.filter), F.lit(False))
    if args and aggregate.function not in KEEPS_NULLS:
        condition = condition & args[0].isNotNull()
    return args, condition


def contributions(aggregate: Aggregate, translate: Any) -> list[tuple[Column, str, str]]:
    """(contribution column, output name, aggregation: sum / min / max) per partial-state field of a count, sum,
    bool or extreme aggregate: pyarrow aggregates them here, Spark's groupBy in pipeline/views.py, so both paths
    compute the same states."""
    from headrace.pipeline.views import doc_value

    name, m = aggregate.field, aggregate.maintenance
    args, condition = aggregate_inputs(aggregate, translate)
    diff = F.col("hr_diff")
    counted = (F.when(condition, diff).otherwise(0), f"{name}_n", "sum")
    if m is Maintenance.COUNT:
        return [counted]
    if m is Maintenance.SUM:
        # Integers' sums stay exact: int8's as decimal(38,0), as PostgreSQL's sum(int8) is numeric and never overflows.
        number = args[0].cast(("decimal(38,0)" if aggregate.arg_types[0] == "int8" else "bigint")
                              if integer_sum(aggregate) else "double")
        return [(F.when(condition, diff * number), f"{name}_s", "sum"), counted]
    if m is Maintenance.BOOL_COUNTS:
        return [(F.when(condition & args[0], diff).otherwise(0), f"{name}_t", "sum"),
                (F.when(condition & ~args[0], diff).otherwise(0), f"{name}_f", "sum")]
    assert m is Maintenance.EXTREME
    value = doc_value(args[0], aggregate.arg_types[0])
    return [(F.when(condition, value), f"{name}_v", "min" if aggregate.function == "min" else "max")]


class GroupedProjection:
    """One arrow-groupable view's projection columns (prefixed, so several views share one Spark select) and its
    partial documents from their collected Arrow form. A WHERE becomes a `keep` column instead of a Spark filter,
    and every other column is evaluated only where it holds (CASE WHEN evaluates the taken branch only, so a cast
    that would fail on a filtered-out row is never evaluated, as with a filter first)."""

    def __init__(self, plan: ViewPlan, translate: Any, prefix: str = "") -> None:
        from headrace.pipeline.views import doc_value

        self.plan, self.prefix = plan, prefix
        self.keep = F.coalesce(translate(plan.filter), F.lit(False)) if plan.filter is not None else None
        self.keys = [doc_value(translate(key), t) for key, t in zip(plan.group_keys, plan.group_key_types)]
        self.contributions = [c for aggregate in plan.aggregates for c in contributions(aggregate, translate)]

    def columns(self) -> list[Column]:
        guarded = (lambda column: F.when(self.keep, column)) if self.keep is not None else (lambda column: column)
        p = self.prefix
        columns = [guarded(key).alias(f"{p}k{i}") for i, key in enumerate(self.keys)]
        columns.append(guarded(F.col("hr_diff").cast("bigint")).alias(f"{p}{ROWS_FIELD}"))
        columns += [guarded(column).alias(f"{p}c{i}") for i, (column, _, _) in enumerate(self.contributions)]
        if self.keep is not None:
            columns.append(self.keep.alias(f"{p}keep"))
        return columns

    def documents(self, table: pa.Table) -> list[tuple[list[Any], dict[str, Any]]]:
        """Partial documents of the projected changes `table` (this view's prefixed columns, maybe among others)."""
        from headrace.pipeline.views import partial_document

        grouped = self.grouped(table)
        if grouped is None:
            return []
        return [partial_document(self.plan, row) for row in grouped.to_pylist()]

    def grouped(self, table: pa.Table) -> pa.Table | None:
        """The projected changes grouped: k*, rows and each contribution under its partial-state name (a0_n, a1_s,
        ...), one row per group; None if no change passes the WHERE."""
        p = self.prefix
        if self.keep is not None:
            table = table.filter(table[f"{p}keep"])
        names = [f"k{i}" for i in range(len(self.keys))] + [ROWS_FIELD] + \
            [f"c{i}" for i in range(len(self.contributions))]
        table = table.select([f"{p}{name}" for name in names]).rename_columns(names)
        if table.num_rows == 0:
            return None
        key_names = [f"k{i}" for i in range(len(self.keys))]
        aggregations = [(ROWS_FIELD, "sum", pa.compute.ScalarAggregateOptions(min_count=0))]
        aggregations += [(f"c{i}", function, pa.compute.ScalarAggregateOptions(min_count=0 if function == "sum" else 1))
                         for i, (_, _, function) in enumerate(self.contributions)]
        grouped = table.group_by(key_names, use_threads=False).aggregate(aggregations)
        renamed = {f"{ROWS_FIELD}_sum": ROWS_FIELD}
        renamed.update({f"c{i}_{function}": name for i, (_, name, function) in enumerate(self.contributions)})
        return grouped.rename_columns([renamed.get(n, n) for n in grouped.column_names])


def arrow_aggregate_documents(plan: ViewPlan, frame: DataFrame, translate: Any) -> list[tuple[list[Any], dict[str, Any]]]:
    """One partial document per group of the (prepared, not yet filtered) changes `frame`."""
    projection = GroupedProjection(plan, translate)
    return projection.documents(frame.select(*projection.columns()).toArrow())
