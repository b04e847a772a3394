"""Properties of every strategy: associativity (partial and into a base document), identities, sum exactness.

Associativity is what the runtime relies on: it combines a transaction's documents (partial reductions) and
then reduces the result into the loaded document (a full reduction), which must equal reducing each document
into the loaded one in turn.
"""

from __future__ import annotations

from decimal import Context, Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.materialize.reduce import ReductionError, reducer_for, reducer_for_schema
from headrace.materialize.reduce.numbers import I64_MIN, U64_MAX
from headrace.materialize.reduce.schema import SchemaReducer
from headrace.materialize.reduce.values import MISSING, canonical, compare

settings.register_profile("reduce", max_examples=100, deadline=None)
settings.load_profile("reduce")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.floats(-1e6, 1e6, allow_nan=False),
                    st.text(max_size=4))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=2), inner, max_size=3)), max_leaves=8)
small_ints = st.integers(-10**6, 10**6)
names = st.sampled_from(["a", "b", "c", "d"])

SUM = {"reduce": {"strategy": "sum"}}
COUNTS = {"type": "object", "reduce": {"strategy": "merge"}, "additionalProperties": SUM}

# name -> (schema, generator of documents for it)
SCHEMAS: dict[str, tuple[Any, st.SearchStrategy[Any]]] = {
    "append": ({"reduce": {"strategy": "append"}}, st.lists(scalars, max_size=3)),
    "firstWriteWins": ({"reduce": {"strategy": "firstWriteWins"}}, json_values),
    "lastWriteWins": ({"reduce": {"strategy": "lastWriteWins"}}, json_values),
    "minimize": ({"reduce": {"strategy": "minimize"}}, json_values),
    "maximize": ({"reduce": {"strategy": "maximize"}}, json_values),
    "minimize_key_deep_merge": (
        {"reduce": {"strategy": "minimize", "key": ["/k"]}, "properties": {"n": SUM}},
        st.fixed_dictionaries({"k": st.integers(0, 3), "n": small_ints}, optional={"x": scalars})),
    "maximize_key_deep_merge": (
        {"reduce": {"strategy": "maximize", "key": ["/0"]}, "items": [{}, SUM]},
        st.tuples(st.integers(0, 3), small_ints).map(list)),
    "sum_int": (SUM, st.integers(-(2**40), 2**40)),
    "sum_decimal_strings": (SUM, st.decimals(allow_nan=False, allow_infinity=False, places=4,
                                             min_value=-10**30, max_value=10**30).map(str)),
    "sum_ints_and_strings": (SUM, st.one_of(small_ints, small_ints.map(str))),
    "merge_objects_nested": (
        {"reduce": {"strategy": "merge"}, "additionalProperties": COUNTS},
        st.dictionaries(names, st.dictionaries(names, small_ints, max_size=3), max_size=3)),
    "merge_arrays_by_index": (
        {"reduce": {"strategy": "merge"}, "items": SUM}, st.lists(small_ints, max_size=4)),
    "merge_arrays_by_key": (
        {"reduce": {"strategy": "merge", "key": ["/k"]},
         "items": {"reduce": {"strategy": "merge"}, "properties": {"n": SUM}}},
        st.dictionaries(st.integers(0, 6), small_ints, max_size=4).map(
            lambda d: [{"k": k, "n": n} for k, n in sorted(d.items())])),
    "set_object": (
        {"reduce": {"strategy": "set"}, "additionalProperties": {"additionalProperties": SUM}},
        st.one_of(
            st.fixed_dictionaries({}, optional={"add": st.dictionaries(names, small_ints, max_size=3),
                                                "remove": st.dictionaries(names, st.just(0), max_size=3)}),
            st.fixed_dictionaries({"intersect": st.dictionaries(names, st.just(0), max_size=3)},
                                  optional={"add": st.dictionaries(names, small_ints, max_size=3)}))),
    "set_array": (
        {"reduce": {"strategy": "set", "key": ["/0"]},
         "additionalProperties": {"items": {"reduce": {"strategy": "merge"}, "items": [{}, SUM]}}},
        st.fixed_dictionaries({}, optional={
            "add": st.dictionaries(names, small_ints, max_size=3).map(lambda d: [[k, v] for k, v in sorted(d.items())]),
            "remove": st.sets(names, max_size=3).map(lambda s: [[k] for k in sorted(s)])})),
    "view_aggregates": (
        {"type": "object", "reduce": {"strategy": "merge"},
         "properties": {"count": SUM, "total": SUM, "lo": {"reduce": {"strategy": "minimize"}},
                        "hi": {"reduce": {"strategy": "maximize"}}, "last": {"reduce": {"strategy": "lastWriteWins"}},
                        "values": COUNTS}},
        st.fixed_dictionaries({"count": st.sampled_from([1, -1]), "total": small_ints, "lo": small_ints,
                               "hi": small_ints, "last": scalars,
                               "values": st.dictionaries(st.integers(0, 5).map(str), st.sampled_from([1, -1]),
                                                         min_size=1, max_size=1)})),
}
REDUCERS: dict[str, SchemaReducer] = {name: reducer_for_schema(schema) for name, (schema, _) in SCHEMAS.items()}


