"""pgwire point-SELECT throughput (pgbench) and SELECT 1 latency, headrace against PostgreSQL 15.

Both servers get the same 10,000 rows (k -> v) and run on this machine:
  - PostgreSQL 15: initdb into a temporary directory as the postgres user (runuser), a free port,
    table kv (k int PRIMARY KEY, v text).
  - headrace: the same table kv (k int PRIMARY KEY, v text) filled by COPY FROM STDIN, with
    CREATE INDEX kv_k ON kv (k), read with the same query. With --webhook-source instead:
    a webhook source kv with IDEMPOTENT (body->>'k'), fed one POST per row, with
    CREATE INDEX kv_key ON kv (idempotency_key) (an in-memory arrangement: point lookups on it take the
    fast path, coordinator/fast_path.py), read as SELECT body->>'v' FROM kv WHERE idempotency_key = :k::text.
pgbench: `\\set k random(1,10000)` + the point SELECT, -n -c 8 -j 1 -T <seconds>, -M simple, extended and
prepared. SELECT 1: 2,000 queries over one psycopg connection, simple protocol (PQexec) and
psycopg's default (extended, server-side prepared after 5 runs); p50/p99.
Targets: headrace through the index >= 100% of PostgreSQL's tps (issue 16; was >= 50%, issue 3) on either serving
store (--serving-store); SELECT 1 p50 <= 1 ms.

    .venv/bin/python bench/pgwire_select.py [--seconds 10] [--clients 8] [--skip-postgres] [--serving-store postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.server_process import HeadraceProcess, free_port, wait_for  # noqa: E402

ROWS = 10_000
PG_BIN = Path("/usr/lib/postgresql/15/bin")
POSTGRES_QUERY = "SELECT v FROM kv WHERE k = :k;"
MODES = ("simple", "extended", "prepared")
HEADRACE_QUERY = "SELECT body->>'v' FROM kv WHERE idempotency_key = :k::text;"


def as_postgres_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command  # already an unprivileged user: run PostgreSQL as ourselves
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *command]
    return ["su", "postgres", "-c", " ".join(command)]


@contextlib.contextmanager
def postgres_server(workdir: Path) -> Iterator[str]:
    """A throwaway PostgreSQL 15 cluster; yields its DSN."""
    data = workdir / "pgdata"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(workdir, "postgres")
        shutil.chown(data, "postgres")
    subprocess.run(as_postgres_user([str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                                     "--no-sync"]), check=True, capture_output=True)
    port = free_port()
    process = subprocess.Popen(
        as_postgres_user([str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port), "-k", str(data),
                          "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    try:
        def ready() -> bool:
            try:
                with psycopg.connect(dsn, connect_timeout=2):
                    return True
            except psycopg.OperationalError:
                return False
        wait_for(ready, timeout=30, message="PostgreSQL to accept connections")
        yield dsn
    finally:
        process.terminate()
        process.wait(timeout=30)


def load_postgres(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (k int PRIMARY KEY, v text NOT NULL)")
        conn.execute("INSERT INTO kv SELECT k, 'value-' || k FROM generate_series(1, %s) AS k", (ROWS,))
        conn.execute("VACUUM ANALYZE kv")


async def post_rows(url: str) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as http:
        async def post(k: int) -> None:
            async with http.post(url, data=json.dumps({"k": k, "v": f"value-{k}"})) as response:
                assert response.status == 200, await response.text()

        queue = list(range(1, ROWS + 1))

        async def worker() -> None:
            while queue:
                await post(queue.pop())
        await asyncio.gather(*(worker() for _ in range(32)))


def load_headrace_table(server: HeadraceProcess) -> None:
    """The same table as PostgreSQL's, filled by COPY FROM STDIN, with an index on k."""
    started = time.monotonic()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (k int PRIMARY KEY, v text NOT NULL)")
        with conn.cursor().copy("COPY kv (k, v) FROM STDIN") as copy:
            for k in range(1, ROWS + 1):
                copy.write_row((k, f"value-{k}"))

        def all_visible() -> bool:  # read-your-writes waits up to 60 s per statement; a big COPY may take longer
            try:
                return conn.execute("SELECT count(*) FROM kv").fetchone() == (ROWS,)
            except psycopg.errors.CannotConnectNow:
                return False
        wait_for(all_visible, timeout=600, interval=1, message=f"{ROWS} rows in kv")
        print(f"  headrace: {ROWS} rows copied and materialized in {time.monotonic() - started:.1f}s", flush=True)
        started = time.monotonic()
        conn.execute("CREATE INDEX kv_k ON kv (k)")
        print(f"  headrace: CREATE INDEX in {time.monotonic() - started:.2f}s", flush=True)


