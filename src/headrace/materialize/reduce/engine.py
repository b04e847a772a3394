"""Strategy functions, after Flow's crates/doc/src/reduce/strategy.rs (its newest semantics).

Every location of a compiled schema gets a reduce function `fn(lhs, rhs, full) -> value | DELETE`:
  lhs   the value already reduced at this location, or MISSING when only the right-hand side has it;
  rhs   the value arriving after it (never MISSING);
  full  True when lhs is the root-most document (the base loaded from the store): deletions take effect,
        set "remove"/"intersect" terms are applied and dropped, and a merge may change a location's type.
A location whose function is None takes the right-hand value whole (lastWriteWins, the default), which is
also how the engine skips the call for un-annotated locations. Inputs are never mutated; results may share
unchanged subtrees with their inputs.

Errors carry Flow's messages ("'sum' strategy expects numbers", ...) and are ReductionError (a DataError);
each parent prefixes its property or index while the error unwinds, so the message names the location.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from headrace.materialize.reduce.numbers import I64_MIN, U64_MAX, checked_sum
from headrace.materialize.reduce.values import (
    APPEND_WRONG_TYPE,
    DELETE,
    MERGE_WRONG_TYPE,
    MISSING,
    NotAssociativeError,
    Pointer,
    ReductionError,
    compare,
    compare_key,
)

if TYPE_CHECKING:
    from headrace.materialize.reduce.schema import Node

Fn = Callable[[Any, Any, bool], Any]
UNSET: Any = object()


def first_write_wins(lhs: Any, rhs: Any, full: bool) -> Any:
    return rhs if lhs is MISSING else lhs


def last_write_wins_fn(delete: bool, associative: bool) -> Fn:
    def last_write_wins(lhs: Any, rhs: Any, full: bool) -> Any:
        if not associative and not full and lhs is not MISSING and compare(lhs, rhs) != 0:
            raise NotAssociativeError(lhs, rhs)
        return DELETE if full and delete else rhs
    return last_write_wins


def append(lhs: Any, rhs: Any, full: bool) -> Any:
    if type(rhs) is list:
        if type(lhs) is list:
            return lhs + rhs
        if lhs is MISSING:
            return rhs
        if lhs is None:
            return None  # a null left-hand side stays null: conditionals use it to switch appending off
    raise ReductionError(APPEND_WRONG_TYPE, lhs, rhs)


def sum_(lhs: Any, rhs: Any, full: bool) -> Any:
    # Fast paths for in-range integers; checked_sum has every other case.
    if type(rhs) is int and I64_MIN <= rhs <= U64_MAX:
        if lhs is MISSING:
            return rhs
        if type(lhs) is int and I64_MIN <= lhs <= U64_MAX:
            total = lhs + rhs
            if I64_MIN <= total <= U64_MAX:
                return total
    return checked_sum(lhs, rhs)


def minimize(lhs: Any, rhs: Any, full: bool) -> Any:
    if lhs is MISSING:
        return rhs
    tl, tr = type(lhs), type(rhs)
    if (tl is int or tl is float) and (tr is int or tr is float):
        return lhs if lhs < rhs else rhs
    return lhs if compare(lhs, rhs) < 0 else rhs  # ties take the right-hand side, as Flow does


def maximize(lhs: Any, rhs: Any, full: bool) -> Any:
    if lhs is MISSING:
        return rhs
    tl, tr = type(lhs), type(rhs)
    if (tl is int or tl is float) and (tr is int or tr is float):
        return lhs if lhs > rhs else rhs
    return lhs if compare(lhs, rhs) > 0 else rhs


def min_max_by_key_fn(node: Node, key: Sequence[Pointer], reverse: bool) -> Fn:
    """minimize/maximize over a composite key: the strictly better side wins; on equal keys both sides are
    deep-merged by the children's own annotations (a `merge` without a key)."""
    key = tuple(key)

    def min_max_by_key(lhs: Any, rhs: Any, full: bool) -> Any:
        if lhs is MISSING:
            return rhs
        order = compare_key(key, rhs, lhs) if reverse else compare_key(key, lhs, rhs)
        if order < 0:
            return lhs
        return node.plain_merge(lhs if order == 0 else MISSING, rhs, full)
    return min_max_by_key


