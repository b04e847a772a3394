"""The figures of docs/drivers.md "Performance": the serving-store driver in its own process, served over gRPC
(serve_grpc_driver) or the TCP transport (start_driver_server), driven by a Runtime in this process.

    .venv/bin/python -m tests.materialize.rpc.bench_transports [DOCUMENTS] [COLUMNAR_ROWS]

Per transport: a transaction of DOCUMENTS new keys, one updating them all (each key Loaded and Stored), the median
of 30 one-document transactions, and one StoreColumns of COLUMNAR_ROWS rows. (`serve` is the driver process.)
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from headrace.materialize.driver import start_driver_server
from headrace.materialize.drivers.serving import ServingConnector, ServingTransactor
from headrace.materialize.protocol import StoreColumns
from headrace.materialize.rpc.external import ExternalDriver
from headrace.materialize.rpc.server import ADDRESS_VARIABLE, run_grpc_driver
from headrace.materialize.runtime import DriverConnection, RpcDriverConnection, Runtime
from headrace.store.serving import ServingStore
from tests.materialize.conftest import webhook_doc, webhook_spec


def serve(transport: str, path: str) -> None:
    store = ServingStore(Path(path))
    if transport == "grpc":
        run_grpc_driver(lambda _open: ServingTransactor(store), ServingConnector(store))
        return
    host, port = os.environ[ADDRESS_VARIABLE].rsplit(":", 1)

    async def main() -> None:
        server = await start_driver_server(host, int(port), lambda _open: ServingTransactor(store),
                                           connector=ServingConnector(store))
        await server.serve_forever()

    asyncio.run(main())


def bench(transport: str, documents: int, columnar_rows: int) -> str:
    directory = tempfile.mkdtemp(prefix="bench-transports-")
    driver = ExternalDriver(f"exec {sys.executable} -m tests.materialize.rpc.bench_transports serve {transport} "
                            f"{directory}/serving.duckdb", cwd=str(Path(__file__).resolve().parents[3]))
    driver.start()
    try:
        assert driver.address is not None
        host, port = driver.address.rsplit(":", 1)
        connection: DriverConnection = (driver.connection() if transport == "grpc"
                                        else RpcDriverConnection(host, int(port)))
        runtime = Runtime(connection, webhook_spec())
        runtime.apply()
        runtime.open()
        rates = []
        for label in ("insert", "update"):
            batch = [(0, [f"k{i}"], webhook_doc(f"k{i}", i)) for i in range(documents)]
            started = time.perf_counter()
            runtime.transact(batch, {"batch_id": label})
            rates.append(documents / (time.perf_counter() - started))
        latencies = []
        for i in range(30):
            started = time.perf_counter()
            runtime.transact([(0, [f"k{i}"], webhook_doc(f"k{i}", i))], {"batch_id": f"one-{i}"})
            latencies.append(time.perf_counter() - started)
        table = pa.table({"idempotency_key": [f"c{i}" for i in range(columnar_rows)],
                          "body": ['{"k":1,"pad":"xxxxxxxxxxxxxxxxxxxx"}'] * columnar_rows,
                          "received_at": pa.array([1_700_000_000_000_000] * columnar_rows, pa.int64())})
        started = time.perf_counter()
        runtime.transact([], {"batch_id": "columns"}, [StoreColumns(0, rows=table)])
        columns = columnar_rows / (time.perf_counter() - started)
        runtime.close()
    finally:
        driver.stop()
    return (f"{transport}: {documents} new keys {rates[0]:.0f} docs/s, existing keys {rates[1]:.0f} docs/s; "
            f"one-document transaction median {statistics.median(latencies) * 1000:.1f} ms; "
            f"StoreColumns {columnar_rows} rows {columns:.0f} rows/s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], sys.argv[3])
    else:
        count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
        rows = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
        for name in ("tcp", "grpc"):
            print(bench(name, count, rows), flush=True)
