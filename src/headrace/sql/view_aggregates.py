"""Aggregates of materialized views: the state each keeps, its Flow reduction, and how it is read back.

A view's input is a change stream: each change is one input row with a weight (`diff`: +1 inserted,
-1 retracted). Per group and transaction the pipeline folds the changes into a PARTIAL state; the
runtime reduces partial states with the stored one by the reduction annotations of `state_schema`
(associative, so partials of many transactions combine in any grouping); `finalize` then reads the
aggregate's value from the fully reduced state and prunes what is no longer needed.

Retractions stay correct because every state is a function of the live multiset of rows, never of
the order they were removed in: counts and sums subtract, value sets count each distinct value, and
order-dependent aggregates (first/last/array_agg/jsonb merges) keep each live row by its row id.
When the input never retracts (append-only), the cheaper order-based strategies are exact.

Values are JSON-able: timestamptz as integer microseconds, jsonb as parsed JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlglot import exp

from headrace.sql import view_numeric


class Maintenance(Enum):
    """How an aggregate's state is kept; see docs/views.md for each one's retraction argument."""

    COUNT = "count"  # n: sum of diff over non-null inputs
    SUM = "sum"  # {s: sum of diff*x, n: sum of diff over non-null x}: sum and avg
    BOOL_COUNTS = "bool_counts"  # {t, f}: sums of diff over true and false inputs
    EXTREME = "extreme"  # append-only min/max: the value itself, minimize/maximize
    VALUE_COUNTS = "value_counts"  # {add: {json(value): count}}: Flow set whose members sum
    FIRST_WRITE = "first_write"  # append-only first(): {v}, firstWriteWins
    LAST_WRITE = "last_write"  # append-only last(): {v}, lastWriteWins
    APPEND = "append"  # append-only array_agg: [values], append
    MERGE = "merge"  # append-only jsonb merges: {...}, merge (top-level keys, last wins)
    KEYED_SET = "keyed_set"  # retracting order-dependent aggregates: {add: {row: [at, v]}, remove: {row: true}}


FUNCTIONS = ("count_star", "count", "count_distinct", "sum", "avg", "min", "max", "bool_and", "bool_or",
             "first", "last", "array_agg", "array_agg_distinct", "set_agg", "jsonb_merge_agg", "jsonb_object_agg")
# Aggregates whose input rows count even when their (first) argument is NULL, as in PostgreSQL
# (array_agg(DISTINCT x) keeps one NULL, sorted last; set_agg skips them).
KEEPS_NULLS = frozenset({"count_star", "first", "last", "array_agg", "array_agg_distinct"})


@dataclass(frozen=True)
class Aggregate:
    """One aggregate call of a view, after deduplication (equal calls share one state)."""

    index: int  # its state lives at hr_state.a{index}, its value in column a{index}
    function: str  # one of FUNCTIONS
    args: tuple[exp.Expr, ...]  # input expressions over the input relation's columns
    arg_types: tuple[str, ...]  # PostgreSQL type names of args
    filter: exp.Expr | None  # FILTER (WHERE ...)
    output_type: str  # PostgreSQL type name of the result
    maintenance: Maintenance
    arg_scale: int | None = None  # a numeric argument's display scale when the expression fixes it (view_numeric)

    @property
    def field(self) -> str:
        return f"a{self.index}"


EXACT_SUM_TYPES = frozenset({"float4", "float8", "numeric"})
INTEGER_TYPES = ("int2", "int4", "int8")


def choose_maintenance(function: str, append_only: bool, arg_type: str | None = None) -> Maintenance:
    if function in ("count_star", "count"):
        return Maintenance.COUNT
    if function in ("sum", "avg") and (arg_type == "numeric" or arg_type in EXACT_SUM_TYPES and not append_only):
        # A float running sum cannot subtract a value exactly: after 1e15 left a group its sum was off by 0.02
        # (issue 22). The live values' counts are kept instead, and the sum is computed exactly from them. A numeric
        # sum is exact and keeps its inputs' display scale, so it is computed from the values even when append-only.
        return Maintenance.VALUE_COUNTS
    if function in ("sum", "avg"):
        return Maintenance.SUM
    if function in ("bool_and", "bool_or"):
        return Maintenance.BOOL_COUNTS
    if function in ("min", "max"):
        return Maintenance.EXTREME if append_only else Maintenance.VALUE_COUNTS
    if function in ("count_distinct", "set_agg", "array_agg_distinct"):
        return Maintenance.VALUE_COUNTS
    if not append_only:
        return Maintenance.KEYED_SET
    return {"first": Maintenance.FIRST_WRITE, "last": Maintenance.LAST_WRITE, "array_agg": Maintenance.APPEND,
            "jsonb_merge_agg": Maintenance.MERGE, "jsonb_object_agg": Maintenance.MERGE}[function]


def output_type(function: str, arg_types: tuple[str, ...]) -> str:
    if function in ("count_star", "count", "count_distinct"):
        return "int8"
    if function == "sum":  # as PostgreSQL: sum(int2/int4) int8, sum(int8) and sum(numeric) numeric
        return {"int2": "int8", "int4": "int8", "int8": "numeric", "numeric": "numeric", "float4": "float4"}.get(
            arg_types[0], "float8")
    if function == "avg":  # avg of integers and numerics is numeric (sum / count as numeric division)
        return "numeric" if arg_types[0] in (*INTEGER_TYPES, "numeric") else "float8"
    if function in ("bool_and", "bool_or"):
        return "bool"
    if function in ("array_agg", "array_agg_distinct", "set_agg"):
        return f"{arg_types[0]}[]"
    if function in ("jsonb_merge_agg", "jsonb_object_agg"):
        return "jsonb"
    return arg_types[0]  # min, max, first, last


def integer_sum(aggregate: Aggregate) -> bool:
    """A sum / avg of integers keeps an exact integer running sum (`s`)."""
    return aggregate.maintenance is Maintenance.SUM and aggregate.arg_types[0] in INTEGER_TYPES


# ---------------------------------------------------------------------------------------------- schema

def _sum(type_name: str = "integer") -> dict[str, Any]:
    return {"type": type_name, "reduce": {"strategy": "sum"}}


def _set_of(member: dict[str, Any]) -> dict[str, Any]:
    """Flow's object-form set: add/remove maps keyed by member; overlapping members reduce by `member`."""
    return {"type": "object", "reduce": {"strategy": "set"},
            "additionalProperties": {"type": "object", "reduce": {"strategy": "merge"},
                                     "additionalProperties": member}}


