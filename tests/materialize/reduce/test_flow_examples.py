"""Flow's published reductions, run through reducer_for_schema: its unit-test vectors (flow_cases.py) and the
examples of its "Reduction strategies" docs (site/docs/reference/reduction-strategies/*.md)."""

from __future__ import annotations

from typing import Any

import pytest

from headrace.materialize.reduce import ReductionError, reducer_for_schema
from headrace.materialize.reduce.values import DELETE, MISSING, canonical
from tests.materialize.reduce.flow_cases import CASES, Step


@pytest.mark.parametrize("name", sorted(CASES))
def test_flow_unit_vectors(name: str) -> None:
    schema, steps = CASES[name]
    reducer = reducer_for_schema(schema)
    lhs: Any = MISSING
    for number, (mode, rhs, (outcome, expected)) in enumerate(steps):
        where = f"{name} step {number}: rhs={rhs!r}"
        try:
            if lhs is MISSING:
                reduced = rhs  # Flow's harness takes the first document as is
            else:
                reduced = reducer.reduce(lhs, rhs, full=mode == "full")
                reduced = None if reduced is DELETE else reduced  # Flow's test shows a deleted root's value
        except ReductionError as error:
            assert outcome == "err", f"{where}: unexpected error {error.message}"
            assert error.reason == expected, where
            continue
        assert outcome == "ok", f"{where}: expected error {expected!r}, got {reduced!r}"
        assert canonical(reduced) == canonical(expected), where
        lhs = reduced


def _merge_root(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "reduce": {"strategy": "merge"}, "required": ["key"],
            "properties": {"key": {"type": "string"}, **properties}}


_MIN_MAX_VALUE = {"$anchor": "min-max-value", "type": "array",
                  "items": [{"type": "string"}, {"type": "number", "reduce": {"strategy": "sum"}}],
                  "reduce": {"strategy": "minimize", "key": ["/0"]}}

