"""ScrollRows (coordinator/cursors.py): a cursor over rows positioned as PostgreSQL positions one. The expected
rows and MOVE counts are PostgreSQL 15's for the same FETCH / MOVE sequence over `SELECT generate_series(1, 6)`
declared SCROLL (and over int8_tbl LIMIT 10 in the regression file limit.sql)."""

from __future__ import annotations

from headrace.coordinator.cursors import ABSOLUTE, BACKWARD, FORWARD, RELATIVE, ScrollRows


def test_forward_and_backward_as_postgresql() -> None:
    rows = ScrollRows([(n,) for n in range(1, 6)])
    assert rows.fetch(FORWARD, None) == [(1,), (2,), (3,), (4,), (5,)]  # fetch all
    assert rows.fetch(FORWARD, 1) == []  # fetch 1: past the end
    assert rows.fetch(BACKWARD, 1) == [(5,)]
    assert rows.fetch(BACKWARD, None) == [(4,), (3,), (2,), (1,)]
    assert rows.fetch(BACKWARD, 1) == []  # before the first row
    assert rows.fetch(FORWARD, None) == [(1,), (2,), (3,), (4,), (5,)]


def test_every_direction_and_move_counts() -> None:
    rows = ScrollRows([(n,) for n in range(1, 7)])
    assert rows.fetch(FORWARD, 2) == [(1,), (2,)]
    assert rows.fetch(FORWARD, 0) == [(2,)]  # the current row again
    assert rows.fetch(RELATIVE, 0) == [(2,)]
    assert rows.fetch(FORWARD, None) == [(3,), (4,), (5,), (6,)]
    assert rows.fetch(FORWARD, 0) == []  # after the last row: no current row
    assert len(rows.fetch(BACKWARD, 2)) == 2  # MOVE BACKWARD 2: MOVE 2
    assert rows.fetch(BACKWARD, 1) == [(4,)]  # FETCH PRIOR
    assert len(rows.fetch(FORWARD, None)) == 2  # MOVE ALL: MOVE 2
    assert len(rows.fetch(ABSOLUTE, 3)) == 1 and rows.position == 3
    assert rows.fetch(RELATIVE, 1) == [(4,)]
    assert rows.fetch(ABSOLUTE, -1) == [(6,)]  # LAST
    assert rows.fetch(ABSOLUTE, -7) == [] and rows.position == 0
    assert rows.fetch(ABSOLUTE, 9) == [] and rows.position == 7
    assert rows.fetch(RELATIVE, -2) == [(5,)]
    assert rows.fetch(ABSOLUTE, 0) == [] and rows.position == 0


def test_what_needs_a_backward_scan() -> None:
    rows = ScrollRows([(n,) for n in range(1, 4)])
    assert not rows.needs_backward(FORWARD, 0)  # no current row yet
    rows.fetch(FORWARD, 2)
    assert rows.needs_backward(FORWARD, 0) and rows.needs_backward(RELATIVE, 0)
    assert rows.needs_backward(BACKWARD, 1) and rows.needs_backward(RELATIVE, -1)
    assert rows.needs_backward(ABSOLUTE, 2) and rows.needs_backward(ABSOLUTE, -1)
    assert not rows.needs_backward(FORWARD, None) and not rows.needs_backward(RELATIVE, 1)
    assert not rows.needs_backward(ABSOLUTE, 3)