def state_schema(aggregate: Aggregate) -> dict[str, Any]:
    """The JSON schema (with Flow `reduce` annotations) of hr_state.a{index}."""
    m = aggregate.maintenance
    if m is Maintenance.COUNT:
        return _sum()
    if m is Maintenance.SUM:
        number = "integer" if integer_sum(aggregate) else "number"
        return {"type": "object", "reduce": {"strategy": "merge"},
                "properties": {"s": _sum(number), "n": _sum()}}
    if m is Maintenance.BOOL_COUNTS:
        return {"type": "object", "reduce": {"strategy": "merge"}, "properties": {"t": _sum(), "f": _sum()}}
    if m is Maintenance.EXTREME:
        return {"reduce": {"strategy": "minimize" if aggregate.function == "min" else "maximize"}}
    if m is Maintenance.VALUE_COUNTS:
        return _set_of(_sum())
    if m is Maintenance.FIRST_WRITE:
        return {"type": "object", "reduce": {"strategy": "firstWriteWins"}}
    if m is Maintenance.LAST_WRITE:
        return {"type": "object", "reduce": {"strategy": "lastWriteWins"}}
    if m is Maintenance.APPEND:
        return {"type": "array", "reduce": {"strategy": "append"}}
    if m is Maintenance.MERGE:
        return {"type": "object", "reduce": {"strategy": "merge"}}
    return _set_of({"type": "array", "reduce": {"strategy": "lastWriteWins"}})  # KEYED_SET


# ---------------------------------------------------------------------------------------------- folding

@dataclass(frozen=True, slots=True)
class Change:
    """One input change as an aggregate sees it: its arguments already evaluated, FILTER applied."""

    seq: int  # position of the change in the input's change stream (arrival order of changes)
    diff: int  # +1 insert, -1 retraction
    row: str  # the input row's identity (canonical JSON of its key)
    at: int  # arrival of this row version (orders first/last/array_agg)
    args: tuple[Any, ...]


