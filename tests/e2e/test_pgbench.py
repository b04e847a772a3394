"""pgbench (PostgreSQL 15's, a libpq client with its own protocol handling) runs a custom point-SELECT
script against a real server in each query mode, with no failed transaction; the lookups go through an
index (CREATE INDEX: the fast path) as the benchmark's do."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e

ROWS = 20


@pytest.fixture(scope="module")
def point_rows(server: HeadraceProcess) -> str:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE pgbench_kv FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'k')")
    # Rows are posted but not awaited: pgbench checks the protocol, not freshness.
    for k in range(1, ROWS + 1):
        request = urllib.request.Request(server.webhook_url("pgbench_kv"), method="POST",
                                         data=json.dumps({"k": k, "v": f"value-{k}"}).encode())
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE INDEX pgbench_kv_key ON pgbench_kv (idempotency_key)")
    return "pgbench_kv"


@pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench (postgresql-client) is not installed")
@pytest.mark.parametrize("mode", ["simple", "extended", "prepared"])
def test_pgbench_point_select(server: HeadraceProcess, point_rows: str, mode: str, tmp_path: Path) -> None:
    script = tmp_path / "point.sql"
    script.write_text(f"\\set k random(1, {ROWS})\n"
                      f"SELECT body->>'v' FROM {point_rows} WHERE idempotency_key = :k::text;\n"
                      "SELECT :k::int AS k, 'value-' || :k::text AS v;\n")
    result = subprocess.run(
        ["pgbench", "-n", "-c", "2", "-j", "1", "-T", "2", "-M", mode, "-f", str(script),
         "-h", "127.0.0.1", "-p", str(server.pg_port), "-U", "headrace", "headrace"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    processed = re.search(r"number of transactions actually processed: (\d+)", result.stdout)
    failed = re.search(r"number of failed transactions: (\d+)", result.stdout)
    assert processed is not None and int(processed.group(1)) > 0, result.stdout
    assert failed is not None and int(failed.group(1)) == 0, result.stdout
