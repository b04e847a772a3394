"""Reduction strategies: how two documents of one key combine into one, after Flow's `reduce` annotations.

A strategy is associative (reduce(a, reduce(b, c)) == reduce(reduce(a, b), c)) but need not be commutative:
`older` is the document already reduced (or None when the key has none), `newer` the one arriving after it.
The runtime relies on associativity to combine a transaction's documents first and the loaded document last.

Two ways to get a Reducer:
  reducer_for(name)           one strategy applied to the whole document (no options, no nested annotations);
  reducer_for_schema(schema)  a JSON schema with `reduce` annotations at any location (see schema.py).
Semantics and errors of each strategy: docs/reductions.md.
"""

from __future__ import annotations

from typing import Any, Protocol

from headrace.errors import FeatureNotSupported
from headrace.materialize.reduce.schema import reducer_for_schema

Document = dict[str, Any]


class Reducer(Protocol):
    """Combine two documents of the same key; must be associative, may raise DataError on a type mismatch."""

    def __call__(self, older: Document | None, newer: Document) -> Document: ...


def combine_lww(older: Document | None, newer: Document) -> Document:
    """lastWriteWins, Flow's default: the newer document replaces the older one entirely."""
    return newer


DEFAULT_STRATEGY = "lastWriteWins"
STRATEGIES: dict[str, Reducer] = {
    name: reducer_for_schema({"reduce": {"strategy": name}})
    for name in ("append", "firstWriteWins", "maximize", "merge", "minimize", "set", "sum")
}
STRATEGIES[DEFAULT_STRATEGY] = combine_lww


def reducer_for(strategy: str = DEFAULT_STRATEGY) -> Reducer:
    """The reducer of a Flow strategy name (as in a schema's `reduce: {strategy: ...}`) over whole documents."""
    try:
        return STRATEGIES[strategy]
    except KeyError:
        raise FeatureNotSupported(f"reduction strategy {strategy!r} is not supported",
                                  hint=f"supported strategies: {', '.join(sorted(STRATEGIES))}") from None
