"""Issue 18 item 6: a materialization whose commits keep failing is visible within seconds, with its error, in SQL
(headrace_internal.materializations), on /metrics and on /health/ready, and headrace keeps retrying it with backoff
and says so (attempts, next_retry_at), while another source goes on.

The server runs with the error point `HEADRACE_FAILPOINTS=start_commit:error@source_u2` (src/headrace/failpoints.py):
every commit of materialization source_u2 (the second object created on a fresh data directory) fails in the
serving driver before it starts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.test_observability import http_get, metrics, samples
from tests.e2e.webhook_client import post_webhook

pytestmark = pytest.mark.e2e

VISIBLE_WITHIN_S = 5.0


@pytest.mark.timeout(600)  # a Spark start, then retries with backoff; minutes on a loaded 2-core machine
def test_a_failing_materialization_is_visible_within_seconds(tmp_path: Path) -> None:
    server = HeadraceProcess(tmp_path / "data")
    server.start(env={"HEADRACE_FAILPOINTS": "start_commit:error@source_u2"})
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE SOURCE fine FROM WEBHOOK BODY FORMAT JSON")  # u1
            conn.execute("CREATE SOURCE stuck FROM WEBHOOK BODY FORMAT JSON")  # u2: its commits fail
            assert conn.execute("SELECT name, materialization FROM headrace_internal.objects ORDER BY id").fetchall() \
                == [("fine", "source_u1"), ("stuck", "source_u2")]
            # Spark warmed up: the healthy source commits
            assert post_webhook(server.webhook_url("fine"), b'{"n": 1}').status_code == 200
            wait_for(lambda: conn.execute("SELECT count(*) FROM fine").fetchone() == (1,), 240, message="fine's row")
            # the pipeline's status report (every few seconds) may follow the row: until it comes, "starting"
            wait_for(lambda: conn.execute("SELECT state FROM headrace_internal.materializations WHERE name = 'fine'")
                     .fetchone() == ("running",), 30, message="fine running")
            assert post_webhook(server.webhook_url("stuck"), b'{"n": 1}').status_code == 200  # still accepted

            def failed() -> Any:
                return conn.execute("SELECT state, last_error, extract(epoch FROM last_error_at), attempts "
                                    "FROM headrace_internal.materializations WHERE name = 'stuck'").fetchone()

            # (a query that fails to start on a loaded machine is "failed" too: wait for the commit's own error)
            state, error, failed_at, attempts = wait_for(
                lambda: (row := failed())[0] == "failed" and "FailPointError" in (row[1] or "") and row, 120,
                message="stuck failed")  # type: ignore[misc]
            seen_in_sql = time.time()
            assert "FailPointError: fail point start_commit armed for source_u2" in error and attempts >= 1
            assert seen_in_sql - float(failed_at) < VISIBLE_WITHIN_S

            found = metrics(server)
            seen_in_metrics = time.time()
            stuck = {"kind": "source", "schema": "public", "name": "stuck"}
            assert samples(found["headrace_materialization_state"], **stuck, state="failed")[0].value == 1
            assert samples(found["headrace_materialization_failures"], **stuck)[0].value >= 1
            assert samples(found["headrace_materialization_state"], kind="source", name="fine",
                           state="running")[0].value == 1
            assert seen_in_metrics - float(failed_at) < VISIBLE_WITHIN_S

            status, text = http_get(server, "/health/ready")
            seen_in_health = time.time()
            assert status == 503
            body = json.loads(text)
            named = [part for part in body["not_ready"] if part["part"] == "materialization"]
            assert [part["name"] for part in named] == ["public.stuck"]
            assert named[0]["state"] == "failed" and "FailPointError" in named[0]["reason"]
            assert seen_in_health - float(failed_at) < VISIBLE_WITHIN_S

            # headrace keeps retrying with backoff, and says so: the pipeline restarts the query (as it notices
            # at its next batch: keep sending), every retry fails again, attempts grow, next_retry_at is set
            def retried() -> Any:
                post_webhook(server.webhook_url("stuck"), b'{"n": 2}')
                return conn.execute(
                    "SELECT m.attempts, m.restarts, m.next_retry_at IS NOT NULL, s.state, s.failures, "
                    "s.next_retry_at > s.last_error_at FROM headrace_internal.materializations m "
                    "JOIN headrace_internal.source_status s ON s.materialization = m.materialization "
                    "WHERE m.name = 'stuck'").fetchone()

            attempts, restarts, has_retry, query_state, failures, later = wait_for(
                lambda: (row := retried())[0] >= 2 and row[1] >= 1 and row[2] and row, 180,
                interval=1.0, message="retries")  # type: ignore[misc]
            assert query_state == "failing" and failures >= 1 and later
            # the other source is unaffected, and stuck's rows wait in its log (accepted, not lost)
            assert post_webhook(server.webhook_url("fine"), b'{"n": 2}').status_code == 200
            wait_for(lambda: conn.execute("SELECT count(*) FROM fine").fetchone() == (2,), 60, message="fine's 2nd")
            assert conn.execute("SELECT state, lag_bytes > 0 FROM headrace_internal.materializations "
                                "WHERE name = 'stuck'").fetchone() == ("failed", True)
    finally:
        server.stop()
