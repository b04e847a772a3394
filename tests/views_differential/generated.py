"""The generated differential run (issue 22): random tables and views from generator.py, each view compared with the
same SELECT on PostgreSQL 15 after the backfill and after every batch of random INSERT / UPDATE / DELETE.

Run by tests/views_differential/test_generated_views.py (`make test`: one small seed; `make compat-views`: 220 views)
and by `python -m tests.compat` (`make compat`), which prints the figures and puts them in its report."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.views_differential.generator import Generator
from tests.views_differential.oracle import Pair

VIEWS_PER_TABLE = 22  # `make compat`: 10 tables of 22 views
BATCHES = 3


@dataclass
class GeneratedRun:
    seed: int
    cases: int
    views_per_table: int
    batches: int
    accepted: int = 0
    comparisons: int = 0  # views x (backfill + batches)
    refused: list[str] = field(default_factory=list)  # "<sqlstate> <message>: <select>"
    disagreements: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        return (f"generated views: {self.accepted} accepted, {len(self.refused)} refused, "
                f"{len(self.disagreements)} disagreeing ({self.comparisons} comparisons with PostgreSQL 15, "
                f"{self.cases} tables x {self.views_per_table} views, {self.batches} write batches, seed {self.seed}, "
                f"{self.seconds:.0f} s)")

    def report(self) -> dict[str, Any]:
        return asdict(self)


def run_generated(pair: Pair, seed: int, cases: int, views_per_table: int, batches: int,
                  log: Callable[[str], None] = lambda line: print(line, flush=True)) -> GeneratedRun:
    """Each case: a table on both servers, a first batch of writes, the views (a refused one is counted and listed,
    not compared), then `batches` more batches; every accepted view compared after the backfill and each batch."""
    run = GeneratedRun(seed, cases, views_per_table, batches)
    started = time.monotonic()
    for case in range(cases):
        case_seed = seed * 1000 + case
        generator = Generator(case_seed)
        generated = generator.case(f"g{case}", views_per_table)
        pair.headrace.execute(generated.create_table)
        pair.oracle.execute(generated.oracle_create_table)
        for write in generator.writes():  # rows before the views: their backfill is checked too
            pair.both(write.replace("{t}", generated.table))
        views = {}
        for name, select in generated.views.items():
            try:
                pair.headrace.execute(f"CREATE MATERIALIZED VIEW {name} AS {select}")
            except psycopg.Error as error:
                run.refused.append(f"{error.sqlstate} {error.diag.message_primary}: {select}")
                continue
            views[name] = select
        run.accepted += len(views)
        for batch in range(batches + 1):
            if batch > 0:
                for write in generator.writes():
                    pair.both(write.replace("{t}", generated.table))
            for name, select in views.items():
                run.comparisons += 1
                difference = pair.compare(name, select)
                if difference is not None:
                    run.disagreements.append(f"[seed {case_seed}, batch {batch}] {difference}")
                    log(run.disagreements[-1])  # a long run shows them as they come
        for name in views:
            pair.headrace.execute(f"DROP MATERIALIZED VIEW {name}")
        log(f"case {case}: {len(views)} views compared, {len(run.disagreements)} disagreements so far "
            f"({time.monotonic() - started:.0f} s)")
    run.seconds = round(time.monotonic() - started, 1)
    return run


def run_on_new_servers(workdir: Path, seed: int, views: int, batches: int = BATCHES) -> GeneratedRun:
    """`views` generated views (rounded up to whole tables of VIEWS_PER_TABLE) against a new `headrace up` in
    `workdir` and a new database of the shared PostgreSQL 15 test cluster (tests/real_servers/postgres.py)."""
    from tests.e2e.server_process import HeadraceProcess
    from tests.real_servers.postgres import shared_cluster

    workdir.mkdir(parents=True, exist_ok=True)
    process = HeadraceProcess(workdir / "data")
    process.start(timeout=120.0)
    try:
        oracle_url = shared_cluster().create_database(f"generated_views_{os.getpid()}")
        pair = Pair.connect(process.dsn, oracle_url)
        try:
            cases = max(1, -(-views // VIEWS_PER_TABLE))
            return run_generated(pair, seed, cases, min(views, VIEWS_PER_TABLE), batches)
        finally:
            pair.close()
    finally:
        process.stop()
