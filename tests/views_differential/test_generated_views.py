"""The generated differential test: random views over a random table, compared with the same SELECT on PostgreSQL
15 after the backfill and after every batch of random INSERT / UPDATE / DELETE (generated.py).

`make test` runs one small fixed seed; `make compat-views` (and `make compat`, through `python -m tests.compat`) runs
HEADRACE_VIEWS_CASES tables of HEADRACE_VIEWS_PER_TABLE views each (>= 200 views)."""

from __future__ import annotations

import os

import pytest

from tests.views_differential.generated import run_generated
from tests.views_differential.oracle import Pair

SEED = int(os.environ.get("HEADRACE_VIEWS_SEED", "22"))
CASES = int(os.environ.get("HEADRACE_VIEWS_CASES", "1"))
VIEWS_PER_TABLE = int(os.environ.get("HEADRACE_VIEWS_PER_TABLE", "8"))
BATCHES = int(os.environ.get("HEADRACE_VIEWS_BATCHES", "2"))


# ~6 s per view on a loaded 2-core machine (each CREATE restarts the table's query); generous for make compat-views.
@pytest.mark.timeout(300 + CASES * VIEWS_PER_TABLE * (10 + 5 * BATCHES))
def test_generated_views_agree_with_postgresql(pair: Pair) -> None:
    run = run_generated(pair, SEED, CASES, VIEWS_PER_TABLE, BATCHES)
    print(run.summary())
    for reason in run.refused:
        print("refused:", reason)
    assert not run.disagreements, "\n".join(run.disagreements)
    assert run.accepted >= max(1, CASES * VIEWS_PER_TABLE // 2), run.refused  # refusing most views would prove nothing
