"""The walking skeleton's acceptance scenario: webhooks in, exactly once through Spark, across
kill -9 of every process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for

pytestmark = pytest.mark.e2e


def count(process: HeadraceProcess, sql: str = "SELECT count(*) FROM s") -> int:
    with psycopg.connect(process.dsn, autocommit=True) as conn:
        return int(conn.execute(sql).fetchone()[0])


async def post_all(url: str, keys: list[int], concurrency: int = 16) -> list[int]:
    """POST each key once (the caller repeats keys); returns the statuses in order."""
    semaphore = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as http:
        async def post(key: int) -> int:
            async with semaphore:
                body = json.dumps({"k": f"group-{key % 5}", "n": key})
                async with http.post(url, data=body, headers={"Idempotency-Key": f"key-{key}",
                                                                "Content-Type": "application/json"}) as response:
                    return response.status
        return list(await asyncio.gather(*(post(key) for key in keys)))


def expected_groups(keys: set[int]) -> dict[str, int]:
    groups: dict[str, int] = {}
    for key in keys:
        groups[f"group-{key % 5}"] = groups.get(f"group-{key % 5}", 0) + 1
    return groups


def test_exactly_once_across_kill_9(tmp_path: Path) -> None:
    process = HeadraceProcess(tmp_path / "data")
    process.start()
    try:
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            conn.execute("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS "
                         "IDEMPOTENT (headers->>'idempotency-key')")
        first = list(range(100))
        # each key twice: the second copies race the first ones (partly concurrent)
        statuses = asyncio.run(post_all(process.webhook_url("s"), first + first[::-1]))
        assert statuses == [200] * 200
        wait_for(lambda: count(process) == 100, timeout=90, message="count(*) = 100")

        process.kill9()
        process.start()
        assert count(process) == 100

        second = list(range(100, 150))
        statuses = asyncio.run(post_all(process.webhook_url("s"), first + first[::-1] + second))
        assert statuses == [200] * 250
        wait_for(lambda: count(process) == 150, timeout=90, message="count(*) = 150")
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT body->>'k', count(*) FROM s GROUP BY 1 ORDER BY 1").fetchall()
            assert dict(rows) == expected_groups(set(range(150)))
            keys = conn.execute("SELECT count(DISTINCT idempotency_key) FROM s").fetchone()[0]
            assert keys == 150
        # nothing arrived twice, nothing lost: still 150 once the pipeline is idle
        assert count(process) == 150

        # a clean shutdown (SIGTERM) exits 0, and the next start resumes every object and all data
        process.stop()
        assert process.process is not None and process.process.returncode == 0, process.output()[-2000:]
        process.start()
        assert count(process) == 150
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            assert ("s", "webhook") in conn.execute("SHOW SOURCES").fetchall()
    finally:
        process.stop()


def test_kill_9_mid_ingest_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """kill -9 while requests are in flight and the pipeline is materializing: every request that
    was answered 200 is in the source after restart, and no key is there twice."""
    process = HeadraceProcess(tmp_path / "data")
    process.start()
    acknowledged: set[int] = set()
    try:
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            conn.execute("CREATE SOURCE s FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
        wait_for(lambda: "started s" in process.pipeline_log(), timeout=90, message="pipeline query started")

        async def send_until_killed() -> None:
            async with aiohttp.ClientSession() as http:
                async def post(key: int) -> None:
                    await asyncio.sleep(key * 0.004)
                    try:
                        async with http.post(process.webhook_url("s"), data=json.dumps({"id": key})) as response:
                            if response.status == 200:
                                acknowledged.add(key)
                    except aiohttp.ClientError:
                        pass  # the server died under this request: it was never acknowledged

                async def killer() -> None:
                    while len(acknowledged) < 300:
                        await asyncio.sleep(0.01)
                    process.kill9()

                await asyncio.gather(killer(), *(post(key) for key in range(1000)))

        asyncio.run(send_until_killed())
        assert 300 <= len(acknowledged) < 1000
        process.start()
        wait_for(lambda: count(process) >= len(acknowledged), timeout=120, message="acknowledged keys visible")
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            keys = [int(row[0]) for row in conn.execute("SELECT idempotency_key FROM s").fetchall()]
        assert len(keys) == len(set(keys)), "a key was materialized twice"
        assert acknowledged <= set(keys), f"lost acknowledged keys: {sorted(acknowledged - set(keys))[:10]}"
    finally:
        process.stop()
