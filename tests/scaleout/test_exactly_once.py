"""The webhook -> view -> SELECT path, exactly once, through each place the pipeline can run: local[2], a standalone
cluster (spark://, executors that share nothing with headrace's host but the network: they read the logs through the
log read service) and a Spark Connect server (sc://). Duplicates and replacements, a kill -9 of the headrace server
mid-stream (and, on spark://, of one executor; on local, of the pipeline process, while webhooks go on being answered
200 and the loss shows in headrace_internal.pipeline_status and /metrics); every time the view equals its
recomputation over the source and no row is lost or doubled.

The standalone cluster and the Connect server are session fixtures (conftest.py), shared by every test here."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.webhook_client import post_all_acknowledged, post_webhook
from tests.scaleout.clusters import StandaloneCluster

pytestmark = [pytest.mark.e2e, pytest.mark.scaleout]

SOURCE = "CREATE SOURCE ev FROM WEBHOOK BODY FORMAT JSON ARRAY IDEMPOTENT (body->>'id')"
VIEW = """CREATE MATERIALIZED VIEW per_group AS
SELECT body->>'g' AS g, count(*) AS n, sum((body->>'v')::int) AS total FROM ev GROUP BY body->>'g'"""
RECOMPUTED = "SELECT body->>'g', count(*), sum((body->>'v')::int) FROM ev GROUP BY body->>'g'"
# Enough rows in one request for a micro-batch of two partitions (log_source.MIN_RECORDS_PER_PARTITION): on a
# cluster, Spark tasks on the executors read them through the log read service.
LARGE_BATCH = 40_000


def event(event_id: int, generation: int) -> dict[str, Any]:
    return {"id": f"e{event_id}", "g": f"g{(event_id + generation) % 5}", "v": (event_id * 7 + generation) % 50}


def query(process: HeadraceProcess, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(process.dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def settled(process: HeadraceProcess, distinct_ids: int) -> bool:
    try:
        if query(process, "SELECT count(*) FROM ev")[0][0] != distinct_ids:
            return False
        view = sorted(query(process, "SELECT g, n, total FROM per_group"))
        return view == sorted(query(process, RECOMPUTED)) and sum(row[1] for row in view) == distinct_ids
    except psycopg.Error:
        return False


def post_array(process: HeadraceProcess, events: list[dict[str, Any]]) -> int:
    return post_webhook(process.webhook_url("ev"), json.dumps(events).encode(), timeout=60).status_code


def metrics(process: HeadraceProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{process.http_port}/metrics", timeout=10) as response:
        return response.read().decode()


def pipeline_pid(process: HeadraceProcess) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"headrace.pipeline.process" in command and str(process.data_dir).encode() in command:
                return int(entry.name)
    raise AssertionError("no pipeline process")


@pytest.fixture(params=["local", "standalone", "connect"])
def master(request: pytest.FixtureRequest) -> tuple[str, Any]:
    if request.param == "local":
        return "local[2]", None
    cluster = request.getfixturevalue("standalone_cluster" if request.param == "standalone" else "connect_server")
    return cluster.url, cluster


@pytest.mark.timeout(900)  # three Spark starts and two kill -9 per mode; minutes on a loaded 2-core machine
def test_webhook_view_select_exactly_once(master: tuple[str, Any], tmp_path: Path) -> None:
    url, cluster = master
    process = HeadraceProcess(tmp_path / "data", ("--spark-master", url))
    process.start(timeout=300)
    try:
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            conn.execute(SOURCE)
            conn.execute(VIEW)
        # duplicates and replacements (a replacement moves its row to another group)
        assert post_array(process, [event(i, 0) for i in range(300)]) == 200
        assert post_array(process, [event(i, 0) for i in range(100)]) == 200  # exact duplicates
        assert post_array(process, [event(i, 1) for i in range(50, 150)]) == 200  # replacements
        wait_for(lambda: settled(process, 300), timeout=300, message="the view over 300 rows")
        assert query(process, "SELECT spark_master, state FROM headrace_internal.pipeline_status") == \
            [(url, "running")]

        if isinstance(cluster, StandaloneCluster):
            # A large batch, read by the executors' tasks through the log read service; one executor is killed
            # while the stream goes on: Spark reruns its tasks elsewhere, nothing is lost or doubled.
            assert not any(str(process.data_dir) in str(work) for work in cluster.worker_dirs)
            assert post_array(process, [event(i, 2) for i in range(100_000, 100_000 + LARGE_BATCH)]) == 200
            wait_for(lambda: settled(process, 300 + LARGE_BATCH), timeout=300, message="the large batch")
            served = re.findall(r'headrace_log_read_requests_total\{action="records",status="200"\} (\S+)',
                                metrics(process))
            assert served and float(served[0]) >= 2, metrics(process)[-2000:]
            executors = cluster.executor_pids()
            assert executors
            os.kill(executors[0], signal.SIGKILL)
            assert post_array(process, [event(i, 3) for i in range(2_000, 3_000)]) == 200
            expected = 300 + LARGE_BATCH + 1_000
        elif url.startswith("local"):
            # A lost pipeline process: webhooks are still answered 200, and the loss shows in pipeline_status and
            # /metrics until the restarted pipeline catches up.
            os.kill(pipeline_pid(process), signal.SIGKILL)
            assert post_array(process, [event(i, 3) for i in range(2_000, 3_000)]) == 200
            wait_for(lambda: query(process, "SELECT state, restarts, last_error IS NOT NULL FROM "
                                            "headrace_internal.pipeline_status") == [("running", 1, True)],
                     timeout=300, message="the pipeline restarted")
            assert "headrace_pipeline_restarts_total 1.0" in metrics(process)
            expected = 300 + 1_000
        else:
            assert post_array(process, [event(i, 3) for i in range(2_000, 3_000)]) == 200
            expected = 300 + 1_000
        wait_for(lambda: settled(process, expected), timeout=300, message=f"the view over {expected} rows")

        # kill -9 of the server while webhooks stream in; whatever was not acknowledged is sent again
        stream = [event(i, 4) for i in range(200_000, 202_000)]  # ids of their own: new rows
        sent: list[bool] = []
        sender = threading.Thread(target=lambda: sent.extend(
            asyncio.run(post_all_acknowledged(process.webhook_url("ev"), stream))))  # one row each
        sender.start()
        wait_for(lambda: query(process, "SELECT count(*) FROM ev")[0][0] > expected, timeout=60,
                 interval=0.05, message="rows of the stream committed")
        process.kill9()
        sender.join(60)
        process.start(timeout=300)
        resend = [e for e, acknowledged in zip(stream, sent) if not acknowledged] if sent else stream
        assert all(asyncio.run(post_all_acknowledged(process.webhook_url("ev"), resend)))
        assert post_array(process, stream[:100]) == 200  # acknowledged before the kill: deduplicated, not doubled
        expected += len(stream)
        wait_for(lambda: settled(process, expected), timeout=300, message=f"the view over {expected} rows after kill -9")
        assert query(process, "SELECT count(DISTINCT body->>'id') FROM ev")[0][0] == expected
    finally:
        process.stop()
