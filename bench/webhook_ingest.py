"""Webhook ingest: durable requests/s and ack latency, with two peers measured the same way in the same run.

    .venv/bin/python bench/webhook_ingest.py [--seconds 10] [--connections 32] [--latency-seconds 10]

Three receivers, each its own process on this machine, each driven by the same load generators:
- headrace (`headrace up`, a source with IDEMPOTENT on the Idempotency-Key header; its Spark pipeline runs);
- the ceiling: a no-op aiohttp POST handler (reads the body, answers 200);
- the PostgreSQL peer: aiohttp + asyncpg doing INSERT ... ON CONFLICT DO NOTHING per request into a
  PostgreSQL 15 started here (throwaway cluster in a temp dir, as the postgres user, synchronous_commit on).
Throughput: wrk -t1 (Lua script: a fresh Idempotency-Key per request, ~100-byte JSON). Latency: an
open-loop asyncio client at half of each receiver's measured maximum (wrk2 is not packaged), latency
counted from each request's scheduled send time so a stall is not hidden (no coordinated omission).
Also prints freshness (200 -> visible in SELECT) for headrace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.server_process import HeadraceProcess, free_port, wait_for  # noqa: E402

WRK_SCRIPT = """
counter = 0
request = function()
  counter = counter + 1
  local key = string.format("%d-%d", math.random(1, 1000000000), counter)
  wrk.headers["Idempotency-Key"] = key
  wrk.headers["Content-Type"] = "application/json"
  return wrk.format("POST", nil, nil, '{"customer":"c42","amount":1200,"currency":"usd","status":"paid","id":"' .. key .. '"}')
