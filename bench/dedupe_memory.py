"""Memory of the idempotency state: the server's RSS with N keys (default 10 million) in the window.

    .venv/bin/python bench/dedupe_memory.py [--keys 10000000] [--requests 20000]

Creates a source on a real server, stops it, fills the source's index with N keys directly through
the real dedupe code (DedupeIndex.record, all within the window), starts the server again on that
data directory and sends traffic (fresh keys and duplicates of filled keys). Reports the server
process's RSS (target < 500 MB) and, separately, the pipeline process's (PySpark driver + JVM).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from headrace.webhook.dedupe import INDEX_FILE, DedupeIndex, KeyEntry, body_hash, key_hash  # noqa: E402
from tests.e2e.server_process import HeadraceProcess  # noqa: E402


def rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0.0  # gone meanwhile (Spark forks short-lived helpers such as chmod)
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def descendants(pid: int) -> list[int]:
    children: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry))
    return children + [grandchild for child in children for grandchild in descendants(child)]


def fill(index_path: Path, keys: int) -> float:
    """Bulk fill through DedupeIndex.record (RocksDB writes, in key-hash order: the sorted runs
    need less compaction). The server reopens the index with its own bounded cache."""
    now_us = time.time_ns() // 1000
    started = time.monotonic()
    digests = np.frombuffer(b"".join(key_hash(f"filled-{n}") for n in range(keys)), dtype=">u8").reshape(-1, 2)
    order = np.lexsort((digests[:, 1], digests[:, 0]))
    raw = digests.tobytes()
    index = DedupeIndex(index_path, cache_bytes=256 << 20)
    digest = body_hash(b'{"filled":true}')
    chunk = 200_000
    for start in range(0, keys, chunk):
        entries = [(raw[16 * int(n):16 * int(n) + 16], KeyEntry(now_us, digest, 0)) for n in order[start:start + chunk]]
        index.record(entries, covered_offset=0)  # the log is empty: the index covers offset 0
    index.close()
    return keys / (time.monotonic() - started)


async def traffic(url: str, requests: int, keys: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    semaphore = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as http:
        async def one(n: int) -> None:
            key = f"filled-{n * 7919 % keys}" if n % 10 == 0 else f"fresh-{n}"  # 10% duplicates of filled keys
            async with semaphore, http.post(url, data=b'{"filled":true}', headers={"Idempotency-Key": key}) as response:
                statuses[response.status] = statuses.get(response.status, 0) + 1

        await asyncio.gather(*(one(n) for n in range(requests)))
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent.parent) as temporary:
        server = HeadraceProcess(Path(temporary) / "data")
        server.start()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE SOURCE mem FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS "
                         "IDEMPOTENT (headers->>'idempotency-key')")
        [log_dir] = [path for path in (server.data_dir / "logs").iterdir() if (path / INDEX_FILE).exists()]
        server.stop()
        rate = fill(log_dir / INDEX_FILE, args.keys)
        size_mb = sum(f.stat().st_size for f in (log_dir / INDEX_FILE).rglob("*") if f.is_file()) / 1e6
        print(f"filled {args.keys:,} keys at {rate:,.0f} keys/s; index files {size_mb:,.0f} MB", flush=True)
        server.start()
        try:
            assert server.process is not None
            time.sleep(10)  # the pipeline starts
            started = time.monotonic()
            statuses = asyncio.run(traffic(server.webhook_url("mem"), args.requests, args.keys))
            elapsed = time.monotonic() - started
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                [(duplicates,)] = conn.execute("SELECT rows_duplicate FROM headrace_internal.webhook_counters "
                                               "WHERE source = 'mem'").fetchall()
            pid = server.process.pid
            pipeline_mb = sum(rss_mb(child) for child in descendants(pid))
            print(f"traffic: {args.requests:,} requests in {elapsed:.1f} s, statuses {statuses}, "
                  f"{duplicates} recognised as duplicates of filled keys", flush=True)
            print(f"server RSS {rss_mb(pid):,.0f} MB (target < 500 MB); pipeline processes (PySpark driver, JVM) "
                  f"{pipeline_mb:,.0f} MB", flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
