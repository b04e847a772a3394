"""Reduction strategies."""

from __future__ import annotations

import pytest

from headrace.errors import FeatureNotSupported
from headrace.materialize.reduce import DEFAULT_STRATEGY, combine_lww, reducer_for


def test_last_write_wins_keeps_the_newer_document_whole() -> None:
    older = {"k": 1, "only_old": True}
    newer = {"k": 2}
    assert combine_lww(older, newer) == {"k": 2}
    assert combine_lww(None, newer) == {"k": 2}


def test_last_write_wins_is_associative() -> None:
    a, b, c = {"v": 1}, {"v": 2}, {"v": 3}
    assert combine_lww(a, combine_lww(b, c)) == combine_lww(combine_lww(a, b), c)


def test_strategies_are_looked_up_by_flow_name() -> None:
    assert DEFAULT_STRATEGY == "lastWriteWins"
    assert reducer_for("lastWriteWins") is combine_lww
    with pytest.raises(FeatureNotSupported, match="reduction strategy 'hyperLogLog' is not supported") as info:
        reducer_for("hyperLogLog")
    assert info.value.hint is not None and "lastWriteWins" in info.value.hint