# (schema, documents ingested in order, expected reduction)
DOC_EXAMPLES: dict[str, tuple[dict[str, Any], list[Any], Any]] = {
    "append": (
        _merge_root({"value": {"type": "array", "reduce": {"strategy": "append"}}}),
        [{"key": "key", "value": [1, 2]}, {"key": "key", "value": [3, None, "abc"]}],
        {"key": "key", "value": [1, 2, 3, None, "abc"]},
    ),
    "fww_lww": (
        _merge_root({"fww": {"reduce": {"strategy": "firstWriteWins"}},
                     "lww": {"reduce": {"strategy": "lastWriteWins"}}}),
        [{"key": "key", "fww": "one", "lww": "one"}, {"key": "key", "fww": "two", "lww": "two"}],
        {"key": "key", "fww": "one", "lww": "two"},
    ),
    "merge_by_index": (
        _merge_root({"value": {"type": ["array", "object"], "reduce": {"strategy": "merge"},
                               "items": {"type": "number", "reduce": {"strategy": "sum"}},
                               "additionalProperties": {"type": "number", "reduce": {"strategy": "sum"}}}}),
        [{"key": "key", "value": [1, 1]}, {"key": "key", "value": [2, 2, 2]}],
        {"key": "key", "value": [3, 3, 2]},
    ),
    "merge_by_property": (
        _merge_root({"value": {"type": ["array", "object"], "reduce": {"strategy": "merge"},
                               "items": {"type": "number", "reduce": {"strategy": "sum"}},
                               "additionalProperties": {"type": "number", "reduce": {"strategy": "sum"}}}}),
        [{"key": "key", "value": {"a": 1, "b": 1}}, {"key": "key", "value": {"a": 1, "c": 1}}],
        {"key": "key", "value": {"a": 2, "b": 1, "c": 1}},
    ),
    "merge_key": (
        _merge_root({"value": {"type": "array", "reduce": {"strategy": "merge", "key": ["/k"]},
                               "items": {"reduce": {"strategy": "firstWriteWins"}}}}),
        [{"key": "key", "value": [{"k": "a", "v": 1}, {"k": "b", "v": 1}]},
         {"key": "key", "value": [{"k": "a", "v": 2}, {"k": "c", "v": 2}]}],
        {"key": "key", "value": [{"k": "a", "v": 1}, {"k": "b", "v": 1}, {"k": "c", "v": 2}]},
    ),
    "min_max": (
        _merge_root({"min": {"reduce": {"strategy": "minimize"}}, "max": {"reduce": {"strategy": "maximize"}}}),
        [{"key": "key", "min": 32, "max": "abc"}, {"key": "key", "min": 42, "max": "def"}],
        {"key": "key", "min": 32, "max": "def"},
    ),
    "min_max_key": (
        _merge_root({"min": _MIN_MAX_VALUE,
                     "max": {"$ref": "#min-max-value", "reduce": {"strategy": "maximize", "key": ["/0"]}}}),
        [{"key": "key", "min": ["a", 1], "max": ["a", 1]}, {"key": "key", "min": ["c", 2], "max": ["c", 2]},
         {"key": "key", "min": ["b", 3], "max": ["b", 3]}, {"key": "key", "min": ["a", 4], "max": ["a", 4]}],
        {"key": "key", "min": ["a", 5], "max": ["c", 2]},
    ),
    "set_object": (
        _merge_root({"value": {"type": "object", "reduce": {"strategy": "set"},
                               "additionalProperties": {
                                   "type": "object", "reduce": {"strategy": "lastWriteWins"},
                                   "additionalProperties": {"type": "number", "reduce": {"strategy": "sum"}}}}}),
        [{"key": "key", "value": {"add": {"a": 1, "b": 1, "c": 1}}}, {"key": "key", "value": {"remove": {"b": 0}}},
         {"key": "key", "value": {"add": {"a": 1, "d": 1}}}, "verify:",
         {"key": "key", "value": {"intersect": {"a": 0, "d": 0}}}, {"key": "key", "value": {"add": {"a": 1, "e": 1}}}],
        [{"key": "key", "value": {"add": {"a": 2, "c": 1, "d": 1}}},
         {"key": "key", "value": {"add": {"a": 3, "d": 1, "e": 1}}}],
    ),
    "set_array": (
        _merge_root({"value": {"type": "object", "reduce": {"strategy": "set", "key": ["/0"]},
                               "additionalProperties": {
                                   "type": "array", "reduce": {"strategy": "lastWriteWins"},
                                   "items": {"type": "array", "reduce": {"strategy": "merge"},
                                             "items": [{"type": "string"},
                                                       {"type": "number", "reduce": {"strategy": "sum"}}]}}}}),
        [{"key": "key", "value": {"add": [["a", 1], ["b", 1], ["c", 1]]}},
         {"key": "key", "value": {"remove": [["b", 0]]}},
         {"key": "key", "value": {"add": [["a", 1], ["d", 1]]}}, "verify:",
         {"key": "key", "value": {"intersect": [["a", 0], ["d", 0]]}},
         {"key": "key", "value": {"add": [["a", 1], ["e", 1]]}}],
        [{"key": "key", "value": {"add": [["a", 2], ["c", 1], ["d", 1]]}},
         {"key": "key", "value": {"add": [["a", 3], ["d", 1], ["e", 1]]}}],
    ),
    "sum": (
        _merge_root({"value": {"type": "number", "reduce": {"strategy": "sum"}}}),
        [{"key": "key", "value": 5}, {"key": "key", "value": -1.2}],
        {"key": "key", "value": 3.8},
    ),
    "big_sum_string_encoded": (  # Flow's bigSum page; its `sum` now takes string-encoded numbers
        _merge_root({"value": {"reduce": {"strategy": "sum"}}}),
        [{"key": "key", "value": 5}, {"key": "key", "value": "-1.2"}],
        {"key": "key", "value": "3.8"},
    ),
    "reset_counter": (  # "Composing with conditionals"; Flow's verify ignores the extra "action" property
        {"type": "object", "required": ["key"],
         "properties": {"key": {"type": "string"}, "value": {"type": "number"}},
         "oneOf": [
             {"properties": {"action": {"const": "reset"}}, "reduce": {"strategy": "lastWriteWins"}},
             {"properties": {"action": {"const": "sum", "reduce": {"strategy": "firstWriteWins"}},
                             "value": {"reduce": {"strategy": "sum"}}},
              "reduce": {"strategy": "merge"}},
         ]},
        [{"key": "key", "action": "sum", "value": 5}, {"key": "key", "action": "sum", "value": -1.2}, "verify:",
         {"key": "key", "action": "reset", "value": 0}, {"key": "key", "action": "sum", "value": 1.3}],
        [{"key": "key", "action": "sum", "value": 3.8}, {"key": "key", "action": "reset", "value": 1.3}],
    ),
}


def _ingest(reducer: Any, documents: list[Any], lhs: Any) -> Any:
    for doc in documents:
        lhs = doc if lhs is None else reducer(lhs, doc)
    return lhs


@pytest.mark.parametrize("name", sorted(DOC_EXAMPLES))
def test_flow_docs_examples(name: str) -> None:
    schema, documents, expected = DOC_EXAMPLES[name]
    reducer = reducer_for_schema(schema)
    if not isinstance(expected, list):
        documents, expected = documents + ["verify:"], [expected]
    # Reduce each document into the stored one (full reductions), and also combine each ingest batch first
    # (partial reductions) and then reduce it into the stored document, as the runtime does: both must give
    # Flow's expected document at each verify.
    stored: Any = None
    combined_then_stored: Any = None
    batch: list[Any] = []
    checks = iter(expected)
    for doc in documents:
        if doc != "verify:":
            stored = reducer.full(stored, doc)
            batch.append(doc)
            continue
        combined = _ingest(reducer, batch, None)
        combined_then_stored = reducer.full(combined_then_stored, combined)
        batch = []
        want = canonical(next(checks))
        assert canonical(stored) == want
        assert canonical(combined_then_stored) == want


def _steps_are_well_formed(steps: list[Step]) -> bool:
    return all(mode in ("partial", "full") for mode, _, _ in steps)


def test_vectors_are_well_formed() -> None:
    assert all(_steps_are_well_formed(steps) for _, steps in CASES.values())
