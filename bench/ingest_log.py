"""Micro benchmark: GroupCommitter throughput and latency next to the disk's raw fdatasync rate.

    .venv/bin/python bench/ingest_log.py [--seconds 5] [--appenders 64] [--payload-bytes 300] [--dir PATH]

The raw rate (one writer, write + fdatasync per record) is what a log without group commit could
do on this disk; the group committer's appends/s should be a multiple of it, with batches about
as large as the number of concurrent appenders.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from headrace.log.group_commit import GroupCommitter
from headrace.log.segments import SegmentedLog


class CountingLog(SegmentedLog):
    syncs = 0

    def sync(self) -> None:
        super().sync()
        self.syncs += 1


def raw_fdatasync_rate(directory: Path, seconds: float, payload: bytes) -> float:
    """Serial write + fdatasync of one record at a time: the disk's durable-write rate."""
    fd = os.open(directory / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        count, deadline = 0, time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < deadline:
            os.write(fd, payload)
            os.fdatasync(fd)
            count += 1
        return count / (time.perf_counter() - started)
    finally:
        os.close(fd)


async def group_commit_run(directory: Path, seconds: float, appenders: int, payload: bytes,
                           max_wait_s: float) -> tuple[int, float, list[float], int]:
    log = CountingLog(directory / "log")
    committer = GroupCommitter(log, max_wait_s=max_wait_s)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def appender() -> None:
        while time.perf_counter() < deadline:
            begun = time.perf_counter()
            await committer.append(payload)
            latencies.append(time.perf_counter() - begun)

    started = time.perf_counter()
    await asyncio.gather(*(appender() for _ in range(appenders)))
    elapsed = time.perf_counter() - started
    await committer.close()
    log.close()
    return len(latencies), elapsed, latencies, log.syncs


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--appenders", type=int, default=64)
    parser.add_argument("--payload-bytes", type=int, default=300)
    parser.add_argument("--max-wait-ms", type=float, default=0.0)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir in the cwd)")
    args = parser.parse_args()

    directory = Path(tempfile.mkdtemp(prefix="headrace-bench-", dir=args.dir or Path.cwd()))
    payload = os.urandom(args.payload_bytes // 2).hex().encode()[: args.payload_bytes] or b"x"
    try:
        raw_rate = raw_fdatasync_rate(directory, min(args.seconds, 3.0), payload)
        count, elapsed, latencies, syncs = asyncio.run(
            group_commit_run(directory, args.seconds, args.appenders, payload, args.max_wait_ms / 1000)
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    latencies.sort()
    rate = count / elapsed
    print(f"disk under {directory.parent}, payload {len(payload)} B, {os.cpu_count()} CPUs")
    print(f"raw write+fdatasync, 1 writer     : {raw_rate:10.0f} durable writes/s "
          f"({1000 / raw_rate:.2f} ms each)")
    print(f"GroupCommitter, {args.appenders} appenders"
          f"{f', max_wait {args.max_wait_ms} ms' if args.max_wait_ms else ''}: {rate:10.0f} appends/s "
          f"over {elapsed:.1f} s ({rate / raw_rate:.1f}x raw)")
    print(f"  latency p50 {percentile(latencies, 0.50) * 1000:.2f} ms, p99 {percentile(latencies, 0.99) * 1000:.2f} ms, "
          f"mean {statistics.fmean(latencies) * 1000:.2f} ms")
    print(f"  {syncs} fsyncs, {count / max(syncs, 1):.1f} records per fsync")


if __name__ == "__main__":
    main()
