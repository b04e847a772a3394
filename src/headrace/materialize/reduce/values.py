"""JSON values as reductions see them: Flow's total order, relative JSON pointers, and reduction errors.

Documents are plain Python JSON values (dict, list, str, int, float, bool, None). bool is checked before int
everywhere because Python's bool is an int.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from headrace.errors import DataError


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


MISSING: Any = _Sentinel("MISSING")  # a location absent on the left-hand side (Flow's `lhs: None`)
DELETE: Any = _Sentinel("DELETE")  # a full reduction removes this location (`delete: true`)

# Flow's order between types: null < boolean < number < string < array < object.
_RANK = {type(None): 0, bool: 1, int: 2, float: 2, str: 3, list: 4, dict: 5}


def compare(lhs: Any, rhs: Any) -> int:
    """Flow's deep total order over JSON (-1, 0, 1): numbers by value (1 == 1.0), strings by code point,
    arrays lexicographically (a prefix orders first), objects by their properties in sorted order."""
    tl, tr = type(lhs), type(rhs)
    rl, rr = _RANK[tl], _RANK[tr]
    if rl != rr:
        return -1 if rl < rr else 1
    if rl == 4:
        for a, b in zip(lhs, rhs):
            o = compare(a, b)
            if o:
                return o
        return (len(lhs) > len(rhs)) - (len(lhs) < len(rhs))
    if rl == 5:
        for (ka, va), (kb, vb) in zip(sorted(lhs.items()), sorted(rhs.items())):
            if ka != kb:
                return -1 if ka < kb else 1
            o = compare(va, vb)
            if o:
                return o
        return (len(lhs) > len(rhs)) - (len(lhs) < len(rhs))
    if rl == 0:
        return 0
    return (lhs > rhs) - (lhs < rhs)


Pointer = tuple[str, ...]


def parse_pointer(text: str) -> Pointer:
    """An RFC 6901 JSON pointer ("" is the location itself), relative to the reduced location."""
    if text == "":
        return ()
    if not text.startswith("/"):
        raise ValueError(f"JSON pointer {text!r} must be empty or start with '/'")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in text[1:].split("/"))


def query(pointer: Pointer, value: Any) -> Any:
    """The value at `pointer` within `value`, or MISSING. Array tokens are decimal indexes."""
    for token in pointer:
        if type(value) is dict:
            value = value.get(token, MISSING)
            if value is MISSING:
                return MISSING
        elif type(value) is list:
            if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
                return MISSING
            index = int(token)
            if index >= len(value):
                return MISSING
            value = value[index]
        else:
            return MISSING
    return value


def compare_key(key: Sequence[Pointer], lhs: Any, rhs: Any) -> int:
    """Compare two values by a composite key of pointers; a missing location orders before any value."""
    for pointer in key:
        a, b = query(pointer, lhs), query(pointer, rhs)
        if a is MISSING or b is MISSING:
            if a is not b:
                return -1 if a is MISSING else 1
            continue
        o = compare(a, b)
        if o:
            return o
    return 0


def canonical(value: Any) -> str:
    """Canonical JSON text (sorted keys): equality that tells 1 from 1.0 and true from 1, as Flow's tests do."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _preview(value: Any) -> str:
    if value is MISSING:
        return "(none)"
    text = json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:197] + "..."


class ReductionError(DataError):
    """A document could not be reduced at some location (Flow's reduce::Error, with location and values)."""

    def __init__(self, reason: str, lhs: Any = MISSING, rhs: Any = MISSING) -> None:
        self.reason = reason
        self.path: list[str] = []
        super().__init__(reason, detail=f"having values LHS: {_preview(lhs)}, RHS: {_preview(rhs)}")
        self._render()

    @property
    def location(self) -> str:
        """The JSON pointer of the location that failed to reduce ("" is the document root)."""
        return "".join("/" + _escape(token) for token in self.path)

    def at(self, token: str | int) -> ReductionError:
        """Prefix the failing location with a parent's property or index (called while unwinding)."""
        self.path.insert(0, str(token))
        self._render()
        return self

    def _render(self) -> None:
        self.message = f'while reducing "{self.location}": {self.reason}'
        self.args = (self.message,)


class NotAssociativeError(ReductionError):
    """A partial (associative) reduction cannot combine these values; only a full reduction can.

    Flow's combiner keeps both documents until the base document is known. A caller may do the same:
    retain the documents and reduce them fully (SchemaReducer.full) once the loaded document is in hand."""

    def __init__(self, lhs: Any = MISSING, rhs: Any = MISSING) -> None:
        super().__init__("encountered non-associative reduction in an unexpected context", lhs, rhs)


APPEND_WRONG_TYPE = "'append' strategy expects arrays"
SUM_WRONG_TYPE = "'sum' strategy expects numbers"
SUM_OVERFLOW = "`sum` resulted in numeric overflow"
MERGE_WRONG_TYPE = "'merge' strategy expects objects or arrays"
SET_WRONG_TYPE = ("'set' strategy expects objects having only 'add', 'remove', and 'intersect' properties "
                  "with consistent object or array types")
