"""Flow's own reduction test vectors, transcribed from estuary/flow crates/doc/src/reduce/{strategy,set}.rs.

Each case is (schema, steps); a step is (mode, rhs, expected) with mode "partial" or "full", and expected either
("ok", document) or ("err", innermost Flow error message). As in Flow's harness, the first document is taken as
is, a failed step leaves the left-hand document unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

from headrace.materialize.reduce.values import (
    APPEND_WRONG_TYPE,
    MERGE_WRONG_TYPE,
    SUM_OVERFLOW,
    SUM_WRONG_TYPE,
)

NOT_ASSOCIATIVE = "encountered non-associative reduction in an unexpected context"
F64_MAX = sys.float_info.max
U64_MAX = 2**64 - 1

Step = tuple[str, Any, tuple[str, Any]]


def P(rhs: Any, ok: Any = None, err: str | None = None) -> Step:
    return ("partial", rhs, ("err", err) if err else ("ok", ok))


def F(rhs: Any, ok: Any = None, err: str | None = None) -> Step:
    return ("full", rhs, ("err", err) if err else ("ok", ok))


MERGE_PATCH_SCHEMA = {
    "$id": "flow://merge-patch-schema",
    "oneOf": [
        {"type": "object", "reduce": {"strategy": "merge"},
         "additionalProperties": {"$ref": "flow://merge-patch-schema"}},
        {"type": "null", "reduce": {"strategy": "lastWriteWins", "delete": True}},
        {"type": ["array", "boolean", "number", "string"]},
    ],
}

CASES: dict[str, tuple[Any, list[Step]]] = {
    "append_array": (
        {"if": {"type": "null"}, "then": {"reduce": {"strategy": "lastWriteWins"}},
         "else": {"reduce": {"strategy": "append"}}},
        [P([], []), P("whoops", err=APPEND_WRONG_TYPE), P([0, 1], [0, 1]), P([2, 3, 4], [0, 1, 2, 3, 4]),
         P([-1, "a"], [0, 1, 2, 3, 4, -1, "a"]), P({}, err=APPEND_WRONG_TYPE), P(None, None),
         P([5, 6, 4], None)],
    ),
    "last_write_wins": (
        {"oneOf": [
            {"type": ["string", "object", "null"], "reduce": {"strategy": "lastWriteWins"}},
            {"type": "integer", "reduce": {"strategy": "lastWriteWins", "associative": False}},
        ]},
        [P("foo", "foo"), P({"n": 42}, {"n": 42}), P(None, None), P(42, err=NOT_ASSOCIATIVE), F(42, 42),
         P(42, 42), P(52, err=NOT_ASSOCIATIVE), P("foo", "foo")],
    ),
    "first_write_wins": (
        {"reduce": {"strategy": "firstWriteWins"}},
        [P("foo", "foo"), P({"n": 42}, "foo"), P(None, "foo")],
    ),
    "minimize_simple": (
        {"reduce": {"strategy": "minimize"}},
        [P(3, 3), P(4, 3), P(3, 3), P(2, 2)],
    ),
    "maximize_simple": (
        {"reduce": {"strategy": "maximize"}},
        [P(3, 3), P(4, 4), P(4, 4), P(2, 4)],
    ),
    "minimize_with_deep_merge": (
        {"properties": {"n": {"reduce": {"strategy": "sum"}}}, "reduce": {"strategy": "minimize", "key": ["/k"]}},
        [P({"k": 3, "n": 1}, {"k": 3, "n": 1}),
         P({"k": 4, "n": 1}, {"k": 3, "n": 1}),
         P({"k": 3, "n": 1, "!": True}, {"k": 3, "n": 2, "!": True}),
         P({"k": 4, "n": 1, "!": False}, {"k": 3, "n": 2, "!": True}),
         P({"k": 3, "n": 1}, {"k": 3, "n": 3, "!": True}),
         P({"k": 2, "n": 1}, {"k": 2, "n": 1}),
         P({"k": None, "n": -1}, {"k": None, "n": -1}),  # null orders before an integer
         P({"n": 1, "whoops": True}, {"n": 1, "whoops": True}),  # a missing key orders before null
         P(42, err=MERGE_WRONG_TYPE)],  # keys equal (both missing): deep merge fails
    ),
    "maximize_with_deep_merge": (
        {"items": [{"reduce": {"strategy": "sum"}}, {"type": "integer"}],
         "reduce": {"strategy": "maximize", "key": ["/1"]}},
        [P([1, 3], [1, 3]), P([1, 4], [1, 4]), P([1, 3], [1, 4]), P([1, 4, "."], [2, 4, "."]),
         P({"1": 4}, err=NOT_ASSOCIATIVE), P([1, 2, "!"], [2, 4, "."]), P([1, 4, ":"], [3, 4, ":"]),
         P([], [3, 4, ":"]), P(32, [3, 4, ":"])],
    ),
    "sum": (
        {"reduce": {"strategy": "sum"}},
        [P(0, 0), P("whoops", err=SUM_WRONG_TYPE), P(123, 123), P(45, 168),
         P(U64_MAX - 32, err=SUM_OVERFLOW), P(-70, 98), P(0.1, 98.1), P(-98.1, 0.0), P(F64_MAX, F64_MAX),
         P(F64_MAX / 10.0, err=SUM_OVERFLOW), P(-1.0, F64_MAX), P(-F64_MAX / 2.0, F64_MAX / 2.0),
         P(-F64_MAX / 2.0, 0.0), P("whoops", err=SUM_WRONG_TYPE)],
    ),
    "sum_arbitrary_precision": (
        {"reduce": {"strategy": "sum"}},
        [P(0, 0), P("1", "1"), P("9000000000000000000", "9000000000000000001"),
         P("10000000000000000000", "19000000000000000001"), P(1_233, "19000000000000001234"),
         P(-10_000, "18999999999999991234"), P(86753.09, "19000000000000077987.09000000000"),
         P("10203.040506070812", "19000000000000088190.130506070812")],
    ),
    "merge_array_in_place": (
        {"items": {"reduce": {"strategy": "maximize"}}, "reduce": {"strategy": "merge"}},
        [P([], []), P("whoops", err=MERGE_WRONG_TYPE), P([0, 1, 0], [0, 1, 0]), P([3, 0, 2], [3, 1, 2]),
         P([-1, 0, 4, "a"], [3, 1, 4, "a"]), P([0, 32.6, 0, "b"], [3, 32.6, 4, "b"]),
         P({}, err=NOT_ASSOCIATIVE), F({"a": "b"}, {"a": "b"})],
    ),
    "merge_ordered_scalars": (
        {"if": {"type": "null"}, "then": {"reduce": {"strategy": "lastWriteWins"}},
         "else": {"reduce": {"strategy": "merge", "key": [""]}}},
        [P([5, 9], [5, 9]), P([7], [5, 7, 9]), P([2, 4, 5], [2, 4, 5, 7, 9]),
         P([1, 2, 7, 10], [1, 2, 4, 5, 7, 9, 10]), P(None, None), P([1, 2], err=NOT_ASSOCIATIVE),
         F([1, 2], [1, 2])],
    ),
    "deep_merge_ordered_objects": (
        {"items": {"properties": {"k": {"type": "integer"}},
                   "additionalProperties": {"reduce": {"strategy": "sum"}}, "reduce": {"strategy": "merge"}},
         "reduce": {"strategy": "merge", "key": ["/k"]}},
        [P([{"k": 5, "n": 1}, {"k": 9, "n": 1}], [{"k": 5, "n": 1}, {"k": 9, "n": 1}]),
         P([{"k": 7, "m": 1}], [{"k": 5, "n": 1}, {"k": 7, "m": 1}, {"k": 9, "n": 1}]),
         P([{"k": 5, "n": 3}, {"k": 7, "m": 1}], [{"k": 5, "n": 4}, {"k": 7, "m": 2}, {"k": 9, "n": 1}]),
         P([{"k": 9, "n": -2}], [{"k": 5, "n": 4}, {"k": 7, "m": 2}, {"k": 9, "n": -1}])],
    ),
    "merge_objects": (
        {"if": {"type": "null"}, "then": {"reduce": {"strategy": "lastWriteWins"}},
         "else": {"reduce": {"strategy": "merge"}}},
        [P({"5": 5, "9": 9}, {"5": 5, "9": 9}), P({"7": 7}, {"5": 5, "7": 7, "9": 9}),
         P({"2": 2, "4": 4, "5": 55}, {"2": 2, "4": 4, "5": 55, "7": 7, "9": 9}),
         P({"1": 1, "2": 22, "7": 77, "10": 10}, {"1": 1, "2": 22, "4": 4, "5": 55, "7": 77, "9": 9, "10": 10}),
         P("whoops", err=MERGE_WRONG_TYPE), P(None, None), P({"9": 9}, err=NOT_ASSOCIATIVE),
         F({"9": 9}, {"9": 9})],
    ),
    "deep_merge_objects": (
        {"reduce": {"strategy": "merge", "key": ["/k"]},
         "additionalProperties": {"if": {"type": ["object", "array"]}, "then": {"$ref": "#"}},
         "items": {"$ref": "#/additionalProperties"}},
        [P([{"k": "b", "v": [{"k": 5}]}], [{"k": "b", "v": [{"k": 5}]}]),
         P([{"k": "a", "v": [{"k": 2}]}, {"k": "b", "v": [{"k": 3}]}],
           [{"k": "a", "v": [{"k": 2}]}, {"k": "b", "v": [{"k": 3}, {"k": 5}]}]),
         P([{"k": "b", "v": [{"k": 1}, {"k": 5, "d": True}]}, {"k": "c", "v": [{"k": 9}]}],
           [{"k": "a", "v": [{"k": 2}]}, {"k": "b", "v": [{"k": 1}, {"k": 3}, {"k": 5, "d": True}]},
            {"k": "c", "v": [{"k": 9}]}])],
    ),
    "merge_array_deletion": (
        {"items": {"properties": {"k": {"type": "integer"}}, "if": {"required": ["del"]},
                   "then": {"reduce": {"strategy": "lastWriteWins", "delete": True}}},
         "reduce": {"strategy": "merge", "key": ["/k"]}},
        [P([{"k": 5}, {"k": 9}], [{"k": 5}, {"k": 9}]),
         P([{"k": 5, "del": 1}, {"k": 6}], [{"k": 5, "del": 1}, {"k": 6}, {"k": 9}]),
         P([{"k": 5, "del": 1}], [{"k": 5, "del": 1}, {"k": 6}, {"k": 9}]),
         F([{"k": 5, "del": 1}, {"k": 7}], [{"k": 6}, {"k": 7}, {"k": 9}]),
         F([{"k": 6, "del": 1}, {"k": 8}, {"k": 9, "del": 1}], [{"k": 7}, {"k": 8}])],
    ),
    "merge_object_deletion": (
        {"additionalProperties": {"if": {"const": "del"},
                                  "then": {"reduce": {"strategy": "lastWriteWins", "delete": True}}},
         "reduce": {"strategy": "merge"}},
        [P({"5": 5, "9": 9}, {"5": 5, "9": 9}), P({"5": "del", "6": 6}, {"5": "del", "6": 6, "9": 9}),
         P({"5": "del"}, {"5": "del", "6": 6, "9": 9}), F({"5": "del", "7": 7}, {"6": 6, "7": 7, "9": 9}),
         F({"6": "del", "8": 8, "9": "del"}, {"7": 7, "8": 8})],
    ),
    "merge_patch_examples": (
        MERGE_PATCH_SCHEMA,
        [P({"a": 32.6, "c": {"d": [42], "f": "g"}}, {"a": 32.6, "c": {"d": [42], "f": "g"}}),
         P({"c": {"d": "e"}}, {"a": 32.6, "c": {"d": "e", "f": "g"}}),
         F({"a": "z", "c": {"f": None}}, {"a": "z", "c": {"d": "e"}}),
         P({"a": {"1": 1}}, err=NOT_ASSOCIATIVE),
         F({"a": {"1": 1}}, {"a": {"1": 1}, "c": {"d": "e"}}),
         F([1, 2], [1, 2]),
         F({"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
         F(None, None),
         F("fin", "fin")],
    ),
    "set_array_sequence": (
        {"$defs": {"entry": {"type": "array",
                             "items": [{"type": "integer"}, {"type": "integer", "reduce": {"strategy": "sum"}}],
                             "reduce": {"strategy": "merge"}}},
         "properties": {"add": {"items": {"$ref": "#/$defs/entry"}}},
         "reduce": {"strategy": "set", "key": ["/0"]}},
        [P({"add": [[55, 1]]}, {"add": [[55, 1]]}),
         P({"add": [[99, 1]]}, {"add": [[55, 1], [99, 1]]}),
         P({"remove": [[99]], "add": [[22, 1], [55, 1]]}, {"remove": [[99]], "add": [[22, 1], [55, 2]]}),
         P({"remove": [[55]], "add": [[22, 3], [55, 1]]}, {"remove": [[55], [99]], "add": [[22, 4], [55, 1]]}),
         F({"remove": [[88]], "add": [[11, 1], [22, 2]]}, {"add": [[11, 1], [22, 6], [55, 1]]}),
         F({"remove": [[55]]}, {"add": [[11, 1], [22, 6]]}),
         P({"intersect": [[22], [33]]}, {"intersect": [[22], [33]], "add": [[22, 6]]}),
         P({"add": [[22, 2], [33, 1]]}, {"intersect": [[22], [33]], "add": [[22, 8], [33, 1]]}),
         P({"intersect": [[33], [44]], "add": [[22, 1], [33, 1]]}, {"intersect": [[33]], "add": [[22, 1], [33, 2]]}),
         P({"remove": [[33]], "add": [[22, 1], [33, 1]]}, {"intersect": [], "add": [[22, 2], [33, 1]]}),
         F({"add": [[33, 1]]}, {"add": [[22, 2], [33, 2]]}),
         P({"remove": [[33]]}, {"add": [[22, 2]], "remove": [[33]]})],
    ),
    "set_object_sequence": (
        {"properties": {"add": {"additionalProperties": {"type": "integer", "reduce": {"strategy": "sum"}}}},
         "reduce": {"strategy": "set"}},
        [P({"add": {"55": 1}}, {"add": {"55": 1}}),
         P({"add": {"99": 1}}, {"add": {"55": 1, "99": 1}}),
         P({"remove": {"99": 0}, "add": {"22": 1, "55": 1}}, {"remove": {"99": 0}, "add": {"22": 1, "55": 2}}),
         P({"remove": {"55": 0}, "add": {"22": 3, "55": 1}},
           {"remove": {"55": 0, "99": 0}, "add": {"22": 4, "55": 1}}),
         F({"remove": {"88": 0}, "add": {"11": 1, "22": 2}}, {"add": {"11": 1, "22": 6, "55": 1}}),
         F({"remove": {"55": 0}}, {"add": {"11": 1, "22": 6}}),
         P({"intersect": {"22": 0, "33": 0}}, {"intersect": {"22": 0, "33": 0}, "add": {"22": 6}}),
         P({"add": {"22": 2, "33": 1}}, {"intersect": {"22": 0, "33": 0}, "add": {"22": 8, "33": 1}}),
         P({"intersect": {"33": 0, "44": 0}, "add": {"22": 1, "33": 1}},
           {"intersect": {"33": 0}, "add": {"22": 1, "33": 2}}),
         P({"remove": {"33": 0}, "add": {"22": 1, "33": 1}}, {"intersect": {}, "add": {"22": 2, "33": 1}}),
         F({"add": {"33": 1}}, {"add": {"22": 2, "33": 2}}),
         P({"remove": {"33": 0}}, {"add": {"22": 2}, "remove": {"33": 0}})],
    ),
}