def merge_fn(node: Node, key: Sequence[Pointer], delete: bool) -> Fn:
    """merge: objects property by property, arrays by index or (with `key`) as a sorted merge-join."""
    key = tuple(key)

    def merge(lhs: Any, rhs: Any, full: bool) -> Any:
        tr = type(rhs)
        if tr is dict:
            if type(lhs) is dict:
                out: Any = merge_objects(node, lhs, rhs, full)
            elif full:
                out = merge_objects(node, {}, rhs, True)
            elif lhs is MISSING:
                return rhs
            else:
                # {a: 1} . ("foo" . {b: 2}) == {a: 1, b: 2} but ({a: 1} . "foo") . {b: 2} == {b: 2}
                raise NotAssociativeError(lhs, rhs)
        elif tr is list:
            if type(lhs) is list:
                out = merge_sorted(node, key, lhs, rhs, full) if key else merge_by_index(node, lhs, rhs, full)
            elif full:
                out = merge_by_index(node, [], rhs, True)
            elif lhs is MISSING:
                return rhs
            else:
                raise NotAssociativeError(lhs, rhs)
        else:
            raise ReductionError(MERGE_WRONG_TYPE, lhs, rhs)
        return DELETE if delete and full else out
    return merge


def merge_objects(node: Node, lhs: dict[str, Any], rhs: dict[str, Any], full: bool) -> dict[str, Any]:
    out = dict(lhs)
    prop_fns = node.prop_fns
    default = node.default_fn
    for name, rv in rhs.items():
        fn = prop_fns.get(name, default)
        if fn is UNSET:
            fn = node.pattern_child_fn(name)
        if fn is None:
            out[name] = rv
            continue
        try:
            value = fn(lhs.get(name, MISSING), rv, full)
        except ReductionError as error:
            raise error.at(name) from None
        if value is DELETE:
            out.pop(name, None)
        else:
            out[name] = value
    return out


def reduce_item(node: Node, index: int, lv: Any, rv: Any, full: bool) -> Any:
    """Reduce one array item; the annotations are those of the right-hand item's index."""
    prefix = node.prefix_fns
    fn = prefix[index] if index < len(prefix) else node.rest_fn
    if fn is None:
        return rv
    try:
        return fn(lv, rv, full)
    except ReductionError as error:
        raise error.at(index) from None


def merge_by_index(node: Node, lhs: list[Any], rhs: list[Any], full: bool) -> list[Any]:
    out = []
    count = len(lhs)
    for index, rv in enumerate(rhs):
        value = reduce_item(node, index, lhs[index] if index < count else MISSING, rv, full)
        if value is not DELETE:
            out.append(value)
    out.extend(lhs[len(rhs):])
    return out


def merge_sorted(node: Node, key: tuple[Pointer, ...], lhs: list[Any], rhs: list[Any], full: bool) -> list[Any]:
    """Deep sorted merge of two arrays each sorted and de-duplicated by `key` (Flow requires and keeps that)."""
    out = []
    i = j = 0
    nl, nr = len(lhs), len(rhs)
    while i < nl and j < nr:
        order = compare_key(key, lhs[i], rhs[j])
        if order < 0:
            out.append(lhs[i])
            i += 1
            continue
        value = reduce_item(node, j, lhs[i] if order == 0 else MISSING, rhs[j], full)
        if order == 0:
            i += 1
        j += 1
        if value is not DELETE:
            out.append(value)
    out.extend(lhs[i:])
    while j < nr:
        value = reduce_item(node, j, MISSING, rhs[j], full)
        j += 1
        if value is not DELETE:
            out.append(value)
    return out
