"""Dev harness: CPU per durable webhook request of the HTTP front + ingest path alone (no Spark, no
coordinator): the same source and load as bench/webhook_ingest.py, for before/after comparisons.

    .venv/bin/python bench/webhook_cpu.py [--seconds 5] [--connections 32] [--profile out.prof]

The server runs in a child process (default asyncio loop, as `headrace up`); wrk drives it; the
figure is the child's user+system CPU (all threads: event loop, group commit, dedupe flusher)
divided by the requests wrk completed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.webhook_ingest import CpuMeter, run_wrk  # noqa: E402

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, tuple[float, float]]:
    """(user, system) CPU seconds per thread of a process, by "name/tid" (the loop is the pid's)."""
    result: dict[str, tuple[float, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        label = "loop" if task.name == str(pid) else f"{name}/{task.name}"
        result[label] = (int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS)
    return result


async def serve(data_dir: Path, profile: str | None) -> None:
    from headrace.catalog.items import WebhookSource
    from headrace.http.app import make_app, run_http
    from headrace.webhook.ingest import IngestRegistry

    from headrace.log.group_commit import GroupCommitter

    batches = [0, 0]  # group commits, requests in them
    commit = GroupCommitter._commit

    def counting_commit(self: GroupCommitter, batch: list) -> None:  # type: ignore[type-arg]
        batches[0] += 1
        batches[1] += len(batch)
        commit(self, batch)

    GroupCommitter._commit = counting_commit  # type: ignore[method-assign]
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
    registry = IngestRegistry()
    registry.add(WebhookSource(id="u1", name="load", body_format="json", include_headers=True,
                               idempotent_expr="headers->>'idempotency-key'",
                               create_sql="CREATE SOURCE load FROM WEBHOOK BODY FORMAT JSON INCLUDE HEADERS "
                                          "IDEMPOTENT (headers->>'idempotency-key')"), data_dir / "u1")
    front = await run_http(make_app(registry), "127.0.0.1", 0)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--profile", help="cProfile the event loop thread into this file")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(Path(args.serve), args.profile))
        return
    with tempfile.TemporaryDirectory() as temp:
        workdir = Path(temp)
        command = [sys.executable, __file__, "--serve", str(workdir / "data")]
        if args.profile:
            command += ["--profile", args.profile]
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
            for name, (user, system) in sorted(thread_cpu(server.pid).items()):
                user0, system0 = threads_before.get(name, (0.0, 0.0))
                print(f"  {name:16s} user {(user - user0) * 1e6 / max(1, total):5.1f} us/request, "
                      f"system {(system - system0) * 1e6 / max(1, total):5.1f} us/request")
            print(f"{rate:,.0f} req/s ({note}); server {cpu * 1e6 / max(1, total):.1f} us CPU/request "
                  f"over {total:,} requests")
            server.stdin.write("stop\n")
            server.stdin.flush()
            print(server.stdout.read(), end="")
            server.wait(timeout=30)
        finally:
            if server.poll() is None:
                server.kill()


if __name__ == "__main__":
    main()
