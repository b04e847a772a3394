"""CPU per point query in the pgwire + coordinator layers, without sockets or Spark.

A real coordinator and DuckDB serving store hold the pgbench table kv (k int PRIMARY KEY, v text) with
10,000 rows and CREATE INDEX kv_k ON kv (k); a PgConnection (the sans-I/O protocol machine) is fed the
exact bytes pgbench sends per transaction in each mode, and the thread CPU time per query is printed:
  simple    Query
  extended  Parse, Bind, Describe portal, Execute, Sync (unnamed statement each time)
  prepared  Bind, Describe portal, Execute, Sync of a named statement
This isolates headrace's own per-query work from socket and event-loop costs (bench/pgwire_select.py
measures the whole thing against PostgreSQL), and is stable on a busy machine because it counts CPU.

    .venv/bin/python bench/pgwire_cpu.py [--queries 20000] [--rounds 5] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from headrace.pgwire.connection import PgConnection  # noqa: E402
from tests.coordinator.conftest import in_process_adapter  # noqa: E402
from tests.pgwire.in_process import drain, indexed_kv  # noqa: E402
from tests.pgwire import wire_client as wire  # noqa: E402

ROWS = 10_000
QUERY = "SELECT v FROM kv WHERE k = {k};"
PARAM_QUERY = "SELECT v FROM kv WHERE k = $1;"


def mode_bytes(mode: str, keys: list[int]) -> list[bytes]:
    if mode == "simple":
        return [wire.query(QUERY.format(k=k)) for k in keys]
    if mode == "extended":
        return [wire.parse("", PARAM_QUERY) + wire.bind("", "", [str(k).encode()]) + wire.describe("P", "")
                + wire.execute("") + wire.sync() for k in keys]
    return [wire.bind("", "P0_1", [str(k).encode()]) + wire.describe("P", "") + wire.execute("") + wire.sync()
            for k in keys]


async def measure(connection: PgConnection, mode: str, queries: int, rounds: int) -> float:
    keys = [random.randint(1, ROWS) for _ in range(queries)]
    batches = mode_bytes(mode, keys)
    for data in batches[:500]:  # warm up caches (plan cache, encoders)
        connection.receive_data(data)
        await drain(connection)
    elapsed = float("inf")
    for _ in range(rounds):  # the best round: other processes on a busy machine only ever add time
        started = time.thread_time()
        for data in batches:
            connection.receive_data(data)
            output = await drain(connection)
        elapsed = min(elapsed, time.thread_time() - started)
    assert output.endswith(b"Z\x00\x00\x00\x05I") and b"value-" in output, output
    return elapsed / queries


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as temporary, in_process_adapter(Path(temporary)) as adapter:
        connection = await indexed_kv(adapter, f"SELECT i, 'value-' || i FROM range(1, {ROWS + 1}) t(i)")
        connection.receive_data(wire.parse("P0_1", PARAM_QUERY) + wire.sync())
        await drain(connection)
        for mode in ("simple", "extended", "prepared"):
            profiler = cProfile.Profile() if args.profile else None
            if profiler:
                profiler.enable()
            seconds = await measure(connection, mode, args.queries, 1 if args.profile else args.rounds)
            if profiler:
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
            print(f"  {mode:9} {seconds * 1e6:6.1f} us CPU per query (pgwire + coordinator, no sockets)",
                  flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="print the top functions by own time (cProfile)")
    asyncio.run(main(parser.parse_args()))
