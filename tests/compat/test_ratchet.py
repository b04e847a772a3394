"""The ratchet: a few small regression files and headrace's own view cases, differential against a real PostgreSQL
15, must score at least what tests/compat/baseline.json records, so compatibility only goes up. It never skips: no
corpus, no PostgreSQL or a headrace that cannot start fails it. `make compat` runs all 33 files (docs/compat.md).

To keep it short, the set-up creates only the tables these files read, and the view cases' relations are created
first, so Spark's start and the pipeline's pick-up of new relations are paid once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.compat import baseline
from tests.compat.corpus import regress_dir
from tests.compat.regress import FileScore, run_file, setup
from tests.compat.servers import Servers, running_servers
from tests.compat.views import ViewCases, run_view_cases, view_score

pytestmark = pytest.mark.e2e

# files that create no table of their own (so no pipeline wait) and read only these set-up tables
RATCHET_FILES = ("int2", "int4", "int8", "float8", "text", "varchar")
SETUP_TABLES = frozenset({"int2_tbl", "int4_tbl", "int8_tbl", "float8_tbl", "text_tbl", "varchar_tbl"})


@dataclass
class Harness:
    servers: Servers
    regress: Path
    view_cases: ViewCases
    recorded: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    recorded = baseline.load()
    regress = regress_dir()
    with running_servers(Path(tmp_path_factory.mktemp("compat"))) as servers:
        view_cases = ViewCases(servers)
        view_cases.prepare()
        setup(servers, regress, tables=SETUP_TABLES)
        yield Harness(servers, regress, view_cases, recorded)
        view_cases.close()


@pytest.mark.parametrize("name", RATCHET_FILES)
def test_regression_file_scores_at_least_its_baseline(name: str, harness: Harness) -> None:
    score: FileScore = run_file(name, harness.servers, harness.regress)
    assert score.pg_ok > 0, f"PostgreSQL ran nothing of {name}.sql: the harness is broken"
    problem = baseline.regressions(name, score.counts["same"], score.pg_ok, harness.recorded)
    failing = [f"{s['line']}: {s['sql'][:80]!r} {s['verdict']} {s.get('diff', '')[:160]}"
               for s in score.statements if s["verdict"] not in ("same", "error_same", "skipped")]
    assert problem is None, problem + "\nnot equal now:\n" + "\n".join(failing[:40])


def test_view_cases_score_at_least_their_baseline(harness: Harness) -> None:
    results = run_view_cases(harness.view_cases)
    same, checks = view_score(results)
    assert checks > 0
    problem = baseline.regressions(baseline.VIEWS, same, checks, harness.recorded)
    failing = [f"{r['case']} {r['path']} {r['phase']}: {r['verdict']} {r.get('diff', '')[:160]}"
               for r in results if r["verdict"] != "same"]
    assert problem is None, problem + "\nnot equal now:\n" + "\n".join(failing[:40])
