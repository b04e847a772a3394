"""Table writes on a real server over one psycopg connection:

    .venv/bin/python bench/table_writes.py [--inserts 500] [--visible 50] [--copy-rows 100000]

- INSERT latency p50/p99: autocommit single-row INSERTs (prepared, parameters), each acknowledged only
  after its log record is fsync'd;
- INSERT -> visible: INSERT, then at once a SELECT of that row; the SELECT's time is read-your-writes
  (waiting for the pipeline to apply the write to the serving store) plus the query itself;
- COPY FROM rows/s: one COPY of --copy-rows rows in text format, acknowledged (durable) at its tag.

Starts its own server on a temporary data directory (Spark local[2]) and waits for the pipeline first,
so the first micro-batch's warm-up is not measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.server_process import HeadraceProcess  # noqa: E402


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def report(label: str, samples: list[float]) -> None:
    print(f"{label:<32} p50 {percentile(samples, 0.5) * 1000:8.2f} ms   p99 {percentile(samples, 0.99) * 1000:8.2f} ms"
          f"   mean {statistics.fmean(samples) * 1000:8.2f} ms   n={len(samples)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inserts", type=int, default=500)
    parser.add_argument("--visible", type=int, default=50)
    parser.add_argument("--copy-rows", type=int, default=100_000)
    args = parser.parse_args()
    server = HeadraceProcess(Path(tempfile.mkdtemp(prefix="headrace-bench-tables-")) / "data")
    server.start()
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_rows (id int8 PRIMARY KEY, label text NOT NULL, amount float8)")
            conn.execute("INSERT INTO bench_rows VALUES (0, 'warm-up', 0)")
            started = time.monotonic()
            conn.execute("SELECT count(*) FROM bench_rows").fetchone()  # waits for the pipeline's first batch
            print(f"pipeline ready after {time.monotonic() - started:.1f} s", flush=True)

            insert_times = []
            for n in range(1, args.inserts + 1):
                began = time.perf_counter()
                conn.execute("INSERT INTO bench_rows VALUES (%s, %s, %s)", (n, f"row {n}", n * 0.5), prepare=True)
                insert_times.append(time.perf_counter() - began)
            report("INSERT (autocommit, durable)", insert_times)

            visible_times = []
            for n in range(args.inserts + 1, args.inserts + 1 + args.visible):
                conn.execute("INSERT INTO bench_rows VALUES (%s, %s, %s)", (n, f"row {n}", n * 0.5), prepare=True)
                began = time.perf_counter()
                found = conn.execute("SELECT label FROM bench_rows WHERE id = %s", (n,), prepare=True).fetchone()
                visible_times.append(time.perf_counter() - began)
                assert found == (f"row {n}",), found
            report("INSERT -> visible in next SELECT", visible_times)

            base = args.inserts + args.visible + 1
            payload = "".join(f"{base + i}\tcopied {i}\t{i}.25\n" for i in range(args.copy_rows))
            began = time.perf_counter()
            with conn.cursor().copy("COPY bench_rows FROM STDIN") as copy:
                copy.write(payload)
            elapsed = time.perf_counter() - began
            print(f"{'COPY FROM (text, durable)':<32} {args.copy_rows / elapsed:10.0f} rows/s "
                  f"({args.copy_rows} rows in {elapsed:.2f} s)", flush=True)
            began = time.perf_counter()
            count = conn.execute("SELECT count(*) FROM bench_rows").fetchone()
            print(f"{'COPY -> visible':<32} {time.perf_counter() - began:10.2f} s (count {count[0]})", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
