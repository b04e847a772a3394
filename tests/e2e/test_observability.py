"""Issue 18 against a running server: the system relations (over pgwire, joined with each other and with the
store's catalog), every /metrics family, and the health endpoints. One shared server (`pg_serving_server`); the
forced failure has a server of its own (tests/e2e/test_observability_failure.py)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.webhook_client import post_webhook

pytestmark = pytest.mark.e2e


def http_get(server: HeadraceProcess, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}{path}", timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metrics(server: HeadraceProcess) -> dict[str, Any]:
    status, text = http_get(server, "/metrics")
    assert status == 200
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(family: Any, **labels: str) -> list[Any]:
    return [sample for sample in family.samples if all(sample.labels.get(k) == v for k, v in labels.items())]


@pytest.fixture(scope="module")
def observed(pg_serving_server: HeadraceProcess, tmp_path_factory: pytest.TempPathFactory) -> HeadraceProcess:
    """A source with a secret in its CHECK, a view over it, a view over that view, an index, a connection whose URL
    is a secret, and a PARQUET sink of the view; webhooks posted (one rejected) and materialized."""
    server = pg_serving_server
    lake = tmp_path_factory.getbasetemp() / "obs_lake"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SECRET obs_token AS 'hunter2-value'")
        conn.execute("CREATE SECRET obs_url AS 'postgresql://nobody@127.0.0.1:1/none'")
        conn.execute("CREATE SOURCE obs_events FROM WEBHOOK BODY FORMAT JSON "
                     "CHECK (WITH (HEADERS, SECRET obs_token) headers->>'x-token' = obs_token)")
        conn.execute("CREATE MATERIALIZED VIEW obs_counts AS SELECT body->>'k' AS k, count(*) AS n "
                     "FROM obs_events GROUP BY body->>'k'")
        conn.execute("CREATE MATERIALIZED VIEW obs_big AS SELECT k, n FROM obs_counts WHERE n > 1")
        conn.execute("CREATE INDEX obs_counts_k ON obs_counts (k)")
        conn.execute("CREATE CONNECTION obs_conn TO POSTGRES (URL = SECRET obs_url)")
        conn.execute(f"CREATE SINK obs_files FROM obs_counts INTO PARQUET (PATH '{lake}')")
        for i in range(5):
            assert post_webhook(server.webhook_url("obs_events"), json.dumps({"k": f"k{i % 2}"}).encode(),
                                {"x-token": "hunter2-value"}).status_code == 200
        assert post_webhook(server.webhook_url("obs_events"), b'{"k": "x"}', {"x-token": "wrong"}).status_code == 400
        wait_for(lambda: conn.execute("SELECT sum(n) FROM obs_counts").fetchone() == (5,), 180,
                 message="the view's rows")
        wait_for(lambda: conn.execute("SELECT state, lag_transactions FROM headrace_internal.materializations "
                                      "WHERE name = 'obs_files'").fetchone() == ("running", 0), 120,
                 message="the sink caught up")
    return server


def test_health_live_and_ready(observed: HeadraceProcess) -> None:
    assert http_get(observed, "/health/live") == (200, '{"status": "live"}')
    status, text = wait_for(lambda: (result := http_get(observed, "/health/ready"))[0] == 200 and result, 60,
                            message="ready")  # type: ignore[misc]
    body = json.loads(text)
    assert body["status"] == "ready" and body["not_ready"] == []
    assert body["parts"]["pipeline"] == "running" and body["parts"]["store"] == "ready"
    assert body["parts"]["materializations"] >= 4


def test_objects_and_their_dependencies(observed: HeadraceProcess) -> None:
    with psycopg.connect(observed.dsn, autocommit=True) as conn:
        kinds = dict(conn.execute("SELECT name, kind FROM headrace_internal.objects WHERE name LIKE 'obs%'").fetchall())
        assert kinds == {"obs_token": "secret", "obs_url": "secret", "obs_events": "source",
                         "obs_counts": "materialized view", "obs_big": "materialized view", "obs_counts_k": "index",
                         "obs_conn": "connection", "obs_files": "sink"}
        definitions = dict(conn.execute("SELECT name, definition FROM headrace_internal.objects "
                                        "WHERE name LIKE 'obs%'").fetchall())
        assert definitions["obs_big"].startswith("CREATE MATERIALIZED VIEW obs_big")
        # secrets, connections and sinks may hold a credential in their statement: never shown
        assert definitions["obs_token"] is None and definitions["obs_conn"] is None and definitions["obs_files"] is None
        assert "hunter2" not in str(conn.execute("SELECT * FROM headrace_internal.objects").fetchall())
        edges = set(conn.execute("SELECT name, referenced_name, referenced_kind FROM "
                                 "headrace_internal.object_dependencies WHERE name LIKE 'obs%'").fetchall())
        assert edges == {("obs_events", "obs_token", "secret"), ("obs_counts", "obs_events", "source"),
                         ("obs_big", "obs_counts", "materialized view"), ("obs_counts_k", "obs_counts",
                                                                         "materialized view"),
                         ("obs_conn", "obs_url", "secret"), ("obs_files", "obs_counts", "materialized view")}
        # joinable with the store's own catalog: a materialized view is a PostgreSQL view there
        assert conn.execute("SELECT c.relkind FROM headrace_internal.objects o JOIN pg_class c "
                            "ON c.relname = o.name WHERE o.name = 'obs_big'").fetchone() == ("v",)


def test_source_counters_and_requests(observed: HeadraceProcess) -> None:
    with psycopg.connect(observed.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT o.kind, c.accepted, c.rejected, c.rejected_invalid_body, c.bytes_received > 0 "
                           "FROM headrace_internal.webhook_counters c JOIN headrace_internal.objects o "
                           "ON o.name = c.source WHERE c.source = 'obs_events'").fetchone()
        assert row == ("source", 5, 1, 1, True)
        statuses = conn.execute("SELECT status, reason FROM headrace_internal.webhook_requests "
                                "WHERE source = 'obs_events' ORDER BY received_at").fetchall()
        assert statuses == [(200, None)] * 5 + [(400, "invalid_body")]
        columns = [c.name for c in conn.execute("SELECT * FROM headrace_internal.webhook_requests LIMIT 0").description]
        assert not {"headers", "body"} & set(columns)  # never a header (signatures) nor a body


def test_materializations(observed: HeadraceProcess) -> None:
    with psycopg.connect(observed.dsn, autocommit=True) as conn:
        rows = {row[0]: row for row in conn.execute(
            "SELECT name, kind, transaction_of, state, transactions > 0, committed_position = log_position, lag_bytes,"
            " lag_seconds, last_commit_at IS NOT NULL, freshness_seconds >= 0, last_error, next_retry_at "
            "FROM headrace_internal.materializations WHERE name LIKE 'obs%'").fetchall()}
        source = conn.execute("SELECT materialization FROM headrace_internal.objects "
                              "WHERE name = 'obs_events'").fetchone()[0]
        for name, kind in (("obs_events", "source"), ("obs_counts", "view"), ("obs_big", "view")):
            assert rows[name] == (name, kind, source, "running", True, True, 0, 0.0, True, True, None, None)
        sink = conn.execute("SELECT kind, state, transactions > 0, lag_transactions, committed_position > 0, "
                            "last_commit_at IS NOT NULL FROM headrace_internal.materializations "
                            "WHERE name = 'obs_files'").fetchone()
        assert sink == ("sink", "running", True, 0, True, True)
        # the pipeline's side: its query for the source and the phases of its last micro-batch
        wait_for(lambda: conn.execute("SELECT rows FROM headrace_internal.source_status "
                                      "WHERE source = 'public.obs_events'").fetchone() == (5,), 10,
                 message="the pipeline's report (once a second) of its batches")
        query = conn.execute("SELECT state, batches >= 1, rows >= 5, last_batch_seconds >= 0, "
                             "last_read_seconds + last_source_rows_seconds + last_views_seconds "
                             "+ last_transaction_seconds FROM headrace_internal.source_status "
                             "WHERE source = 'public.obs_events'").fetchone()
        assert query[:4] == ("running", True, True, True)
        assert query[4] == pytest.approx(conn.execute(
            "SELECT last_batch_seconds FROM headrace_internal.source_status "
            "WHERE source = 'public.obs_events'").fetchone()[0])
        assert conn.execute("SELECT state, spark_master FROM headrace_internal.pipeline_status").fetchone() == \
            ("running", "local[2]")


def test_sessions_and_running_statements(observed: HeadraceProcess) -> None:
    with psycopg.connect(observed.dsn, autocommit=True) as admin:
        admin.execute("CREATE ROLE obs_reader LOGIN")
        admin.execute("GRANT SELECT ON obs_counts TO obs_reader")
    with psycopg.connect(observed.dsn, autocommit=True, application_name="obs-admin") as admin, \
            psycopg.connect(observed.dsn.replace("user=headrace", "user=obs_reader"), autocommit=True) as reader:
        admin.execute("BEGIN")
        admin.execute("SELECT count(*) FROM obs_counts")
        admin_pid = admin.info.backend_pid
        rows = {row[0]: row[1:] for row in reader.execute(
            "SELECT pid, usename, application_name, state, query, statement_kind, xact_start IS NOT NULL "
            "FROM headrace_internal.sessions").fetchall()}
        assert rows[admin_pid] == ("headrace", "obs-admin", "idle in transaction", "<insufficient privilege>",
                                   "select", True)
        own = rows[reader.info.backend_pid]
        assert own[:5] == ("obs_reader", "", "active", "SELECT pid, usename, application_name, state, query, "
                           "statement_kind, xact_start IS NOT NULL FROM headrace_internal.sessions", "select")
        admin.execute("ROLLBACK")
        last = admin.execute("SELECT s.query, a.usename FROM headrace_internal.sessions s LEFT JOIN pg_stat_activity a "
                             f"ON a.pid = s.store_pid WHERE s.pid = {reader.info.backend_pid}").fetchone()
        # a headrace superuser sees every session's statement (pg_read_all_stats in the store, as a superuser in
        # PostgreSQL), and the session's backend in the store's own pg_stat_activity
        assert last[0].startswith("SELECT pid") and last[1] == "obs_reader"
        admin.execute("CREATE SECRET obs_again AS 'do-not-show'")
        assert reader.execute("SELECT query FROM headrace_internal.sessions WHERE pid = %s",
                              [admin_pid]).fetchone() == ("<insufficient privilege>",)
        with psycopg.connect(observed.dsn, autocommit=True) as same_role:  # the same role sees it, the value cut
            assert same_role.execute("SELECT state, query FROM headrace_internal.sessions WHERE pid = %s",
                                     [admin_pid]).fetchone() == ("idle", "CREATE SECRET <redacted>")
        admin.execute("DROP SECRET obs_again")


def test_metric_families(observed: HeadraceProcess) -> None:
    with psycopg.connect(observed.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")  # PostgreSQL's statement, failed on the store
        time.sleep(1.2)  # the pipeline reports once a second
        found = metrics(observed)
    labels = {"kind": "source", "schema": "public", "name": "obs_events"}
    # ingest
    assert samples(found["headrace_webhook_requests_accepted"], source="obs_events")[0].value == 5
    assert samples(found["headrace_webhook_requests_rejected"], source="obs_events", reason="invalid_body")[0].value == 1
    # pipeline micro-batches
    assert found["headrace_pipeline_up"].samples[0].value == 1
    batches = samples(found["headrace_pipeline_batches"], source="public.obs_events")
    assert batches and batches[0].value >= 1
    assert samples(found["headrace_pipeline_batch_rows"], source="public.obs_events")[0].value >= 5
    assert samples(found["headrace_pipeline_batch_seconds"], source="public.obs_events")
    assert {s.labels["phase"] for s in samples(found["headrace_pipeline_batch_phase_seconds"],
                                               source="public.obs_events")} == \
        {"read", "source_rows", "views", "transaction"}
    # materialization transactions, freshness and lag, per binding (and sinks)
    assert samples(found["headrace_materialization_transactions"], **labels)[0].value >= 1
    assert samples(found["headrace_materialization_failures"], **labels)[0].value == 0
    assert samples(found["headrace_materialization_commit_seconds"], **labels)
    assert samples(found["headrace_materialization_freshness_seconds"], **labels)[0].value >= 0
    assert samples(found["headrace_materialization_lag_seconds"], **labels)[0].value == 0
    assert samples(found["headrace_materialization_lag_bytes"], **labels)[0].value == 0
    assert samples(found["headrace_materialization_state"], **labels, state="running")[0].value == 1
    sink = {"kind": "sink", "schema": "public", "name": "obs_files"}
    assert samples(found["headrace_materialization_transactions"], **sink)[0].value >= 1
    assert samples(found["headrace_materialization_lag_transactions"], **sink)[0].value == 0
    # SQL sessions and statement latency
    assert sum(s.value for s in found["headrace_sql_sessions"].samples) >= 0
    select_count = samples(found["headrace_sql_statement_seconds"], kind="select")
    assert [s for s in select_count if s.name.endswith("_count")][0].value > 0
    assert samples(found["headrace_sql_statement_errors"], kind="select")[0].value >= 1
    # the store
    assert found["headrace_store_statements"].samples[0].value > 0
    assert samples(found["headrace_store_errors"], sqlstate_class="22")[0].value >= 1
    assert {s.labels["state"] for s in found["headrace_store_pool_connections"].samples} == {"idle", "in_use"}
    assert found["headrace_store_session_backends"].samples[0].value >= 1
    # low cardinality: no family has a label per request, key or session
    for family in found.values():
        for sample in family.samples:
            assert not {"key", "request", "pid", "session", "query"} & set(sample.labels)
