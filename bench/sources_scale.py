"""Many sources, one pipeline (issue 17, item 4): what N webhook sources, each with one GROUP BY materialized view,
cost at rest and how fresh they are under load, for N = 1, 10, 100, 300 by default.

Each N runs on a fresh `headrace up` (embedded store PostgreSQL, local[2]):
  - create:      N sources and views created, one event POSTed to each; seconds until every view shows its event
                 (the issue's "70 s from the first POSTs to the first rows visible" at 10 sources);
  - first row:   then, on the running pipeline, one more source and view: seconds from its CREATE SOURCE to its
                 first event visible in its view (target <= 5 s);
  - idle:        CPU (cores) over --idle-seconds with nothing arriving, and RSS, of every process of headrace: the
                 server, the pipeline process, Spark's JVM and Python workers, the embedded store PostgreSQL and its
                 backends (targets at 100 sources: <= 0.1 core, <= 1.5 GB);
  - freshness:   --rate events/s spread evenly over the sources for --seconds, plus a probe event every 100 ms to a
                 source in turn: from its 200 to its row in the view, p50/p99 (targets at 100: <= 1 s, <= 3 s);
  - restart (with --restart-sources, 10 by default, run once): a clean stop and a start of the whole server, seconds
                 from the start to every view answering a SELECT with an event POSTed after the start (issue 16:
                 <= 15 s).

    .venv/bin/python bench/sources_scale.py [--sources 1,10,100,300] [--mode loop|streaming] [--src DIR]

`--mode streaming` runs the previous model (one Structured Streaming query per source, HEADRACE_PIPELINE_MODE);
`--src DIR` runs another checkout's code (e.g. /work/main/src): the figures of both, measured the same way."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from headrace.store.postgres_cluster import postmaster_pid  # noqa: E402
from tests.e2e.server_process import HeadraceProcess  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def headrace_pids(process: HeadraceProcess) -> list[int]:
    """The server's process group (server, pipeline, JVM, Python workers) and the embedded store's postmaster with
    its children (pg_ctl detaches it from the group)."""
    assert process.process is not None
    group = process.process.pid
    postmaster = postmaster_pid(process.store_datadir)
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            # fields after the name: state, ppid, pgrp, ...
            if int(fields[2]) == group or int(entry.name) == postmaster or int(fields[1]) == postmaster:
                pids.append(int(entry.name))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            total += sum(int(f) for f in fields[11:13])  # utime, stime
    return total / TICK


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except OSError:
            pass
    return total


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def create(conn: psycopg.Connection, number: int) -> None:
    conn.execute(f"CREATE SOURCE s{number} FROM WEBHOOK BODY FORMAT JSON")
    conn.execute(f"CREATE MATERIALIZED VIEW v{number} AS SELECT body->>'g' AS g, count(*) AS n FROM s{number} "
                 f"GROUP BY body->>'g'")


def views_show(process: HeadraceProcess, numbers: list[int], group: str) -> bool:
    try:
        with psycopg.connect(process.dsn, autocommit=True, connect_timeout=2) as conn:
            return all(conn.execute(f"SELECT 1 FROM v{n} WHERE g = %s", [group]).fetchone() is not None
                       for n in numbers)
    except psycopg.Error:
        return False


async def post_each(process: HeadraceProcess, numbers: list[int], group: str) -> None:
    async with aiohttp.ClientSession() as http:
        async def post(number: int) -> None:
            async with http.post(process.webhook_url(f"s{number}"), data=json.dumps({"g": group})) as response:
                if response.status != 200:
                    raise RuntimeError(f"POST to s{number}: {response.status} {await response.text()}")
        await asyncio.gather(*(post(n) for n in numbers))


async def freshness(process: HeadraceProcess, sources: int, rate: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    tick = 0.2
    per_tick = max(1, int(rate * tick))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        async def post(number: int, body: bytes) -> None:
            async with http.post(process.webhook_url(f"s{number}"), data=body) as response:
                assert response.status == 200, await response.text()

        async def load() -> None:
            next_at, n = time.monotonic(), 0
            while time.monotonic() < stop:
                per_source: dict[int, list[bytes]] = {}
                for i in range(per_tick):  # spread evenly: one NDJSON request per source with events this tick
                    per_source.setdefault((n + i) % sources, []).append(json.dumps({"g": f"g{(n + i) % 7}"}).encode())
                n += per_tick
                await asyncio.gather(*(post(number, b"\n".join(rows)) for number, rows in per_source.items()))
                next_at += tick
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        async def probe(i: int, conn: psycopg.AsyncConnection) -> None:
            number = i % sources
            await post(number, json.dumps({"g": f"probe-{i}"}).encode())
            acknowledged = time.monotonic()
            while True:
                cursor = await conn.execute(f"SELECT n FROM v{number} WHERE g = %s", [f"probe-{i}"])
                if await cursor.fetchone() is not None:
                    latencies.append(time.monotonic() - acknowledged)
                    return
                await asyncio.sleep(0.02)

        async def probes() -> None:
            conns = [await psycopg.AsyncConnection.connect(process.dsn, autocommit=True) for _ in range(8)]
            tasks, i = [], 0
            try:
                while time.monotonic() < stop:
                    tasks.append(asyncio.create_task(probe(i, conns[i % len(conns)])))
                    i += 1
                    await asyncio.sleep(0.1)
                await asyncio.wait_for(asyncio.gather(*tasks), timeout=180)
            finally:
                for conn in conns:
                    await conn.close()

        await asyncio.gather(load(), probes())
    return latencies


def start(data: Path, env: dict[str, str]) -> HeadraceProcess:
    process = HeadraceProcess(data, embedded_store=True)
    process.start(timeout=300, env=env)
    return process


def run(sources: int, env: dict[str, str], args: argparse.Namespace) -> None:
    process = start(Path(tempfile.mkdtemp(prefix=f"bench-sources-{sources}-")) / "data", env)
    numbers = list(range(sources))
    try:
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            created_at = time.monotonic()
            for number in numbers:
                create(conn, number)
            created = time.monotonic() - created_at
        posted_at = time.monotonic()
        asyncio.run(post_each(process, numbers, "first"))
        wait(lambda: views_show(process, numbers, "first"), 1800, "every view's first row")
        first_rows = time.monotonic() - posted_at
        print(f"{sources:4d} sources: created in {created:6.1f} s; first POSTs to every view showing them "
              f"{first_rows:6.1f} s", flush=True)

        probe = sources
        started = time.monotonic()
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            create(conn, probe)
        asyncio.run(post_each(process, [probe], "new"))
        wait(lambda: views_show(process, [probe], "new"), 600, "the new source's first row")
        print(f"{'':15}one more source on the running pipeline: CREATE to its first row {time.monotonic() - started:5.1f} s "
              f"(target <= 5 s)", flush=True)

        time.sleep(args.settle_seconds)
        pids = headrace_pids(process)
        before = cpu_seconds(pids)
        time.sleep(args.idle_seconds)
        pids_after = headrace_pids(process)
        cores = (cpu_seconds([p for p in pids if p in pids_after]) - before) / args.idle_seconds
        rss = rss_bytes(pids_after)
        print(f"{'':15}idle: {cores:.3f} cores over {args.idle_seconds:.0f} s, RSS {rss / 2**30:.2f} GB in "
              f"{len(pids_after)} processes (targets at 100: <= 0.1 core, <= 1.5 GB)", flush=True)

        latencies = sorted(asyncio.run(freshness(process, sources + 1, args.rate, args.seconds)))
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(f"{'':15}freshness at {args.rate:,} events/s over {sources + 1} sources: p50 {p50 * 1000:,.0f} ms, "
              f"p99 {p99 * 1000:,.0f} ms ({len(latencies)} probes; targets at 100: <= 1,000 ms, <= 3,000 ms)",
              flush=True)
    finally:
        process.stop()


def restart(sources: int, env: dict[str, str]) -> None:
    process = start(Path(tempfile.mkdtemp(prefix="bench-sources-restart-")) / "data", env)
    numbers = list(range(sources))
    try:
        with psycopg.connect(process.dsn, autocommit=True) as conn:
            for number in numbers:
                create(conn, number)
        asyncio.run(post_each(process, numbers, "before"))
        wait(lambda: views_show(process, numbers, "before"), 1800, "every view before the restart")
        process.stop()
        started = time.monotonic()
        process.start(timeout=300, env=env)
        up = time.monotonic() - started
        asyncio.run(post_each(process, numbers, "after"))
        wait(lambda: views_show(process, numbers, "after"), 600, "every view after the restart")
        print(f"restart with {sources} sources: up {up:.1f} s, back to serving (every view shows an event POSTed "
              f"after the start) {time.monotonic() - started:.1f} s (issue 16: <= 15 s)", flush=True)
    finally:
        process.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", default="1,10,100,300")
    parser.add_argument("--mode", choices=("loop", "streaming"), default="loop")
    parser.add_argument("--src", type=Path, help="run this checkout's src/ instead (PYTHONPATH)")
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--restart-sources", type=int, default=10, help="0: no restart run")
    args = parser.parse_args()
    env = {"HEADRACE_PIPELINE_MODE": args.mode}
    if args.src is not None:
        env["PYTHONPATH"] = str(args.src.resolve())
    print(f"sources_scale: mode {args.mode}, code {args.src or 'this checkout'}, load average {os.getloadavg()}",
          flush=True)
    for sources in (int(n) for n in args.sources.split(",") if n):
        run(sources, env, args)
    if args.restart_sources:
        restart(args.restart_sources, env)
    print(f"load average after: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
