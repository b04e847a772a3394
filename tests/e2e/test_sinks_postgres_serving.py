"""Sinks on a server whose serving store is PostgreSQL (`headrace up --serving-store postgres`): CREATE SINK over
pgwire reads a view and a source out of the store PostgreSQL (sink/postgres_reads.py) into a POSTGRES target (another
database of the shared test cluster) and a Parquet dataset; each target ends equal to its relation as headrace shows
it, after new rows, updated groups and an IDEMPOTENT replacement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.webhook_client import post_webhook
from tests.real_servers.postgres import new_store_database

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(pg_serving_server: HeadraceProcess) -> HeadraceProcess:
    return pg_serving_server


def post(server: HeadraceProcess, key: str, body: dict[str, Any]) -> None:
    response = post_webhook(server.webhook_url("orders"), json.dumps(body).encode(),
                            {"content-type": "application/json", "idempotency-key": key})
    assert response.status_code == 200


def test_sinks_follow_a_view_and_a_source_out_of_the_postgresql_serving_store(
        server: HeadraceProcess, tmp_path: Path) -> None:
    target = new_store_database("pgsinktarget")
    directory = tmp_path / "orders_lake"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE orders FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADER 'idempotency-key' AS ikey "
                     "IDEMPOTENT (ikey)")
        conn.execute("CREATE MATERIALIZED VIEW per_kind AS SELECT body->>'kind' AS kind, count(*) AS n, "
                     "sum((body->>'amount')::int) AS total FROM orders GROUP BY body->>'kind'")
        for i in range(6):
            post(server, f"o{i}", {"kind": f"k{i % 2}", "amount": i})
        wait_for(lambda: conn.execute("SELECT sum(n) FROM per_kind").fetchone() == (6,), 120,
                 message="the view's first rows")
        conn.execute(f"CREATE CONNECTION analytics TO POSTGRES (URL '{target}')")
        conn.execute("CREATE SINK per_kind_pg FROM per_kind INTO POSTGRES (CONNECTION analytics, TABLE 'per_kind')")
        conn.execute(f"CREATE SINK orders_files FROM orders INTO PARQUET (PATH '{directory}', BUCKETS 2)")

        def view_rows() -> list[tuple[Any, ...]]:
            return conn.execute("SELECT kind, n, total FROM per_kind ORDER BY kind").fetchall()

        def source_rows() -> list[tuple[Any, ...]]:
            return conn.execute("SELECT ikey, body::text FROM orders").fetchall()

        with psycopg.connect(target, autocommit=True) as sink_target:
            def target_rows() -> list[tuple[Any, ...]]:
                return sink_target.execute("SELECT kind, n, total FROM public.per_kind ORDER BY kind").fetchall()

            def dataset_rows() -> list[tuple[Any, ...]]:
                if not directory.exists():
                    return []
                rows = ds.dataset(directory, format="parquet").to_table().to_pylist()
                assert len({row["log_offset"] for row in rows}) == len(rows)  # the key: each offset once
                # Parquet holds the JSON as its text (jsonb's normal form): compared as parsed JSON.
                return sorted((row["ikey"], json.dumps(json.loads(row["body"]), sort_keys=True)) for row in rows)

            def caught_up() -> bool:
                expected = sorted((key, json.dumps(json.loads(body), sort_keys=True)) for key, body in source_rows())
                return target_rows() == view_rows() and dataset_rows() == expected

            wait_for(caught_up, 120, message="the sinks' snapshots")
            assert target_rows() == [("k0", 3, 6), ("k1", 3, 9)]

            post(server, "o6", {"kind": "k2", "amount": 10})  # a new group
            post(server, "o1", {"kind": "k0", "amount": 100})  # a replacement: k1 loses a row, k0 gains one
            # Both requests applied (they may commit in different batches: the new group alone already sums to 7).
            wait_for(lambda: view_rows() == [("k0", 4, 106), ("k1", 2, 8), ("k2", 1, 10)], 120,
                     message="the view's new rows")
            wait_for(caught_up, 120, message="the sinks' changes")
            assert target_rows() == [("k0", 4, 106), ("k1", 2, 8), ("k2", 1, 10)]
            assert ("o1", json.dumps({"amount": 100, "kind": "k0"})) in dataset_rows() and len(dataset_rows()) == 7

        status = conn.execute("SELECT name, state, last_error FROM headrace_internal.sink_status "
                              "ORDER BY name").fetchall()
        assert status == [("orders_files", "running", None), ("per_kind_pg", "running", None)]