def load_headrace(server: HeadraceProcess) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE SOURCE kv FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'k')")
    started = time.monotonic()
    asyncio.run(post_rows(server.webhook_url("kv")))

    def all_visible() -> bool:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM kv").fetchone() == (ROWS,)
    wait_for(all_visible, timeout=300, interval=1, message=f"{ROWS} rows in kv")
    print(f"  headrace: {ROWS} rows posted and materialized in {time.monotonic() - started:.1f}s", flush=True)
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        started = time.monotonic()
        conn.execute("CREATE INDEX kv_key ON kv (idempotency_key)")
        print(f"  headrace: CREATE INDEX in {time.monotonic() - started:.2f}s", flush=True)


def pgbench(dsn: str, query: str, mode: str, seconds: int, clients: int, workdir: Path) -> tuple[float, int]:
    """Run pgbench; (tps without initial connection time, failed transactions)."""
    script = workdir / f"point-{mode}.sql"
    script.write_text(f"\\set k random(1, {ROWS})\n{query}\n")
    params = dict(part.split("=", 1) for part in dsn.split())
    result = subprocess.run(
        ["pgbench", "-n", "-c", str(clients), "-j", "1", "-T", str(seconds), "-M", mode, "-f", str(script),
         "-h", params["host"], "-p", params["port"], "-U", params["user"], params["dbname"]],
        capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pgbench failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    tps = float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", result.stdout).group(1))  # type: ignore[union-attr]
    failed = re.search(r"number of failed transactions: (\d+)", result.stdout)
    return tps, int(failed.group(1)) if failed else 0


def select_one_latency(dsn: str, queries: int = 2000) -> dict[str, tuple[float, float]]:
    """p50/p99 in ms of SELECT 1 over one connection, per protocol."""
    results: dict[str, tuple[float, float]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("simple", "extended"):
            samples = []
            for _ in range(queries + 100):
                started = time.perf_counter()
                if name == "simple":
                    result = conn.pgconn.exec_(b"SELECT 1")
                    assert result.status == psycopg.pq.ExecStatus.TUPLES_OK
                else:
                    conn.execute("SELECT 1").fetchone()
                samples.append(time.perf_counter() - started)
            measured = sorted(samples[100:])  # the first 100 warm up (and psycopg prepares)
            results[name] = (measured[len(measured) // 2] * 1000, measured[int(len(measured) * 0.99)] * 1000)
    return results


def measure(label: str, dsn: str, query: str, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    for mode in MODES:
        tps, failed = pgbench(dsn, query, mode, args.seconds, args.clients, workdir)
        figures[mode] = tps
        print(f"  {label}: pgbench -M {mode:8} {tps:10,.0f} tps ({failed} failed)", flush=True)
    for protocol, (p50, p99) in select_one_latency(dsn).items():
        figures[f"select1-{protocol}"] = p50
        print(f"  {label}: SELECT 1 {protocol:8} p50 {p50:.3f} ms, p99 {p99:.3f} ms", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--serving-store", choices=("duckdb", "postgres"), default=None,
                        help="headrace's serving store (default: the server's default); the index answers lookups on both")
    parser.add_argument("--webhook-source", action="store_true",
                        help="headrace reads a webhook source (body->>'v' by idempotency_key) instead of a table")
    args = parser.parse_args()
    print(f"pgbench point SELECT over {ROWS} rows, -c {args.clients} -j 1 -T {args.seconds}", flush=True)
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        postgres: dict[str, float] = {}
        if not args.skip_postgres:
            with postgres_server(workdir) as dsn:
                load_postgres(dsn)
                postgres = measure("PostgreSQL 15", dsn, POSTGRES_QUERY, args, workdir)
        server = HeadraceProcess(workdir / "data",
                                 ("--serving-store", args.serving_store) if args.serving_store else ())
        server.start()
        try:
            if args.webhook_source:
                load_headrace(server)
                headrace = measure("headrace", server.dsn, HEADRACE_QUERY, args, workdir)
            else:
                load_headrace_table(server)
                headrace = measure("headrace", server.dsn, POSTGRES_QUERY, args, workdir)
        finally:
            server.stop()
    if postgres:
        for mode in MODES:
            print(f"headrace / PostgreSQL tps, -M {mode}: {headrace[mode] / postgres[mode]:.0%} "
                  "(target >= 100% through the index, issue 16)")
    print(f"headrace SELECT 1 p50: {headrace['select1-simple']:.3f} ms simple, "
          f"{headrace['select1-extended']:.3f} ms extended (target <= 1 ms)")


if __name__ == "__main__":
    main()