def _try(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", canonical(fn(*args)))
    except ReductionError as error:
        return ("err", error.reason)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_partial_reduction_is_associative(name: str) -> None:
    reducer = REDUCERS[name]

    @given(SCHEMAS[name][1], SCHEMAS[name][1], SCHEMAS[name][1])
    def check(a: Any, b: Any, c: Any) -> None:
        # .reduce: documents here may be any JSON value, None included (it is JSON null, not "no document")
        left = _try(lambda: reducer.reduce(reducer.reduce(a, b), c))
        right = _try(lambda: reducer.reduce(a, reducer.reduce(b, c)))
        assert left == right
    check()


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_combining_first_then_reducing_into_the_base_equals_reducing_one_by_one(name: str) -> None:
    reducer = REDUCERS[name]

    @given(SCHEMAS[name][1], SCHEMAS[name][1], SCHEMAS[name][1], st.booleans())
    def check(base: Any, b: Any, c: Any, base_exists: bool) -> None:
        stored = base if base_exists else MISSING
        one_by_one = _try(lambda: reducer.reduce(reducer.reduce(stored, b, full=True), c, full=True))
        combined = _try(lambda: reducer.reduce(stored, reducer.reduce(b, c), full=True))
        assert one_by_one == combined
    check()


@given(json_values, json_values)
def test_last_write_wins_takes_the_newer_and_first_write_wins_the_older(a: Any, b: Any) -> None:
    assert reducer_for("lastWriteWins")(a, b) is b
    first = reducer_for_schema({"reduce": {"strategy": "firstWriteWins"}})
    assert first.reduce(a, b) is a  # .reduce: None is JSON null, not "no document"
    assert first(None, b) is b
    nested = reducer_for_schema({"reduce": {"strategy": "merge"},
                                 "properties": {"f": {"reduce": {"strategy": "firstWriteWins"}}}})
    assert nested({"f": a}, {"f": b}) == {"f": a}
    assert reducer_for_schema({"reduce": {"strategy": "merge"}})({"f": a}, {"f": b}) == {"f": b}


@given(st.lists(st.integers(I64_MIN, U64_MAX), min_size=1, max_size=6))
def test_integer_sums_are_exact_or_report_overflow(values: list[int]) -> None:
    reducer = reducer_for("sum")
    total, overflowed = values[0], False
    for v in values[1:]:
        total += v
        overflowed = overflowed or not I64_MIN <= total <= U64_MAX
    try:
        result: Any = values[0]
        for v in values[1:]:
            result = reducer(result, v)
    except ReductionError as error:
        assert overflowed and error.reason == "`sum` resulted in numeric overflow"
        return
    assert not overflowed and type(result) is int and result == total


@given(st.integers(0, U64_MAX), st.integers(I64_MIN, -1))
def test_mixed_sign_integer_sums_never_overflow(positive: int, negative: int) -> None:
    assert reducer_for("sum")(positive, negative) == positive + negative
    assert reducer_for("sum")(negative, positive) == positive + negative


@given(st.lists(st.decimals(allow_nan=False, allow_infinity=False, places=6), min_size=2, max_size=5))
def test_string_encoded_sums_are_exact(values: list[Decimal]) -> None:
    reducer = reducer_for("sum")
    result: Any = str(values[0])
    for v in values[1:]:
        result = reducer(result, str(v))
    exact = Context(prec=200)  # Python's default context rounds to 28 digits
    expected = Decimal(0)
    for v in values:
        expected = exact.add(expected, v)
    assert isinstance(result, str) and Decimal(result) == expected


@given(st.integers(-(2**53), 2**53), st.floats(-1e12, 1e12, allow_nan=False))
def test_integer_plus_float_is_a_float(i: int, f: float) -> None:
    result = reducer_for("sum")(i, f)
    assert type(result) is float and result == float(i) + f


@given(json_values, json_values)
def test_minimize_and_maximize_follow_flows_total_order(a: Any, b: Any) -> None:
    low = reducer_for_schema({"reduce": {"strategy": "minimize"}}).reduce(a, b)
    high = reducer_for_schema({"reduce": {"strategy": "maximize"}}).reduce(a, b)
    assert compare(low, high) <= 0
    assert low is (a if compare(a, b) < 0 else b)  # ties take the newer value
    assert high is (a if compare(a, b) > 0 else b)


@given(json_values, json_values, json_values)
def test_flows_order_is_a_total_order(a: Any, b: Any, c: Any) -> None:
    assert compare(a, b) == -compare(b, a)
    assert compare(a, a) == 0
    if compare(a, b) <= 0 and compare(b, c) <= 0:
        assert compare(a, c) <= 0
