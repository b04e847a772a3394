"""The ratchet: a few small regression files and headrace's own view cases, differential against a real PostgreSQL
15, must score at least what tests/compat/baseline.json records, so compatibility only goes up. It never skips: no
corpus, no PostgreSQL or a headrace that cannot start fails it. `make compat` runs all 33 files (docs/compat.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat import baseline
from tests.compat.corpus import regress_dir
from tests.compat.regress import FileScore, run_file, setup
from tests.compat.servers import Servers, running_servers
from tests.compat.views import run_view_cases, view_score

pytestmark = pytest.mark.e2e

RATCHET_FILES = ("boolean", "char", "varchar", "text", "int2", "int4", "int8", "case")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with running_servers(Path(tmp_path_factory.mktemp("compat"))) as running:
        yield running


@pytest.fixture(scope="module")
def regress(servers: Servers) -> Path:
    path = regress_dir()
    setup(servers, path)
    return path


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict[str, Any]]:
    return baseline.load()


@pytest.mark.parametrize("name", RATCHET_FILES)
def test_regression_file_scores_at_least_its_baseline(name: str, servers: Servers, regress: Path,
                                                      recorded: dict[str, dict[str, Any]]) -> None:
    score: FileScore = run_file(name, servers, regress)
    assert score.pg_ok > 0, f"PostgreSQL ran nothing of {name}.sql: the harness is broken"
    problem = baseline.regressions(name, score.counts["same"], score.pg_ok, recorded)
    failing = [f"{s['line']}: {s['sql'][:80]!r} {s['verdict']} {s.get('diff', '')[:160]}"
               for s in score.statements if s["verdict"] not in ("same", "error_same", "skipped")]
    assert problem is None, problem + "\nnot equal now:\n" + "\n".join(failing[:40])


def test_view_cases_score_at_least_their_baseline(servers: Servers, recorded: dict[str, dict[str, Any]]) -> None:
    results = run_view_cases(servers)
    same, checks = view_score(results)
    assert checks > 0
    problem = baseline.regressions(baseline.VIEWS, same, checks, recorded)
    failing = [f"{r['case']} {r['path']} {r['phase']}: {r['verdict']} {r.get('diff', '')[:160]}"
               for r in results if r["verdict"] != "same"]
    assert problem is None, problem + "\nnot equal now:\n" + "\n".join(failing[:40])
