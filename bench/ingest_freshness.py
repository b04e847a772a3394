"""Webhook ingest throughput and freshness (200 -> visible in SELECT), against a real server.

Peer measured in the same run: a no-op aiohttp POST handler (reads the body, answers 200) driven by
the same load generator, i.e. the ceiling of the HTTP stack alone (calibration.md: ~12,700 req/s).
Uses wrk (Debian package) when present, else an aiohttp client.

    .venv/bin/python bench/ingest_freshness.py [--seconds 10] [--connections 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import psycopg
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.server_process import HeadraceProcess, free_port, wait_for  # noqa: E402

WRK_SCRIPT = """
counter = 0
request = function()
  counter = counter + 1
  local key = string.format("%d-%d", math.random(1, 1000000000), counter)
  wrk.headers["Idempotency-Key"] = key
  wrk.headers["Content-Type"] = "application/json"
  return wrk.format("POST", nil, nil, '{"customer":"c42","amount":1200,"currency":"usd","id":"' .. key .. '"}')
end
"""


def run_wrk(url: str, seconds: int, connections: int, workdir: Path) -> tuple[float, str]:
    script = workdir / "post.lua"
    script.write_text(WRK_SCRIPT)
    result = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
                            capture_output=True, text=True, check=True)
    rate = next(float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("Requests/sec"))
    non_2xx = [line for line in result.stdout.splitlines() if "Non-2xx" in line]
    return rate, (non_2xx[0].strip() if non_2xx else "all 2xx")


async def run_python_load(url: str, seconds: int, connections: int) -> tuple[float, str]:
    done = 0
    bad = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as http:
        async def worker(worker_id: int) -> None:
            nonlocal done, bad
            n = 0
            while time.monotonic() < deadline:
                n += 1
                key = f"{worker_id}-{n}-{time.monotonic_ns()}"
                async with http.post(url, data=json.dumps({"id": key, "amount": 1200}),
                                     headers={"Idempotency-Key": key}) as response:
                    await response.read()
                    done += 1
                    bad += response.status != 200
        await asyncio.gather(*(worker(i) for i in range(connections)))
    return done / seconds, f"{bad} non-200"


def load(url: str, seconds: int, connections: int, workdir: Path) -> tuple[float, str, str]:
    if shutil.which("wrk"):
        rate, note = run_wrk(url, seconds, connections, workdir)
        return rate, note, "wrk"
    rate, note = asyncio.run(run_python_load(url, seconds, connections))
    return rate, note, "aiohttp client"


def noop_peer(seconds: int, connections: int, workdir: Path) -> float:
    port = free_port()
    ready = threading.Event()
    stop: asyncio.Event | None = None
    loop_holder: list[asyncio.AbstractEventLoop] = []

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=200)

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        loop_holder.append(asyncio.get_running_loop())
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    ready.wait()
    # The peer runs in a thread of this process; with wrk the load generator is a separate process.
    rate, _, _ = load(f"http://127.0.0.1:{port}/api/webhook/x", seconds, connections, workdir)
    loop_holder[0].call_soon_threadsafe(stop.set)  # type: ignore[union-attr]
    thread.join()
    return rate


def freshness(server: HeadraceProcess, samples: int, interval_s: float) -> list[float]:
    """Send one request every interval; a poller records when each becomes visible."""
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}
    finished = threading.Event()

    def poll() -> None:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            while not finished.is_set():
                value = conn.execute("SELECT max((body->>'seq')::int) FROM fresh").fetchone()[0]
                now = time.monotonic()
                if value is not None:
                    for seq in range(int(value) + 1):
                        seen.setdefault(seq, now)
                time.sleep(0.005)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()

    async def send() -> None:
        async with aiohttp.ClientSession() as http:
            for seq in range(samples):
                async with http.post(server.webhook_url("fresh"), data=json.dumps({"seq": seq}),
                                     headers={"Idempotency-Key": f"fresh-{seq}"}) as response:
                    assert response.status == 200
                    sent[seq] = time.monotonic()
                await asyncio.sleep(interval_s)

    asyncio.run(send())
    wait_for(lambda: len(seen) >= samples, timeout=60, message="all freshness samples visible")
    finished.set()
    poller.join()
    return sorted(seen[seq] - sent[seq] for seq in range(samples))


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(round(fraction * (len(values) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--samples", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        server = HeadraceProcess(workdir / "data")
        server.start()
        try:
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("CREATE SOURCE load FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS "
                             "IDEMPOTENT (headers->>'idempotency-key')")
                conn.execute("CREATE SOURCE fresh FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'seq')")
            time.sleep(15)  # let Spark start its queries so the run measures steady state
            rate, note, tool = load(server.webhook_url("load"), args.seconds, args.connections, workdir)
            peer = noop_peer(args.seconds, args.connections, workdir)
            print(f"ingest ({tool}, {args.connections} connections, {args.seconds}s): "
                  f"{rate:,.0f} req/s durable ({note}); no-op aiohttp peer {peer:,.0f} req/s; ratio {rate / peer:.2f}")
            lags = freshness(server, args.samples, interval_s=0.1)
            print(f"freshness (200 -> visible in SELECT, {args.samples} samples at 10 req/s): "
                  f"p50 {percentile(lags, 0.5) * 1000:.0f} ms, p99 {percentile(lags, 0.99) * 1000:.0f} ms, "
                  f"mean {statistics.mean(lags) * 1000:.0f} ms")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
