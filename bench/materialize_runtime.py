"""Throughput of Runtime.transact() against the DuckDB serving-store driver over local TCP.

Each case is one transaction of N webhook-like documents: first with fresh keys (Load finds nothing, plain
INSERT), then the same keys again (every key Loaded, DELETE + INSERT). The driver server runs in a child process
that owns the DuckDB file (as the headrace server does); the runtime talks to it over 127.0.0.1 from this process,
as a Spark worker would. Timing covers the whole transact() call: combine, Load, Flush, Store, commit.
Wall time on a shared machine is noisy: the CPU columns (this process, the driver process) are steadier.

    .venv/bin/python bench/materialize_runtime.py [--sizes 10000 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import multiprocessing
import os
import time
from pathlib import Path

from headrace.materialize.driver import start_driver_server
from headrace.materialize.drivers.serving import ServingTransactor
from headrace.materialize.protocol import Binding, MaterializationSpec, Open
from headrace.materialize.runtime import RpcDriverConnection, Runtime
from headrace.store.serving import ServingStore

SPEC = MaterializationSpec("source_bench", (Binding(
    resource_path=("headrace_internal", "source_bench"), key=("idempotency_key",), values=("body", "received_at"),
    column_types={"idempotency_key": "VARCHAR", "body": "JSON", "received_at": "TIMESTAMPTZ"}),))


def documents(count: int, generation: int, prefix: str = "") -> list[tuple[int, list[object], dict[str, object]]]:
    base = 1_700_000_000_000_000
    return [(0, [f"{prefix}k{i}"], {"idempotency_key": f"{prefix}k{i}", "body": {"k": generation, "pad": "x" * 50},
                                    "received_at": base + i}) for i in range(count)]


def serve(database: Path, ports: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """Child process: the driver server over one DuckDB file, until killed."""
    store = ServingStore(database)

    def factory(open: Open) -> ServingTransactor:
        return ServingTransactor(store)

    async def run() -> None:
        server = await start_driver_server("127.0.0.1", 0, factory)
        ports.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(run())


class DriverProcess:
    def __init__(self, database: Path) -> None:
        context = multiprocessing.get_context("spawn")
        ports: multiprocessing.Queue = context.Queue()  # type: ignore[type-arg]
        self.process = context.Process(target=serve, args=(database, ports), daemon=True)
        self.process.start()
        self.port: int = ports.get(timeout=60)

    def cpu_seconds(self) -> float:
        """User + system CPU of the driver process so far (Linux /proc; NaN elsewhere)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        driver = DriverProcess(Path(tmp) / "bench.duckdb")
        port = driver.port
        print(f"{'docs':>8} {'case':<22} {'best s':>8} {'docs/s':>10} {'runtime CPU s':>14} {'driver CPU s':>13}")
        batch_id = 0
        for size in args.sizes:
            for case, generation in (("insert (new keys)", 0), ("update (keys exist)", 1)):
                timings: list[tuple[float, float, float]] = []  # wall, runtime CPU, driver CPU
                for attempt in range(args.repeat):
                    runtime = Runtime(RpcDriverConnection("127.0.0.1", port), SPEC)
                    runtime.open()
                    prefix = f"r{batch_id}-" if generation == 0 else ""  # fresh keys for every insert attempt
                    if generation == 1:  # make sure the keys exist
                        runtime.transact(documents(size, 0), {"batch_id": batch_id})
                        batch_id += 1
                    docs = documents(size, generation + attempt, prefix)
                    started, cpu, driver_cpu = time.perf_counter(), time.process_time(), driver.cpu_seconds()
                    runtime.transact(docs, {"batch_id": batch_id})
                    timings.append((time.perf_counter() - started, time.process_time() - cpu,
                                    driver.cpu_seconds() - driver_cpu))
                    batch_id += 1
                    runtime.close()
                wall, runtime_cpu, driver_cpu = min(timings)
                print(f"{size:>8} {case:<22} {wall:>8.3f} {size / wall:>10,.0f} {runtime_cpu:>14.2f} "
                      f"{driver_cpu:>13.2f}", flush=True)
        driver.stop()


if __name__ == "__main__":
    main()
