"""Events/s through a materialized view, and freshness of the view, on a real server.

    .venv/bin/python bench/view_pipeline.py [--events 1000000] [--groups 10000] [--rate 5000] [--seconds 30]
                                            [--modes loop,streaming] [--rounds 1]

Each mode (HEADRACE_PIPELINE_MODE: the batch loop, or a streaming query per source) runs on a fresh server, the
modes one after the other, `--rounds` times; a table of every run ends the output (figures of one run compare).

1. Throughput: a source (BODY FORMAT JSON) and a view over it with GROUP BY over `--groups` groups and 6
   aggregates (count, sum, min, max, avg, bool_or). The server is stopped, `--events` events are appended to
   the source's log with the real log writer, the server is started again; the figure is events / (time
   from the pipeline starting the source's query to the view holding every event: sum(n) = events). The
   source's own rows are materialized in the same transactions, so the figure covers both. Also printed:
   "sustained", the same after the first batch (which carries the JVM's warm-up: class loading, code
   generation, Python workers), and the CPU seconds the server's whole process group (server, pipeline, JVM,
   Python workers) spent meanwhile: events per CPU-second is steadier than wall time on a shared machine.
2. Freshness: `--rate` events/s as NDJSON requests (every 20 ms) for `--seconds`, plus one probe event
   every 100 ms in a group of its own; per probe, the time from its 200 to its group being visible in a
   SELECT of the view. Reports p50 / p99.
Targets (issue 5): >= 50,000 events/s; freshness p50 <= 1 s, p99 <= 3 s. The machine's load average is
printed: the figures are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from headrace.log.segments import SegmentedLog  # noqa: E402
from headrace.webhook.record import WebhookRecord, encode  # noqa: E402
from tests.e2e.server_process import HeadraceProcess, wait_for  # noqa: E402

VIEW = """CREATE MATERIALIZED VIEW per_group AS
SELECT body->>'g' AS g, count(*) AS n, sum((body->>'v')::int) AS total, min((body->>'v')::int) AS lo,
       max((body->>'v')::int) AS hi, avg((body->>'v')::int) AS mean, bool_or((body->>'f')::bool) AS any_f
