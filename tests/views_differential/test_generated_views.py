"""The generated differential test: random views over a random table, compared with the same SELECT on PostgreSQL
15 after the backfill and after every batch of random INSERT / UPDATE / DELETE.

`make test` runs one small fixed seed; `make compat-views` runs HEADRACE_VIEWS_CASES tables of
HEADRACE_VIEWS_PER_TABLE views each (>= 200 views)."""

from __future__ import annotations

import os

import psycopg
import pytest

from tests.views_differential.generator import Generator
from tests.views_differential.oracle import Pair

SEED = int(os.environ.get("HEADRACE_VIEWS_SEED", "22"))
CASES = int(os.environ.get("HEADRACE_VIEWS_CASES", "1"))
VIEWS_PER_TABLE = int(os.environ.get("HEADRACE_VIEWS_PER_TABLE", "8"))
BATCHES = int(os.environ.get("HEADRACE_VIEWS_BATCHES", "2"))


# ~6 s per view on a loaded 2-core machine (each CREATE restarts the table's query); generous for make compat-views.
@pytest.mark.timeout(300 + CASES * VIEWS_PER_TABLE * (10 + 5 * BATCHES))
def test_generated_views_agree_with_postgresql(pair: Pair) -> None:
    accepted, refused, differences = 0, [], []
    for case in range(CASES):
        generator = Generator(SEED * 1000 + case)
        generated = generator.case(f"g{case}", VIEWS_PER_TABLE)
        pair.headrace.execute(generated.create_table)
        pair.oracle.execute(generated.oracle_create_table)
        for write in generator.writes():  # rows before the views: their backfill is checked too
            pair.both(write.replace("{t}", generated.table))
        views = {}
        for name, select in generated.views.items():
            try:
                pair.headrace.execute(f"CREATE MATERIALIZED VIEW {name} AS {select}")
            except psycopg.Error as error:
                refused.append(f"{error.sqlstate} {error.diag.message_primary}: {select}")
                continue
            views[name] = select
        accepted += len(views)
        for batch in range(BATCHES + 1):
            if batch > 0:
                for write in generator.writes():
                    pair.both(write.replace("{t}", generated.table))
            for name, select in views.items():
                difference = pair.compare(name, select)
                if difference is not None:
                    differences.append(f"[seed {SEED * 1000 + case}, batch {batch}] {difference}")
                    print(differences[-1], flush=True)  # a long run shows them as they come
        for name in views:
            pair.headrace.execute(f"DROP MATERIALIZED VIEW {name}")
        print(f"case {case}: {len(views)} views compared, {len(differences)} disagreements so far", flush=True)
    print(f"{accepted} views accepted, {len(refused)} refused, {len(differences)} disagreements")
    for reason in refused:
        print("refused:", reason)
    assert not differences, "\n".join(differences)
    assert accepted >= max(1, CASES * VIEWS_PER_TABLE // 2), refused  # refusing most views would prove nothing
