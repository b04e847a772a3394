"""Dev harness: CPU per durable webhook request of the HTTP front + ingest path alone (no Spark, no
coordinator): the same source and load as bench/webhook_ingest.py, for before/after comparisons.

    .venv/bin/python bench/webhook_cpu.py [--seconds 5] [--connections 32] [--profile out.prof]
        [--latency-rate R] [--latency-seconds 10] [--trace trace.json] [--loop uvloop|asyncio]

The server runs in a child process (uvloop, as `headrace up`; --loop asyncio for the stdlib loop);
wrk drives it; the figure is the child's user+system CPU (all threads: event loop, group commit,
dedupe flusher) divided by the requests wrk completed, and per thread with its context switches.
Then an open-loop latency run at half the measured rate (or --latency-rate); with --trace, where
the slowest acknowledgements of that run spent their time (per request timestamps through the
group commit), and always the garbage collector's passes (each stalls the event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.webhook_ingest import CpuMeter, latency_run, load_average, run_wrk  # noqa: E402

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, tuple[float, float, int, int]]:
    """(user, system) CPU seconds and (voluntary, involuntary) context switches per thread of a
    process, by "name/tid" (the loop is the pid's)."""
    result: dict[str, tuple[float, float, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines()
                          if ":\t" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue
        label = "loop" if task.name == str(pid) else f"{name}/{task.name}"
        result[label] = (int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS,
                         int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))
    return result


_TRACE: list[tuple[float, float, float, float, float, float]] = []  # per request, see _install_trace


def _install_trace(path: str) -> None:
    """Timestamps per request (perf_counter s), to find where a slow ack waits: its head parsed, the
    writer took its batch, the batch's fsync returned, the writer posted the batch's wake-up to the
    event loop (after recording it in the idempotency index), the loop ran it, and it ended (every
    200 of the batch written). Dumped to `path` as JSON at exit."""
    import threading

    from headrace.log import group_commit
    from headrace.log.segments import SegmentedLog

    local = threading.local()
    commit, sync, resolve = group_commit.GroupCommitter._commit, SegmentedLog.sync, group_commit._resolve

    def traced_commit(self: group_commit.GroupCommitter, batch: list) -> None:  # type: ignore[type-arg]
        local.taken = time.perf_counter()
        commit(self, batch)

    def traced_sync(self: SegmentedLog) -> None:
        sync(self)
        local.synced = time.perf_counter()

    def traced_resolve(batch: list, offsets: list[int] | None, failure: str | None,  # type: ignore[type-arg]
                       taken: float = 0.0, synced: float = 0.0, posted: float = 0.0) -> None:
        woken = time.perf_counter()
        resolve(batch, offsets, failure)
        answered = time.perf_counter()
        for _, waiter in batch:
            if hasattr(waiter, "args"):  # the fast path's partial(_durable, slot, ingestor, at, size, started)
                _TRACE.append((waiter.args[4], taken, synced, posted, woken, answered))

    def traced_settle(self: group_commit.GroupCommitter, batch: list,  # type: ignore[type-arg]
                      offsets: list[int] | None, failure: str | None) -> None:
        self._call_in_loop(traced_resolve, batch, offsets, failure, getattr(local, "taken", 0.0),
                           getattr(local, "synced", 0.0), time.perf_counter())

    group_commit.GroupCommitter._commit = traced_commit  # type: ignore[method-assign]
    group_commit.GroupCommitter._settle = traced_settle  # type: ignore[method-assign]
    SegmentedLog.sync = traced_sync  # type: ignore[method-assign]

    import atexit
    import json

    atexit.register(lambda: Path(path).write_text(json.dumps(_TRACE)))


def summarize_trace(path: str, since: float) -> None:
    """Server-side ack latency of the latency run's requests (from `since` on) and, for the
    slowest 1%, where their time went."""
    import json

    requests = sorted((r for r in json.loads(Path(path).read_text()) if r[0] >= since), key=lambda r: r[5] - r[0])
    if not requests:
        return

    def at(fraction: float) -> float:
        request = requests[min(len(requests) - 1, int(fraction * len(requests)))]
        return (request[5] - request[0]) * 1000

    print(f"  server side (head parsed -> 200 written): p50 {at(0.5):.2f} ms, p99 {at(0.99):.2f} ms, "
          f"max {at(1.0):.2f} ms over {len(requests):,} requests")
    slow = requests[int(len(requests) * 0.99):]
    names = ("queued until the writer took it", "write + fsync", "fsync -> wake-up posted", "posted -> loop ran it",
             "answering its batch")
    for label, group in (("all", requests), ("slowest 1%", slow)):
        means = [sum(r[i + 1] - r[i] for r in group) / len(group) * 1000 for i in range(5)]
        print(f"    {label}: " + "; ".join(f"{name} {mean:.2f} ms" for name, mean in zip(names, means)))


def _count_gc_pauses() -> dict[int, list[float]]:
    """Durations of the garbage collector's passes by generation (each holds the GIL, so stalls the
    loop): a full (generation 2) pass over a large heap is a latency spike."""
    import gc

    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started[0])

    gc.callbacks.append(callback)
    return pauses


async def serve(data_dir: Path, profile: str | None, trace: str | None = None,
                switch_interval_ms: float = 0.0) -> None:
    from headrace.catalog.items import WebhookSource
    from headrace.http.app import make_app, run_http
    from headrace.log.group_commit import GroupCommitter
    from headrace.webhook.ingest import IngestRegistry

    batches = [0, 0]  # group commits, requests in them
    commit = GroupCommitter._commit

    def counting_commit(self: GroupCommitter, batch: list) -> None:  # type: ignore[type-arg]
        batches[0] += 1
        batches[1] += len(batch)
        commit(self, batch)

    GroupCommitter._commit = counting_commit  # type: ignore[method-assign]
    if trace:
        _install_trace(trace)
    if profile:  # the group-commit thread too, into <profile>.writer
        import cProfile

        write_forever = GroupCommitter._write_forever

        def profiled(self: GroupCommitter) -> None:
            writer_profiler = cProfile.Profile()
            writer_profiler.enable()
            try:
                write_forever(self)
            finally:
                writer_profiler.disable()
                writer_profiler.dump_stats(f"{profile}.writer")

        GroupCommitter._write_forever = profiled  # type: ignore[method-assign]
    gc_pauses = _count_gc_pauses()
    registry = IngestRegistry()
    registry.add(WebhookSource(id="u1", name="load", body_format="json", include_headers=True,
                               idempotent_expr="headers->>'idempotency-key'",
                               create_sql="CREATE SOURCE load FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS "
                                          "IDEMPOTENT (headers->>'idempotency-key')"), data_dir / "u1")
    front = await run_http(make_app(registry), "127.0.0.1", 0)
    if switch_interval_ms:  # after run_http, which sets the server's own
        sys.setswitchinterval(switch_interval_ms / 1000)
    print(front.addresses[0][1], flush=True)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # until the parent says stop
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        await front.cleanup()
        await registry.close_all()
        print(f"  {batches[1] / max(1, batches[0]):.1f} requests per group commit", flush=True)
        print("  garbage collector passes: " + "; ".join(
            f"generation {generation} x{len(times)}, max {max(times, default=0) * 1000:.2f} ms, "
            f"total {sum(times) * 1000:.0f} ms" for generation, times in gc_pauses.items()), flush=True)
        import collections
        import gc

        oldest = collections.Counter(type(item).__name__ for item in gc.get_objects(2)).most_common(5)
        print(f"  oldest generation (not frozen) holds: {oldest}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--profile", help="cProfile the event loop thread into this file")
    parser.add_argument("--latency-rate", type=float, default=0.0,
                        help="then p50/p99 ack latency at this many req/s (open loop, 10 s); 0: half the measured rate")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="the server's event loop")
    parser.add_argument("--trace", help="per group commit timestamps into this file (JSON), summarised at the end")
    parser.add_argument("--switch-interval-ms", type=float, default=0.0,
                        help="sys.setswitchinterval in the server (0: the server's own choice)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(serve(Path(args.serve), args.profile, args.trace, args.switch_interval_ms))
        else:
            asyncio.run(serve(Path(args.serve), args.profile, args.trace, args.switch_interval_ms))
        return
    print(f"load average: {load_average()}")
    with tempfile.TemporaryDirectory() as temp:
        workdir = Path(temp)
        command = [sys.executable, __file__, "--serve", str(workdir / "data"), "--loop", args.loop]
        if args.profile:
            command += ["--profile", args.profile]
        if args.trace:
            command += ["--trace", args.trace]
        if args.switch_interval_ms:
            command += ["--switch-interval-ms", str(args.switch_interval_ms)]
        server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdin is not None
            port = int(server.stdout.readline())
            url = f"http://127.0.0.1:{port}/api/webhook/headrace/public/load"
            run_wrk(url, 1, args.connections, workdir)  # warm-up
            meter = CpuMeter([server.pid])
            threads_before = thread_cpu(server.pid)
            rate, note, total = run_wrk(url, args.seconds, args.connections, workdir)
            cpu = meter.seconds()
            for name, (user, system, switches, preempted) in sorted(thread_cpu(server.pid).items()):
                user0, system0, switches0, preempted0 = threads_before.get(name, (0.0, 0.0, 0, 0))
                if user == user0 and system == system0:
                    continue  # an idle thread (libuv's workers)
                print(f"  {name:16s} user {(user - user0) * 1e6 / max(1, total):5.1f} us/request, "
                      f"system {(system - system0) * 1e6 / max(1, total):5.1f} us/request, "
                      f"context switches {(switches - switches0) / max(1, total):.2f} + "
                      f"{(preempted - preempted0) / max(1, total):.2f} preempted /request")
            print(f"{rate:,.0f} req/s ({note}); server {cpu * 1e6 / max(1, total):.1f} us CPU/request "
                  f"over {total:,} requests")
            latency_start = time.perf_counter()  # CLOCK_MONOTONIC: comparable with the server's
            if args.latency_seconds > 0:
                print(f"  latency {latency_run(url, args.latency_rate or rate / 2, args.latency_seconds)}")
            server.stdin.write("stop\n")
            server.stdin.flush()
            print(server.stdout.read(), end="")
            server.wait(timeout=30)
            if args.trace:
                summarize_trace(args.trace, latency_start)
        finally:
            if server.poll() is None:
                server.kill()


if __name__ == "__main__":
    main()
