"""Idempotent webhook ingest end to end (seed 002): duplicates, replacements, concurrent requests
with one key, the window, and the counters in SQL and at /metrics, against a real server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server_process import HeadraceProcess, wait_for

pytestmark = pytest.mark.e2e


def query(server: HeadraceProcess, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def create(server: HeadraceProcess, name: str, extra: str = "") -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SOURCE {name} FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id') {extra}")


async def post(url: str, bodies: list[bytes], concurrency: int = 16) -> list[int]:
    semaphore = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as http:
        async def one(body: bytes) -> int:
            async with semaphore, http.post(url, data=body) as response:
                return response.status
        return list(await asyncio.gather(*(one(body) for body in bodies)))


def send(server: HeadraceProcess, name: str, *bodies: bytes) -> list[int]:
    return asyncio.run(post(server.webhook_url(name), list(bodies)))


def test_duplicates_and_replacements_leave_one_row_per_key(server: HeadraceProcess) -> None:
    create(server, "dupes")
    assert send(server, "dupes", b'{"id": "a", "v": 1}', b'{"id": "b", "v": 1}') == [200, 200]
    wait_for(lambda: query(server, "SELECT count(*) FROM dupes")[0][0] == 2, timeout=60, message="2 rows")
    [(first_arrival,)] = query(server, "SELECT received_at FROM dupes WHERE idempotency_key = 'a'")
    time.sleep(0.05)
    # "a" again with the same body: still one row, with the latest arrival; "b" with a new body: replaced.
    assert send(server, "dupes", b'{"id": "a", "v": 1}', b'{"id": "b", "v": 2}') == [200, 200]
    wait_for(lambda: query(server, "SELECT (body->>'v')::int FROM dupes WHERE idempotency_key = 'b'") == [(2,)],
             timeout=60, message="b replaced")
    wait_for(lambda: query(server, "SELECT received_at FROM dupes WHERE idempotency_key = 'a'")[0][0] > first_arrival,
             timeout=60, message="a's received_at moved")
    assert query(server, "SELECT idempotency_key, count(*) FROM dupes GROUP BY 1 ORDER BY 1") == [("a", 1), ("b", 1)]


def test_the_same_key_concurrently_makes_one_row_and_every_request_gets_200(server: HeadraceProcess) -> None:
    create(server, "racing")
    bodies = [b'{"id": "k%d", "attempt": %d}' % (key, attempt) for attempt in range(8) for key in range(50)]
    assert send(server, "racing", *bodies) == [200] * len(bodies)
    wait_for(lambda: query(server, "SELECT count(*) FROM racing")[0][0] == 50, timeout=60, message="50 rows")
    time.sleep(1)  # nothing else arrives later
    assert query(server, "SELECT count(*), count(DISTINCT idempotency_key) FROM racing") == [(50, 50)]


def test_a_key_after_its_window_is_new_again(server: HeadraceProcess) -> None:
    create(server, "windowed", "WINDOW '2 seconds'")
    assert send(server, "windowed", b'{"id": "w"}', b'{"id": "w"}') == [200, 200]
    wait_for(lambda: query(server, "SELECT count(*) FROM windowed")[0][0] == 1, timeout=60, message="1 row")
    time.sleep(2.5)
    assert send(server, "windowed", b'{"id": "w"}') == [200]
    # Past the window the key is forgotten: the seed guarantees idempotency within the window only.
    wait_for(lambda: query(server, "SELECT count(*) FROM windowed")[0][0] == 2, timeout=60, message="2 rows")


def test_counters_and_request_log_in_sql_and_at_metrics(server: HeadraceProcess) -> None:
    create(server, "counted")
    statuses = send(server, "counted", b'{"id": 1}', b'{"id": 1}', b'{"id": 1, "x": 2}', b"{nope")
    assert statuses == [200, 200, 200, 400]
    [row] = query(server, "SELECT received, accepted, rejected, rejected_invalid_body, rows_new, rows_duplicate, "
                          "rows_replaced, bytes_received > 0, ack_count "
                          "FROM headrace_internal.webhook_counters WHERE source = 'counted'")
    assert row == (4, 3, 1, 1, 1, 1, 1, True, 3)
    log = query(server, "SELECT status, reason, size_bytes FROM headrace_internal.webhook_requests "
                        "WHERE source = 'counted' ORDER BY received_at")
    assert sorted(log, key=str) == sorted([(200, None, 9), (200, None, 9), (200, None, 17), (400, "invalid_body", 5)],
                                          key=str)

    async def scrape() -> str:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{server.http_port}/metrics") as r:
            assert r.status == 200
            return await r.text()

    samples = {sample.name: sample.value for family in text_string_to_metric_families(asyncio.run(scrape()))
               for sample in family.samples if sample.labels.get("source") == "counted" and "reason" not in sample.labels}
    assert samples["headrace_webhook_requests_received_total"] == 4
    assert samples["headrace_webhook_rows_replaced_total"] == 1
