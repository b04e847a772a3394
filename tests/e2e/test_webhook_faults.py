"""The webhook fault test of issue 4: a retrying sender delivers 20,000 events (10% deliberate
duplicates, half of those with a changed body) while the server is killed with kill -9 at least 5
times. Afterwards every event that got a 200 is in the source exactly once with its latest
acknowledged body, and nothing else is."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path

import aiohttp
import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for

pytestmark = pytest.mark.e2e

EVENTS = 18_000
DUPLICATES = 2_000  # 10% of the 20,000 sends
KILLS = 5
SEND_RATE = 700  # events per second at most, so the kills land mid-stream
CONCURRENCY = 32


class RetryingSender:
    """Like Stripe or Segment: retry every non-2xx, connection error and timeout with backoff."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acknowledged: dict[str, int] = {}  # event id -> "v" of its latest acknowledged body
        self.sends = 0
        self.retries = 0

    async def deliver(self, http: aiohttp.ClientSession, event_id: str, version: int) -> None:
        body = json.dumps({"id": event_id, "v": version, "pad": "x" * 40})
        delay = 0.05
        while True:
            self.sends += 1
            try:
                async with http.post(self.url, data=body, headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    if response.status == 200:
                        self.acknowledged[event_id] = version
                        return
                    assert response.status in (429, 503), f"unexpected status {response.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            self.retries += 1
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 1.0)

    async def run(self, chains: list[list[tuple[str, int]]]) -> None:
        semaphore = asyncio.Semaphore(CONCURRENCY)
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as http:
            async def chain_task(index: int, chain: list[tuple[str, int]]) -> None:
                await asyncio.sleep(max(0.0, started + index / SEND_RATE - time.monotonic()))
                async with semaphore:
                    for event_id, version in chain:  # a resend only after the previous send got its 200
                        await self.deliver(http, event_id, version)

            await asyncio.gather(*(chain_task(index, chain) for index, chain in enumerate(chains)))


def event_chains(seed: int = 7) -> list[list[tuple[str, int]]]:
    rng = random.Random(seed)
    chains = [[(f"evt_{n}", 0)] for n in range(EVENTS)]
    for position, n in enumerate(rng.sample(range(EVENTS), DUPLICATES)):
        chains[n].append((f"evt_{n}", 0 if position % 2 == 0 else 1))  # half identical, half changed
    return chains


def test_every_acknowledged_event_exactly_once_across_kill_9(tmp_path: Path) -> None:
    server = HeadraceProcess(tmp_path / "data")
    server.start()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE f FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
    sender = RetryingSender(server.webhook_url("f"))
    kills = 0
    sending = threading.Event()
    sending.set()

    def killer() -> None:
        nonlocal kills
        while kills < KILLS and sending.is_set():
            time.sleep(random.uniform(1.0, 2.5))
            server.kill9()
            kills += 1
            server.start()

    thread = threading.Thread(target=killer, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        asyncio.run(sender.run(event_chains()))
    finally:
        sending.clear()
        thread.join()
    assert kills >= KILLS, f"only {kills} kills happened while sending"
    assert sender.sends >= EVENTS + DUPLICATES

    def rows() -> list[tuple[str, int, int]]:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            return conn.execute("SELECT idempotency_key, (body->>'v')::int, count(*) OVER (PARTITION BY idempotency_key) "
                                "FROM f").fetchall()

    try:
        wait_for(lambda: len(rows()) >= len(sender.acknowledged), timeout=120, message="the pipeline caught up")
        time.sleep(1)
        final = rows()
        assert all(copies == 1 for _, _, copies in final), "an event is in the source twice"
        assert {key: version for key, version, _ in final} == sender.acknowledged
        assert len(sender.acknowledged) == EVENTS
    finally:
        print(f"fault test: {kills} kills, {sender.sends} sends, {sender.retries} retries, "
              f"{time.monotonic() - started:.0f} s")
        server.stop()
