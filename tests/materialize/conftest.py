"""Fixtures: a real driver server (asyncio, in a background thread) over a real DuckDB serving store."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from headrace.materialize.driver import Transactor, start_driver_server
from headrace.materialize.drivers.serving import ServingConnector, ServingTransactor
from headrace.materialize.protocol import Binding, MaterializationSpec, Open
from headrace.materialize.runtime import RpcDriverConnection, Runtime
from headrace.store.serving import ServingStore

WEBHOOK_COLUMNS = {"idempotency_key": "VARCHAR", "body": "JSON", "received_at": "TIMESTAMPTZ"}


def webhook_binding(table: str = "source_u1", delta_updates: bool = False) -> Binding:
    return Binding(resource_path=("headrace_internal", table), key=("idempotency_key",),
                   values=("body", "received_at"), column_types=dict(WEBHOOK_COLUMNS), delta_updates=delta_updates)


def webhook_spec(name: str = "source_u1", delta_updates: bool = False) -> MaterializationSpec:
    return MaterializationSpec(name=name, bindings=(webhook_binding(name, delta_updates),))


def webhook_doc(key: str, n: int, received_at: int = 1_700_000_000_000_000) -> dict[str, object]:
    return {"idempotency_key": key, "body": {"k": n, "pad": "x" * 50}, "received_at": received_at}


class DriverServer:
    """start_driver_server on 127.0.0.1:<free port>, its event loop running in a daemon thread."""

    def __init__(self, store: ServingStore) -> None:
        self.store = store
        self.transactors: list[Transactor] = []
        self.make_transactor: Callable[[ServingStore], Transactor] = ServingTransactor
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="driver-server", daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            start_driver_server("127.0.0.1", 0, self._factory, connector=ServingConnector(store)),
            self._loop).result(timeout=10)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    def _factory(self, open: Open) -> Transactor:
        transactor = self.make_transactor(self.store)
        self.transactors.append(transactor)
        return transactor

    def runtime(self, spec: MaterializationSpec, **kwargs: object) -> Runtime:
        return Runtime(RpcDriverConnection(self.host, self.port, io_timeout=30), spec, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        async def shut_down() -> None:
            self._server.close()
            await self._server.wait_closed()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._loop.shutdown_default_executor()

        asyncio.run_coroutine_threadsafe(shut_down(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def serving_store(tmp_path: Path) -> Iterator[ServingStore]:
    store = ServingStore(tmp_path / "serving.duckdb")
    yield store
    store.close()


@pytest.fixture
def driver_server(serving_store: ServingStore) -> Iterator[DriverServer]:
    server = DriverServer(serving_store)
    yield server
    server.stop()