FROM events GROUP BY body->>'g'"""


def event(n: int, groups: int, rng: random.Random) -> bytes:
    return json.dumps({"g": f"g{n % groups}", "v": rng.randint(-1000, 1000), "f": rng.random() < 0.1},
                      separators=(",", ":")).encode()


def prefill(log_dir: Path, events: int, groups: int) -> None:
    rng = random.Random(7)
    log = SegmentedLog(log_dir)
    now_us = time.time_ns() // 1000
    chunk = 20_000
    for start in range(0, events, chunk):
        log.append([encode(WebhookRecord(now_us, None, None, event(n, groups, rng)))
                    for n in range(start, min(events, start + chunk))])
    log.sync()
    log.close()


def scalar(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        return row[0] if row else None


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU of every live process of a process group, plus what they reaped of exited children."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...; utime/stime/cutime/cstime 11-14
            total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def throughput(process: HeadraceProcess, events: int, groups: int,
               env: dict[str, str]) -> tuple[float, float | None, float]:
    """(events/s from the query's start, events/s after the first batch (None if one batch held all), events per
    CPU-second of the server's process group)."""
    with psycopg.connect(process.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON")
        conn.execute(VIEW)
    process.stop()
    (log_dir,) = [d for d in (process.data_dir / "logs").iterdir() if d.is_dir()]
    started = time.monotonic()
    prefill(log_dir, events, groups)
    print(f"prefilled {events:,} events into the log in {time.monotonic() - started:.1f} s", flush=True)
    pipeline_log = process.data_dir / "pipeline" / "pipeline.log"
    seen = pipeline_log.read_text(errors="replace").count("started events") if pipeline_log.exists() else 0
    process.start(env=env)
    wait_for(lambda: pipeline_log.read_text(errors="replace").count("started events") > seen, timeout=120,
             interval=0.05, message="the pipeline to start the source's query")
    query_started = time.monotonic()
    assert process.process is not None
    cpu_started = group_cpu_seconds(process.process.pid)
    first: list[tuple[float, int]] = []

    def held() -> int:
        n = int(scalar(process.dsn, "SELECT coalesce(sum(n), 0) FROM per_group"))  # type: ignore[arg-type]
        if n and not first:
            first.append((time.monotonic(), n))
        return n

    wait_for(lambda: held() == events, timeout=1800, interval=0.1, message=f"the view to hold {events} events")
    finished = time.monotonic()
    elapsed = finished - query_started
    cpu = group_cpu_seconds(process.process.pid) - cpu_started
    assert scalar(process.dsn, "SELECT count(*) FROM per_group") == min(groups, events)
    assert scalar(process.dsn, "SELECT count(*) FROM events") == events
    first_at, first_events = first[0]
    sustained = (events - first_events) / (finished - first_at) if events > first_events else None
    return events / elapsed, sustained, events / cpu


async def freshness(process: HeadraceProcess, rate: int, seconds: float, groups: int) -> list[float]:
    url = process.webhook_url("events")
    rng = random.Random(11)
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    per_request = max(1, rate // 50)  # a request every 20 ms

    async with aiohttp.ClientSession() as http:
        async def load() -> None:
            next_at = time.monotonic()
            n = 0
            while time.monotonic() < stop:
                payload = b"\n".join(event(n + i, groups, rng) for i in range(per_request))
                n += per_request
                async with http.post(url, data=payload) as response:
                    assert response.status == 200, await response.text()
                next_at += 0.02
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        async def probe(i: int, conn: psycopg.AsyncConnection) -> None:
            async with http.post(url, data=json.dumps({"g": f"probe-{i}", "v": 1, "f": True})) as response:
                assert response.status == 200
            acknowledged = time.monotonic()
            while True:
                row = await (await conn.execute("SELECT n FROM per_group WHERE g = %s", [f"probe-{i}"])).fetchone()
                if row is not None:
                    latencies.append(time.monotonic() - acknowledged)
                    return
                await asyncio.sleep(0.02)

        async def probes() -> None:
            tasks = []
            i = 0
            conns = [await psycopg.AsyncConnection.connect(process.dsn, autocommit=True) for _ in range(8)]
            try:
                while time.monotonic() < stop:
                    tasks.append(asyncio.create_task(probe(i, conns[i % len(conns)])))
                    i += 1
                    await asyncio.sleep(0.1)
                await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
            finally:
                for conn in conns:
                    await conn.close()

        await asyncio.gather(load(), probes())
    return latencies


def run(mode: str, args: argparse.Namespace) -> dict[str, float | None]:
    """One run of both measures on a fresh server in `mode`."""
    env = {"HEADRACE_PIPELINE_MODE": mode}
    print(f"--- mode {mode}; load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="headrace-view-bench-") as scratch:
        process = HeadraceProcess(Path(scratch) / "data")
        process.start(env=env)
        try:
            rate, sustained, per_cpu = throughput(process, args.events, args.groups, env)
            print(f"throughput: {rate:,.0f} events/s through a view of {args.groups:,} groups x 6 aggregates "
                  f"({args.events:,} events; target >= 50,000)", flush=True)
            print(f"  sustained after the first batch: "
                  f"{f'{sustained:,.0f} events/s' if sustained is not None else 'n/a (one batch)'}; "
                  f"{per_cpu:,.0f} events per CPU-second of server + pipeline + JVM (2 cores: at most 2x that)",
                  flush=True)
            latencies = asyncio.run(freshness(process, args.rate, args.seconds, args.groups))
            latencies.sort()
            p50 = statistics.median(latencies)
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            print(f"freshness at {args.rate:,} events/s: p50 {p50 * 1000:,.0f} ms, p99 {p99 * 1000:,.0f} ms "
                  f"({len(latencies)} probes; targets p50 <= 1,000 ms, p99 <= 3,000 ms)", flush=True)
        finally:
            process.stop()
            if args.pipeline_log is not None:
                source = process.data_dir / "pipeline" / "pipeline.log"
                target = args.pipeline_log.with_name(f"{args.pipeline_log.stem}-{mode}{args.pipeline_log.suffix}")
                with target.open("a") as copy:
                    copy.write(source.read_text(errors="replace") if source.exists() else "")
            slow = [line for line in process.pipeline_log().splitlines() if "took" in line or "backfilled" in line]
            print("\n".join(["pipeline's slow batches:", *slow[-8:]]), flush=True)
    load = os.getloadavg()[0]
    print(f"load average after: {os.getloadavg()}", flush=True)
    return {"events/s": rate, "sustained": sustained, "per CPU-s": per_cpu, "p50 ms": p50 * 1000,
            "p99 ms": p99 * 1000, "load": load}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=5_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--modes", default="loop,streaming", help="HEADRACE_PIPELINE_MODE values, run in turn")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pipeline-log", type=Path, help="append the pipeline's log of each mode to this path with "
                        "the mode in its name (with HEADRACE_SLOW_BATCH_S=0 it holds every batch's phases)")
    args = parser.parse_args()
    results = [(round_, mode, run(mode, args)) for round_ in range(1, args.rounds + 1)
               for mode in args.modes.split(",") if mode]
    print("\n| round | mode | events/s | sustained | events per CPU-s | freshness p50 | p99 | load after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for round_, mode, figures in results:
        sustained = figures["sustained"]
        print(f"| {round_} | {mode} | {figures['events/s']:,.0f} | "
              f"{f'{sustained:,.0f}' if sustained is not None else 'n/a'} | {figures['per CPU-s']:,.0f} | "
              f"{figures['p50 ms']:,.0f} ms | {figures['p99 ms']:,.0f} ms | {figures['load']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
