"""Reduction strategies: how two documents of one key combine into one, after Flow's `reduce` annotations.

A strategy is associative (reduce(a, reduce(b, c)) == reduce(reduce(a, b), c)) but need not be commutative:
`older` is the document already reduced (or None when the key has none), `newer` the one arriving after it.
The runtime relies on associativity to combine a transaction's documents first and the loaded document last.
"""

from __future__ import annotations

from typing import Any, Protocol

from headrace.errors import FeatureNotSupported

Document = dict[str, Any]


class Reducer(Protocol):
    """Combine two documents of the same key; must be associative, may raise DataError on a type mismatch."""

    def __call__(self, older: Document | None, newer: Document) -> Document: ...


def combine_lww(older: Document | None, newer: Document) -> Document:
    """lastWriteWins, Flow's default: the newer document replaces the older one entirely."""
    return newer


STRATEGIES: dict[str, Reducer] = {
    "lastWriteWins": combine_lww,
}
DEFAULT_STRATEGY = "lastWriteWins"


def reducer_for(strategy: str = DEFAULT_STRATEGY) -> Reducer:
    """The reducer of a Flow strategy name (as in a schema's `reduce: {strategy: ...}`)."""
    try:
        return STRATEGIES[strategy]
    except KeyError:
        raise FeatureNotSupported(f"reduction strategy {strategy!r} is not supported",
                                  hint=f"supported strategies: {', '.join(sorted(STRATEGIES))}") from None
