"""The `set` strategy, after Flow's crates/doc/src/reduce/set.rs.

A set location is an object with only "add", "intersect" and "remove" terms ("intersect" and "remove" never on
the same side). Terms are objects (members keyed by property) or arrays sorted and de-duplicated by the set's
`key` pointers (`[""]`: the item itself); one form throughout both sides. Members present on both sides of a
kept term are deep-merged by the term's own annotations, which makes a set an associative map.

With L and R the left and right terms (A add, I intersect, R remove):
  L{I,A} . R{I,A}:  add = (LA & RI) | RA    intersect = LI & RI
  L{I,A} . R{R,A}:  add = (LA - RR) | RA    intersect = LI - RR
  L{R,A} . R{I,A}:  add = (LA & RI) | RA    intersect = RI - LR
  L{R,A} . R{R,A}:  add = (LA - RR) | RA    remove    = LR | RR
A full reduction (the left side is the base document) keeps only "add".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headrace.materialize.reduce.values import (
    DELETE,
    MISSING,
    SET_WRONG_TYPE,
    Pointer,
    ReductionError,
    compare_key,
)

if TYPE_CHECKING:
    from headrace.materialize.reduce.engine import Fn
    from headrace.materialize.reduce.schema import Node

NONE, LEFT, RIGHT, BOTH, UNION = 0, 1, 2, 4, 7
_TERMS = ("add", "intersect", "remove")


def _unpack(side: dict[str, Any], lhs: Any, rhs: Any) -> dict[str, Any]:
    if "intersect" in side and "remove" in side:
        raise ReductionError(SET_WRONG_TYPE, lhs, rhs).at("remove")
    for name, value in side.items():
        if name not in _TERMS or type(value) not in (dict, list):
            raise ReductionError(SET_WRONG_TYPE, lhs, rhs).at(name)
    return side


def set_fn(node: Node, key: Sequence[Pointer]) -> Fn:
    key = tuple(key) or ((),)  # without a key, array members order by their whole value

    def reduce_set(lhs: Any, rhs: Any, full: bool) -> Any:
        left = {} if lhs is MISSING else lhs
        if type(left) is not dict or type(rhs) is not dict:
            raise ReductionError(SET_WRONG_TYPE, lhs, rhs)
        left, right = _unpack(left, lhs, rhs), _unpack(rhs, lhs, rhs)
        kinds = {type(v) for v in left.values()} | {type(v) for v in right.values()}
        if len(kinds) > 1:
            raise ReductionError(SET_WRONG_TYPE, lhs, rhs)
        term = _map_term if dict in kinds else _array_term
        la, li, lr = left.get("add"), left.get("intersect"), left.get("remove")
        ra, ri, rr = right.get("add"), right.get("intersect"), right.get("remove")

        out: dict[str, Any] = {}
        if ri is not None:
            add = term(node, key, "add", la, ri, True, UNION, ra, full)
            if li is not None:  # I,A . I,A
                other = ("intersect", term(node, key, "intersect", li, None, False, BOTH, ri, full))
            else:  # R,A . I,A
                other = ("intersect", term(node, key, "intersect", lr, None, False, RIGHT, ri, full))
        else:
            add = term(node, key, "add", la, rr, False, UNION, ra, full)
            if li is not None:  # I,A . R,A
                other = ("intersect", term(node, key, "remove", li, None, False, LEFT, rr, full))
            else:  # R,A . R,A
                other = ("remove", term(node, key, "remove", lr, None, False, UNION, rr, full))
        if add is not None:
            out["add"] = add
        if not full and other[1] is not None:
            out[other[0]] = other[1]
        return out
    return reduce_set


def _reduce_member(fn: Fn | None, token: str | int, lv: Any, rv: Any, full: bool) -> Any:
    if fn is None:
        return rv
    try:
        return fn(lv, rv, full)
    except ReductionError as error:
        raise error.at(token) from None


def _map_term(node: Node, key: tuple[Pointer, ...], name: str, lhs: dict[str, Any] | None,
              sub: dict[str, Any] | None, keep_in_sub: bool, mask: int, rhs: dict[str, Any] | None,
              full: bool) -> dict[str, Any] | None:
    """(lhs minus sub, or lhs within sub when keep_in_sub) combined with rhs under `mask`."""
    if rhs is None and lhs is None:
        return None
    left = lhs or {}
    if sub is not None:
        left = {k: v for k, v in left.items() if (k in sub) == keep_in_sub}
    right = rhs or {}
    out: dict[str, Any] = {}
    term_node = node.child_node(name) if mask & BOTH else None
    for k, lv in left.items():
        if k in right:
            if mask & BOTH:
                assert term_node is not None
                value = _reduce_member(term_node.child_fn(k), k, lv, right[k], full)
                if value is not DELETE:
                    out[k] = value
        elif mask & LEFT:
            out[k] = lv
    if mask & RIGHT:
        for k, rv in right.items():
            if k not in left:
                out[k] = rv
    return out


def _array_term(node: Node, key: tuple[Pointer, ...], name: str, lhs: list[Any] | None,
                sub: list[Any] | None, keep_in_sub: bool, mask: int, rhs: list[Any] | None,
                full: bool) -> list[Any] | None:
    if rhs is None and lhs is None:
        return None
    left = lhs or []
    if sub is not None:
        left = _filter_sorted(key, left, sub, keep_in_sub)
    right = rhs or []
    term_node = node.child_node(name) if mask & BOTH else None
    out: list[Any] = []
    i = j = 0
    while i < len(left) and j < len(right):
        order = compare_key(key, left[i], right[j])
        if order < 0:
            if mask & LEFT:
                out.append(left[i])
            i += 1
        elif order > 0:
            if mask & RIGHT:
                out.append(right[j])
            j += 1
        else:
            if mask & BOTH:
                assert term_node is not None
                value = _reduce_member(term_node.item_fn(j), j, left[i], right[j], full)
                if value is not DELETE:
                    out.append(value)
            i += 1
            j += 1
    if mask & LEFT:
        out.extend(left[i:])
    if mask & RIGHT:
        out.extend(right[j:])
    return out


def _filter_sorted(key: tuple[Pointer, ...], items: list[Any], sub: list[Any], keep_in_sub: bool) -> list[Any]:
    """Items of a sorted array that are (keep_in_sub) or are not in the sorted array `sub`, by key."""
    out = []
    j = 0
    for item in items:
        while j < len(sub) and compare_key(key, sub[j], item) < 0:
            j += 1
        found = j < len(sub) and compare_key(key, item, sub[j]) == 0
        if found == keep_in_sub:
            out.append(item)
    return out
