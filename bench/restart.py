"""A restart of the whole server with 10 webhook sources (each with a GROUP BY materialized view) until it serves
again (issue 16: back to serving in <= 15 s), for each serving store (DuckDB, PostgreSQL), in the same run.

Each run: `headrace up` (embedded store PostgreSQL, so its start is part of the figure), 10 sources and views, 20
events per source, every view caught up; then a clean stop (SIGTERM) and a start, timed from the new process's
start to:
  - up:      the banner is out and `SELECT 1` is answered;
  - serving: every source took a new webhook (200) and every view shows it (the pipeline runs every query again).

    .venv/bin/python bench/restart.py [--sources 10] [--stores duckdb,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.server_process import HeadraceProcess  # noqa: E402


async def post_events(process: HeadraceProcess, sources: int, first: int, count: int) -> None:
    async with aiohttp.ClientSession() as http:
        async def post(source: int, number: int) -> None:
            body = json.dumps({"kind": f"k{number % 3}", "n": number})
            async with http.post(process.webhook_url(f"s{source}"), data=body,
                                 headers={"Content-Type": "application/json"}) as response:
                if response.status != 200:
                    raise RuntimeError(f"POST to s{source}: {response.status} {await response.text()}")
        await asyncio.gather(*(post(source, number) for source in range(sources)
                               for number in range(first, first + count)))


def views_hold(process: HeadraceProcess, sources: int, events: int) -> bool:
    try:
        with psycopg.connect(process.dsn, autocommit=True, connect_timeout=2) as conn:
            for source in range(sources):
                row = conn.execute(f"SELECT coalesce(sum(n), 0) FROM v{source}").fetchone()
                if row is None or int(row[0]) != events:
                    return False
        return True
    except psycopg.Error:
        return False


def wait(predicate: object, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError("not serving in time")


def run(store: str, sources: int) -> tuple[float, float]:
    data = Path(tempfile.mkdtemp(prefix=f"bench-restart-{store}-")) / "data"
    process = HeadraceProcess(data, ("--serving-store", store), embedded_store=True)
    process.start(timeout=120)
    try:
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            for source in range(sources):
                conn.execute(f"CREATE SOURCE s{source} FROM WEBHOOK BODY FORMAT JSON")
                conn.execute(f"CREATE MATERIALIZED VIEW v{source} AS SELECT body->>'kind' AS kind, count(*) AS n "
                             f"FROM s{source} GROUP BY body->>'kind'")
        asyncio.run(post_events(process, sources, 0, 20))
        wait(lambda: views_hold(process, sources, 20), 300)
        process.stop()
        started = time.monotonic()
        process.start(timeout=120)
        up = time.monotonic() - started
        asyncio.run(post_events(process, sources, 20, 1))
        wait(lambda: views_hold(process, sources, 21), 300)
        return up, time.monotonic() - started
    finally:
        process.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=10)
    parser.add_argument("--stores", default="duckdb,postgres")
    args = parser.parse_args()
    print(f"restart with {args.sources} sources and views (issue 16 target: serving again in <= 15 s)")
    for store in args.stores.split(","):
        up, serving = run(store, args.sources)
        print(f"  serving store {store:8}  up {up:5.1f} s   serving (every view shows a new event) {serving:5.1f} s",
              flush=True)


if __name__ == "__main__":
    main()
