"""reducer_for_schema: where annotations apply, errors (Flow's messages, with locations), compile-time checks,
and the document shapes the SQL views build on."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from headrace.errors import DataError, FeatureNotSupported, InvalidParameterValue
from headrace.materialize.reduce import (
    STRATEGIES,
    NotAssociativeError,
    ReductionError,
    reducer_for,
    reducer_for_schema,
)
from headrace.materialize.reduce.values import DELETE

SUM = {"reduce": {"strategy": "sum"}}


def merge_of(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "reduce": {"strategy": "merge"}, "properties": properties}


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(("schema", "older", "newer", "reason", "location"), [
    (merge_of(value=SUM), {"value": 1}, {"value": "x"}, "'sum' strategy expects numbers", "/value"),
    (merge_of(value=SUM), {"value": 1}, {"value": True}, "'sum' strategy expects numbers", "/value"),
    (merge_of(value=SUM), {"value": [1]}, {"value": 1}, "'sum' strategy expects numbers", "/value"),
    (merge_of(value=SUM), {}, {"value": None}, "'sum' strategy expects numbers", "/value"),
    (merge_of(value=SUM), {"value": 2**64 - 1}, {"value": 1}, "`sum` resulted in numeric overflow", "/value"),
    (merge_of(value=SUM), {"value": -(2**63)}, {"value": -1}, "`sum` resulted in numeric overflow", "/value"),
    (merge_of(value=SUM), {"value": 1e308}, {"value": 1e308}, "`sum` resulted in numeric overflow", "/value"),
    (merge_of(v={"reduce": {"strategy": "append"}}), {"v": [1]}, {"v": {"a": 1}}, "'append' strategy expects arrays",
     "/v"),
    (merge_of(v={"reduce": {"strategy": "append"}}), {"v": 1}, {"v": [1]}, "'append' strategy expects arrays", "/v"),
    (merge_of(v=merge_of()), {"v": {}}, {"v": 3}, "'merge' strategy expects objects or arrays", "/v"),
    (merge_of(v={"reduce": {"strategy": "set"}}), {"v": {"add": {}}}, {"v": {"add": []}},
     "'set' strategy expects objects having only 'add', 'remove', and 'intersect' properties with consistent "
     "object or array types", "/v"),
    (merge_of(v={"reduce": {"strategy": "set"}}), {"v": {}}, {"v": {"intersect": {}, "remove": {}}},
     "'set' strategy expects objects having only 'add', 'remove', and 'intersect' properties with consistent "
     "object or array types", "/v/remove"),
    (merge_of(v={"reduce": {"strategy": "set"}}), {"v": {}}, {"v": {"upsert": {}}},
     "'set' strategy expects objects having only 'add', 'remove', and 'intersect' properties with consistent "
     "object or array types", "/v/upsert"),
    ({"reduce": {"strategy": "merge"}, "items": merge_of(n=SUM)}, [{"n": 1}, {"n": 1}], [{}, {"n": "x"}],
     "'sum' strategy expects numbers", "/1/n"),
])
def test_wrong_types_fail_with_flows_message_and_the_location(schema: Any, older: Any, newer: Any, reason: str,
                                                               location: str) -> None:
    with pytest.raises(ReductionError) as info:
        reducer_for_schema(schema)(older, newer)
    error = info.value
    assert isinstance(error, DataError) and error.sqlstate == "22000"
    assert error.reason == reason and error.location == location
    assert error.message == f'while reducing "{location}": {reason}'
    assert error.detail is not None and error.detail.startswith("having values LHS: ")


def test_a_type_change_of_a_merged_location_is_not_associative_but_a_full_reduction_takes_it() -> None:
    reducer = reducer_for_schema(merge_of(v=merge_of()))
    with pytest.raises(NotAssociativeError, match="non-associative"):
        reducer({"v": "scalar"}, {"v": {"a": 1}})
    assert reducer.full({"v": "scalar"}, {"v": {"a": 1}}) == {"v": {"a": 1}}


@pytest.mark.parametrize(("schema", "error", "match"), [
    ({"reduce": {"strategy": "hyperLogLog"}}, FeatureNotSupported, "reduction strategy 'hyperLogLog' is not supported"),
    ({"reduce": {"strategy": "jsonSchemaMerge"}}, FeatureNotSupported, "'jsonSchemaMerge' is not supported"),
    ({"reduce": {"strategy": "sum", "key": ["/a"]}}, InvalidParameterValue, "unknown field"),
    ({"reduce": {"strategy": "merge", "key": ["a"]}}, InvalidParameterValue, "must be empty or start with '/'"),
    ({"reduce": "sum"}, InvalidParameterValue, "invalid reduce annotation"),
    ({"allOf": [SUM, {"reduce": {"strategy": "append"}}]}, InvalidParameterValue,
     "conflicting strategies at this location: append vs sum"),
    (merge_of(a={"allOf": [SUM, {"reduce": {"strategy": "minimize"}}]}), InvalidParameterValue, "conflicting"),
    ({"$ref": "#/$defs/missing"}, InvalidParameterValue, "cannot resolve \\$ref"),
])
def test_schemas_are_checked_when_compiled(schema: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        reducer_for_schema(schema)


def test_strategy_names_resolve_to_whole_document_reducers() -> None:
    assert sorted(STRATEGIES) == ["append", "firstWriteWins", "lastWriteWins", "maximize", "merge", "minimize",
                                  "set", "sum"]
    assert reducer_for("merge")({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(FeatureNotSupported):
        reducer_for("hyperLogLog")


# ------------------------------------------------------------------------------------------------ locations


def test_annotations_apply_through_pattern_additional_items_refs_and_allof() -> None:
    schema = {
        "$defs": {"counter": SUM, "latest": {"reduce": {"strategy": "maximize"}}},
        "reduce": {"strategy": "merge"},
        "properties": {"named": {"$ref": "#/$defs/latest"},
                       "tuple": {"reduce": {"strategy": "merge"}, "prefixItems": [{}, SUM],
                                 "items": {"reduce": {"strategy": "minimize"}}},
                       "both": {"allOf": [{"$ref": "#/$defs/counter"}, {"type": "integer"}]}},
        "patternProperties": {"^n_": {"$ref": "#/$defs/counter"}},
        "additionalProperties": {"reduce": {"strategy": "firstWriteWins"}},
    }
    reducer = reducer_for_schema(schema)
    older = {"named": 3, "tuple": ["a", 1, 9, 9], "both": 1, "n_x": 1, "other": "first"}
    newer = {"named": 2, "tuple": ["b", 2, 5], "both": 2, "n_x": 2, "other": "second"}
    assert reducer(older, newer) == {"named": 3, "tuple": ["b", 3, 5, 9], "both": 3, "n_x": 3, "other": "first"}


def test_draft7_items_array_and_additional_items() -> None:
    reducer = reducer_for_schema({"reduce": {"strategy": "merge"}, "items": [SUM], "additionalItems":
                                  {"reduce": {"strategy": "maximize"}}})
    assert reducer.reduce([1, 5, 1], [2, 3, 4]) == [3, 5, 4]


def test_un_annotated_locations_are_last_write_wins_even_under_a_merge() -> None:
    reducer = reducer_for_schema(merge_of(n=SUM))
    assert reducer({"n": 1, "s": {"deep": 1}}, {"n": 1, "s": {"other": 2}}) == {"n": 2, "s": {"other": 2}}


def test_a_schemas_own_annotation_overrides_its_refs() -> None:
    reducer = reducer_for_schema({"$defs": {"low": {"reduce": {"strategy": "minimize"}}},
                                  "$ref": "#/$defs/low", "reduce": {"strategy": "maximize"}})
    assert reducer.reduce(1, 2) == 2


def test_anyof_branches_apply_by_the_newer_value() -> None:
    reducer = reducer_for_schema(merge_of(v={"anyOf": [{"type": "integer", **SUM},
                                                       {"type": "string", "reduce": {"strategy": "firstWriteWins"}}]}))
    assert reducer({"v": 1}, {"v": 2}) == {"v": 3}
    assert reducer({"v": "a"}, {"v": "b"}) == {"v": "a"}


def test_recursive_schemas_reduce_at_any_depth() -> None:
    tree = {"$defs": {"node": {"reduce": {"strategy": "merge"}, "properties": {"n": SUM},
                               "additionalProperties": {"$ref": "#/$defs/node"}}}, "$ref": "#/$defs/node"}
    reducer = reducer_for_schema(tree)
    assert reducer({"n": 1, "a": {"n": 1, "b": {"n": 1}}}, {"n": 1, "a": {"b": {"n": 5}}}) == \
        {"n": 2, "a": {"n": 1, "b": {"n": 6}}}


def test_deletion_takes_effect_only_in_a_full_reduction() -> None:
    reducer = reducer_for_schema({"if": {"required": ["_deleted"]},
                                  "then": {"reduce": {"strategy": "lastWriteWins", "delete": True}},
                                  "else": merge_of(n=SUM)})
    assert reducer({"n": 1}, {"n": 2}) == {"n": 3}
    assert reducer({"n": 1}, {"_deleted": True}) == {"_deleted": True}
    assert reducer.full({"n": 1}, {"_deleted": True}) is None
    assert reducer.reduce({"n": 1}, {"_deleted": True}, full=True) is DELETE


def test_inputs_are_never_mutated() -> None:
    reducer = reducer_for_schema(merge_of(m={"reduce": {"strategy": "merge"}, "additionalProperties": SUM},
                                          a={"reduce": {"strategy": "append"}},
                                          s={"reduce": {"strategy": "set"}, "additionalProperties":
                                             {"additionalProperties": SUM}}))
    older = {"m": {"x": 1}, "a": [1], "s": {"add": {"k": 1}}}
    newer = {"m": {"x": 1, "y": 1}, "a": [2], "s": {"add": {"k": 1}, "remove": {"j": 0}}}
    before = copy.deepcopy((older, newer))
    result = reducer(older, newer)
    assert result == {"m": {"x": 2, "y": 1}, "a": [1, 2], "s": {"add": {"k": 2}, "remove": {"j": 0}}}
    assert (older, newer) == before


# ------------------------------------------------------------------------------------------------ views


VIEW_SCHEMA = {
    "type": "object", "reduce": {"strategy": "merge"},
    "properties": {
        "count": SUM, "total": SUM,
        "lo": {"reduce": {"strategy": "minimize"}}, "hi": {"reduce": {"strategy": "maximize"}},
        "last": {"reduce": {"strategy": "lastWriteWins"}},
        # min/max that survive retractions: a {value: count} map, summed per value
        "lo_counts": {"type": "object", "reduce": {"strategy": "merge"},
                      "additionalProperties": {"type": "integer", "reduce": {"strategy": "sum"}}},
    },
}


def _row_delta(value: int, sign: int) -> dict[str, Any]:
    return {"count": sign, "total": sign * value, "lo": value, "hi": value, "last": value,
            "lo_counts": {f"{value:020d}": sign}}


def test_view_aggregates_with_retractions_match_a_recomputation() -> None:
    reducer = reducer_for_schema(VIEW_SCHEMA)
    rows = [5, 3, 9, 3]
    deltas = [_row_delta(v, +1) for v in rows] + [_row_delta(3, -1), _row_delta(5, -1)]  # retract a 3 and the 5
    stored: Any = None
    for start in range(0, len(deltas), 4):  # two transactions: combine, then reduce into the stored document
        combined = deltas[start]
        for delta in deltas[start + 1:start + 4]:
            combined = reducer(combined, delta)
        stored = reducer.full(stored, combined)
    live = [3, 9]
    assert stored["count"] == len(live) and stored["total"] == sum(live)
    assert stored["lo_counts"] == {f"{3:020d}": 1, f"{5:020d}": 0, f"{9:020d}": 1}
    assert min(int(v) for v, n in stored["lo_counts"].items() if n > 0) == min(live)
    assert max(int(v) for v, n in stored["lo_counts"].items() if n > 0) == max(live)