end
"""

PEER_SOURCE = r'''
import asyncio, sys
from aiohttp import web
mode, port = sys.argv[1], int(sys.argv[2])
# The default asyncio loop, as headrace's server uses: both sides measured the same way.
async def noop(request):
    await request.read()
    return web.Response(status=200)

async def main():
    app = web.Application()
    if mode == "noop":
        app.router.add_post("/{tail:.*}", noop)
    else:
        import asyncpg
        pool = await asyncpg.create_pool(sys.argv[3], min_size=8, max_size=32)
        async def insert(request):
            body = await request.read()
            await pool.execute("INSERT INTO events (key, received_at, body) VALUES ($1, now(), $2) "
                               "ON CONFLICT DO NOTHING", request.headers.get("Idempotency-Key"), body.decode())
            return web.Response(status=200)
        app.router.add_post("/{tail:.*}", insert)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
'''


def run_wrk(url: str, seconds: int, connections: int, workdir: Path) -> tuple[float, str]:
    script = workdir / "post.lua"
    script.write_text(WRK_SCRIPT)
    result = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
                            capture_output=True, text=True, check=True)
    rate = next(float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("Requests/sec"))
    non_2xx = [line.strip() for line in result.stdout.splitlines() if "Non-2xx" in line or "Socket errors" in line]
    return rate, "; ".join(non_2xx) or "all 2xx"


async def fixed_rate(url: str, rate: float, seconds: float, connections: int = 64) -> tuple[list[float], int]:
    """Open loop: request i is due at start + i/rate; its latency counts from then."""
    latencies: list[float] = []
    failures = 0
    total = int(rate * seconds)
    body_template = '{"customer":"c42","amount":1200,"currency":"usd","status":"paid","id":"%s"}'
    prefix = os.urandom(4).hex()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as http:
        start = time.perf_counter() + 0.1

        async def one(index: int) -> None:
            nonlocal failures
            due = start + index / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            key = f"{prefix}-{index}"
            async with http.post(url, data=body_template % key, headers={"Idempotency-Key": key,
                                                                         "Content-Type": "application/json"}) as response:
                await response.read()
                if response.status != 200:
                    failures += 1
            latencies.append(time.perf_counter() - due)

        await asyncio.gather(*(one(index) for index in range(total)))
    latencies.sort()
    return latencies, failures


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(round(fraction * (len(values) - 1))))]


def latency_run(url: str, rate: float, seconds: float) -> str:
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    latencies, failures = runner(fixed_rate(url, rate, seconds))
    return (f"at {rate:,.0f} req/s: p50 {percentile(latencies, 0.5) * 1000:.2f} ms, "
            f"p99 {percentile(latencies, 0.99) * 1000:.2f} ms ({failures} non-200)")


class Peer:
    def __init__(self, mode: str, *extra: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen([sys.executable, "-c", PEER_SOURCE, mode, str(self.port), *extra],
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"peer {mode} did not start")
        self.url = f"http://127.0.0.1:{self.port}/api/webhook/headrace/public/load"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


class Postgres:
    """A throwaway PostgreSQL 15 cluster owned by the postgres user."""

    def __init__(self, workdir: Path) -> None:
        bindir = Path("/usr/lib/postgresql/15/bin")
        workdir.mkdir(parents=True)
        os.chmod(workdir.parent, 0o711)  # the postgres user must reach its data directory
        self.datadir = workdir / "pg"
        self.datadir.mkdir()
        shutil.chown(workdir, "postgres")
        shutil.chown(self.datadir, "postgres")
        self.port = free_port()
        as_postgres = ["runuser", "-u", "postgres", "--"]
        subprocess.run([*as_postgres, str(bindir / "initdb"), "-D", str(self.datadir), "-A", "trust", "-U", "postgres"],
                       check=True, capture_output=True)
        subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(self.datadir), "-w", "-l",
                        str(self.datadir / "log"), "-o", f"-p {self.port} -k {self.datadir} -c max_connections=100",
                        "start"], check=True, capture_output=True)
        self._stop = [*as_postgres, str(bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "stop"]
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE events (key text PRIMARY KEY, received_at timestamptz, body text)")

    def stop(self) -> None:
        subprocess.run(self._stop, check=False, capture_output=True)


def freshness(server: HeadraceProcess, samples: int) -> str:
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}

    async def send() -> None:
        async with aiohttp.ClientSession() as http:
            for seq in range(samples):
                async with http.post(server.webhook_url("fresh"), data=json.dumps({"seq": seq})) as response:
                    assert response.status == 200
                    sent[seq] = time.monotonic()
                await asyncio.sleep(0.1)

    import threading

    done = threading.Event()

    def poll() -> None:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            while not done.is_set():
                value = conn.execute("SELECT max((body->>'seq')::int) FROM fresh").fetchone()[0]
                now = time.monotonic()
                if value is not None:
                    for seq in range(int(value) + 1):
                        seen.setdefault(seq, now)
                time.sleep(0.005)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    asyncio.run(send())
    wait_for(lambda: len(seen) >= samples, timeout=60, message="freshness samples visible")
    done.set()
    poller.join()
    lags = sorted(seen[seq] - sent[seq] for seq in range(samples))
    return f"p50 {percentile(lags, 0.5) * 1000:.0f} ms, p99 {percentile(lags, 0.99) * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--latency-seconds", type=float, default=10)
    parser.add_argument("--freshness-samples", type=int, default=50)
    parser.add_argument("--warmup", type=float, default=15, help="seconds for Spark to start its queries")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        results: dict[str, float] = {}
        server = HeadraceProcess(workdir / "data")
        server.start()
        try:
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("CREATE SOURCE load FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS "
                             "IDEMPOTENT (headers->>'idempotency-key')")
                conn.execute("CREATE SOURCE fresh FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'seq')")
            time.sleep(args.warmup)
            rate, note = run_wrk(server.webhook_url("load"), args.seconds, args.connections, workdir)
            results["headrace"] = rate
            print(f"headrace       {rate:9,.0f} req/s durable ({note})", flush=True)
            print(f"  latency {latency_run(server.webhook_url('load'), rate / 2, args.latency_seconds)}", flush=True)
            print(f"  freshness (200 -> visible in SELECT, 10 req/s): {freshness(server, args.freshness_samples)}",
                  flush=True)
        finally:
            server.stop()

        noop = Peer("noop")
        try:
            rate, note = run_wrk(noop.url, args.seconds, args.connections, workdir)
            results["noop"] = rate
            print(f"no-op aiohttp  {rate:9,.0f} req/s ({note})", flush=True)
            print(f"  latency {latency_run(noop.url, rate / 2, args.latency_seconds)}", flush=True)
        finally:
            noop.stop()

        postgres = Postgres(workdir / "pgroot")
        try:
            peer = Peer("pg", postgres.dsn)
            try:
                rate, note = run_wrk(peer.url, args.seconds, args.connections, workdir)
                results["postgres"] = rate
                print(f"aiohttp+asyncpg {rate:8,.0f} req/s durable, INSERT ... ON CONFLICT DO NOTHING ({note})",
                      flush=True)
                print(f"  latency {latency_run(peer.url, rate / 2, args.latency_seconds)}", flush=True)
            finally:
                peer.stop()
        finally:
            postgres.stop()
        print(f"headrace / no-op ceiling: {results['headrace'] / results['noop']:.2f} (target >= 0.60); "
              f"headrace / PostgreSQL receiver: {results['headrace'] / results['postgres']:.2f} (target >= 3)")


if __name__ == "__main__":
    main()
