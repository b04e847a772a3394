"""`headrace up --store` / HEADRACE_STORE: a store that cannot be used ends `headrace up` with exit 1 and the reason,
whether the URL is malformed (refused before anything starts) or does not connect (found while the rest starts, then
everything started is stopped again)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.server_process import SERVING_ON_POSTGRES, free_port

SRC = Path(__file__).resolve().parents[2] / "src"


def _headrace_up(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headrace.cli", "up", "--data-dir", str(data_dir), "--pg-port", str(free_port()),
         "--http-port", str(free_port()), "--spark-master", "local[1]", *args],
        capture_output=True, text=True, timeout=120, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})})


def test_a_malformed_store_url_is_refused(tmp_path: Path) -> None:
    ran = _headrace_up(tmp_path / "data", "--store", "postgresql://[not a url")
    assert ran.returncode == 1
    assert "--store: not a PostgreSQL URL" in ran.stderr
    assert "headrace is up" not in ran.stdout


def test_a_store_that_does_not_connect_stops_headrace(tmp_path: Path) -> None:
    unreachable = f"postgresql://nobody@127.0.0.1:{free_port()}/nowhere"
    ran = _headrace_up(tmp_path / "data", env={"HEADRACE_STORE": unreachable})
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "the store PostgreSQL is unavailable" in ran.stderr
    assert "headrace is up" not in ran.stdout
    if not SERVING_ON_POSTGRES:  # with the PostgreSQL serving store nothing starts before the store answers
        assert "headrace: shutting down" in ran.stdout  # what had started was stopped in order


def test_a_serving_store_other_than_the_data_directorys_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "serving-store").write_text("duckdb\n")  # as its first start recorded it
    ran = _headrace_up(data_dir, "--serving-store", "postgres")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "keeps its sources', tables' and views' rows in the DuckDB file store.duckdb" in ran.stderr
    assert "headrace is up" not in ran.stdout