def value_key(value: Any) -> str:
    """The member name of a value in a value-count set: canonical JSON."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def fold(aggregate: Aggregate, changes: Iterable[Change]) -> Any:
    """The partial state of one group's changes within one transaction, or None when there is nothing
    to record (no change passed the aggregate's FILTER and null rules)."""
    m = aggregate.maintenance
    ordered = sorted(changes, key=lambda c: (c.seq, c.diff))  # a replacement's -1 before its +1
    if aggregate.function not in KEEPS_NULLS:
        ordered = [c for c in ordered if c.args[0] is not None]
    if m is Maintenance.COUNT:
        return sum(c.diff for c in ordered)
    if m is Maintenance.SUM:
        total = sum(c.diff * c.args[0] for c in ordered)
        if aggregate.arg_types[0] == "int8":  # exact beyond 64 bits: decimal text, as the pipeline sends it
            total = str(total)
        return {"s": total, "n": sum(c.diff for c in ordered)}
    if m is Maintenance.BOOL_COUNTS:
        return {"t": sum(c.diff for c in ordered if c.args[0]), "f": sum(c.diff for c in ordered if not c.args[0])}
    if m is Maintenance.EXTREME:
        values = [c.args[0] for c in ordered]
        if not values:
            return None
        return min(values) if aggregate.function == "min" else max(values)
    if m is Maintenance.VALUE_COUNTS:
        counts: dict[str, int] = {}
        for c in ordered:
            member = value_key(c.args[0])
            counts[member] = counts.get(member, 0) + c.diff
        return {"add": counts} if counts else None
    if m is Maintenance.FIRST_WRITE:
        return {"v": row_value(aggregate, ordered[0])} if ordered else None
    if m is Maintenance.LAST_WRITE:
        return {"v": row_value(aggregate, ordered[-1])} if ordered else None
    if m is Maintenance.APPEND:
        return [row_value(aggregate, c) for c in sorted(ordered, key=lambda c: c.at)] or None
    if m is Maintenance.MERGE:
        merged: dict[str, Any] = {}
        for c in sorted(ordered, key=lambda c: c.at):
            value = row_value(aggregate, c)
            if isinstance(value, dict):
                merged.update(value)
        return merged if ordered else None
    # KEYED_SET: replay the changes in order; a remove then an add of one row means "replace it".
    add: dict[str, list[Any]] = {}
    remove: dict[str, bool] = {}
    for c in ordered:
        if c.diff > 0:
            add[c.row] = [c.at, row_value(aggregate, c)]
        else:
            add.pop(c.row, None)
            remove[c.row] = True
    if not add and not remove:
        return None
    state: dict[str, Any] = {}
    if add:
        state["add"] = add
    if remove:
        state["remove"] = remove
    return state


def row_value(aggregate: Aggregate, change: Change) -> Any:
    """What one input row contributes to an order-dependent aggregate."""
    if aggregate.function == "jsonb_object_agg":
        return {str(change.args[0]): change.args[1]}
    return change.args[0]


# ---------------------------------------------------------------------------------------------- finalize

def finalize(aggregate: Aggregate, state: Any) -> tuple[Any, Any]:
    """(the aggregate's value, the state to keep) from a fully reduced state (None: no state yet). A numeric value is
    PostgreSQL's numeric text."""
    value, kept = _finalize(aggregate, state)
    if aggregate.output_type == "numeric" and value is not None and not isinstance(value, str):
        value = view_numeric.to_text(value, aggregate.arg_scale)
    elif aggregate.output_type == "numeric[]" and value is not None:
        # each element as PostgreSQL's numeric text at the argument's display scale (not the double the pipeline
        # carries: `-3.00`, not `-3.0`); a new list, as an append-only state is the value itself
        value = [element if element is None or isinstance(element, str)
                 else view_numeric.to_text(element, aggregate.arg_scale) for element in value]
    return value, kept


def _finalize(aggregate: Aggregate, state: Any) -> tuple[Any, Any]:
    m = aggregate.maintenance
    f = aggregate.function
    if m is Maintenance.COUNT:
        return state or 0, state or 0
    if m is Maintenance.SUM:
        s, n = (state or {}).get("s", 0), (state or {}).get("n", 0)
        if n <= 0:
            return None, {"s": 0, "n": 0}  # no non-null input left: reset float residue
        if f == "avg" and aggregate.output_type == "numeric":
            return integer_avg(s, n), state
        return (s if f == "sum" else s / n), state
    if m is Maintenance.BOOL_COUNTS:
        t, fa = (state or {}).get("t", 0), (state or {}).get("f", 0)
        if t + fa <= 0:
            return None, {"t": 0, "f": 0}
        return (fa == 0 if f == "bool_and" else t > 0), state
    if m is Maintenance.EXTREME:
        return state, state
    if m is Maintenance.VALUE_COUNTS:
        live = {member: count for member, count in ((state or {}).get("add") or {}).items() if count > 0}
        kept = {"add": live} if live else None
        values = [json.loads(member) for member in live]
        if f == "count_distinct":
            return len(values), kept
        if f in ("sum", "avg") and aggregate.arg_types[0] == "numeric":
            return numeric_sum(live, f, aggregate.arg_scale), kept
        if f in ("sum", "avg"):
            return exact_sum(live, f), kept
        if not values:
            return None, kept
        if f == "min":
            return min(values), kept
        if f == "max":
            return max(values), kept
        return sorted(values, key=_sort_key), kept  # set_agg, array_agg(DISTINCT x)
    if m in (Maintenance.FIRST_WRITE, Maintenance.LAST_WRITE):
        return (state or {}).get("v"), state
    if m is Maintenance.APPEND:
        return state, state
    if m is Maintenance.MERGE:
        return state, state
    # KEYED_SET: the live rows in arrival order; removals are applied, so they need not be kept.
    members = (state or {}).get("add") or {}
    kept = {"add": members} if members else None
    entries = sorted(members.values(), key=lambda entry: entry[0])
    values = [entry[1] for entry in entries]
    if f == "first":
        return (values[0] if values else None), kept
    if f == "last":
        return (values[-1] if values else None), kept
    if f == "array_agg":
        return (values or None), kept
    merged: dict[str, Any] = {}
    for value in values:
        if isinstance(value, dict):
            merged.update(value)
    return (merged if values else None), kept


def exact_sum(counts: dict[str, int], function: str) -> float | None:
    """sum / avg of a value-count set, computed exactly and rounded once (PostgreSQL adds floats in scan order, so
    its last bit may differ; no retraction history can make this one drift)."""
    pairs = [(float(json.loads(member)), count) for member, count in counts.items() if count > 0]
    n = sum(count for _, count in pairs)
    if n == 0:
        return None
    if not all(math.isfinite(value) for value, _ in pairs):
        total = sum(value * count for value, count in pairs)  # inf/NaN propagate as in PostgreSQL
        return total if function == "sum" else total / n
    exact = sum((Fraction(value) * count for value, count in pairs), Fraction(0))
    return float(exact if function == "sum" else exact / n)


def integer_avg(total: int | float | str, count: int) -> str:
    """avg of integers as PostgreSQL computes it: the exact sum (an int8 sum's is decimal text) divided as numeric by
    the count."""
    exact = total if isinstance(total, int) else int(Decimal(total if isinstance(total, str) else repr(total)))
    return view_numeric.integer_div_text(exact, count)


def numeric_sum(counts: dict[str, int], function: str, scale: int | None) -> str | None:
    """sum / avg of a numeric value-count set: exact, at the inputs' largest display scale (`scale` when the argument
    fixes it), avg divided as PostgreSQL's numeric_div."""
    values = [(view_numeric.from_double(json.loads(member), scale), count)
              for member, count in counts.items() if count > 0]
    n = sum(count for _, count in values)
    if n == 0:
        return None
    display = scale if scale is not None else max(view_numeric.scale_of(value) for value, _ in values)
    total = sum((value * count for value, count in values), Decimal(0))
    if function == "sum":
        return view_numeric.text(view_numeric.round_half_up(total, display))
    return view_numeric.text(view_numeric.numeric_div(total, display, Decimal(n)))


def _sort_key(value: Any) -> tuple[int, Any]:
    """A total order over JSON values for set_agg's output (bool, number, string, other, null: PostgreSQL's
    DISTINCT sorts NULL last)."""
    if value is None:
        return (5, 0)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, (int, float)):
        return (2, value)
    if isinstance(value, str):
        return (3, value)
    return (4, value_key(value))
