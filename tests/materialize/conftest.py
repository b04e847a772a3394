"""Fixtures: a real driver server (asyncio, in a background thread) over a real DuckDB serving store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from headrace.materialize.driver import Transactor
from headrace.materialize.drivers.serving import ServingConnector, ServingTransactor
from headrace.materialize.hosting import ThreadedDriverServer
from headrace.materialize.protocol import Binding, MaterializationSpec, Open
from headrace.store.serving import ServingStore

WEBHOOK_COLUMNS = {"idempotency_key": "VARCHAR", "body": "JSON", "received_at": "TIMESTAMPTZ"}


def webhook_binding(table: str = "source_u1", delta_updates: bool = False) -> Binding:
    return Binding(resource_path=("headrace_internal", table), key=("idempotency_key",),
                   values=("body", "received_at"), column_types=dict(WEBHOOK_COLUMNS), delta_updates=delta_updates)


def webhook_spec(name: str = "source_u1", delta_updates: bool = False) -> MaterializationSpec:
    return MaterializationSpec(name=name, bindings=(webhook_binding(name, delta_updates),))


def webhook_doc(key: str, n: int, received_at: int = 1_700_000_000_000_000) -> dict[str, object]:
    return {"idempotency_key": key, "body": {"k": n, "pad": "x" * 50}, "received_at": received_at}


class DriverServer(ThreadedDriverServer):
    """The serving store's driver on 127.0.0.1:<free port>, its event loop in a daemon thread; `make_transactor`
    may be swapped by a test, and `transactors` lists every transactor Open created."""

    def __init__(self, store: ServingStore) -> None:
        self.store = store
        self.transactors: list[Transactor] = []
        self.make_transactor: Callable[[ServingStore], Transactor] = ServingTransactor
        super().__init__(self._factory, ServingConnector(store), io_timeout=30)

    def _factory(self, open: Open) -> Transactor:
        transactor = self.make_transactor(self.store)
        self.transactors.append(transactor)
        return transactor


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
