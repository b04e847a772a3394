"""Fixtures for drivers over gRPC: one event loop thread for the session hosting grpc.aio driver servers (started per
test on 127.0.0.1:<free port>), and the real serving driver over a real DuckDB serving store (`serving_store`, from
tests/materialize/conftest.py) served over gRPC."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from headrace.materialize.driver import Connector, Transactor, TransactorFactory
from headrace.materialize.drivers.serving import ServingConnector, ServingTransactor
from headrace.materialize.protocol import MaterializationSpec, Open
from headrace.materialize.rpc.client import GrpcDriverConnection
from headrace.materialize.rpc.server import GrpcDriverServer, serve_grpc_driver
from headrace.materialize.runtime import Runtime
from headrace.store.serving import ServingStore

_T = TypeVar("_T")


class EventLoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-drivers", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout: float = 30) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        async def shut_down() -> None:
            await self.loop.shutdown_default_executor()

        self.run(shut_down())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class GrpcHostedDriver:
    """A Transactor (+ Connector) served over gRPC by serve_grpc_driver; `runtime(spec)` opens a new stream."""

    def __init__(self, loop: EventLoopThread, transactor_factory: TransactorFactory,
                 connector: Connector | None = None) -> None:
        self._loop = loop
        self.server: GrpcDriverServer = loop.run(serve_grpc_driver(transactor_factory, connector, "127.0.0.1:0"))
        self.address = self.server.address

    def connection(self) -> GrpcDriverConnection:
        return GrpcDriverConnection(self.address, timeout=10)

    def runtime(self, spec: MaterializationSpec, **kwargs: Any) -> Runtime:
        return Runtime(self.connection(), spec, **kwargs)

    def stop(self) -> None:
        self._loop.run(self.server.stop(grace=1.0))


@pytest.fixture(scope="session")
def grpc_loop() -> Iterator[EventLoopThread]:
    loop = EventLoopThread()
    yield loop
    loop.stop()


class ServingOverGrpc(GrpcHostedDriver):
    """The serving-store driver (ServingTransactor / ServingConnector) over gRPC, recording its transactors."""

    def __init__(self, loop: EventLoopThread, store: ServingStore) -> None:
        self.store = store
        self.transactors: list[Transactor] = []
        self.make_transactor: Callable[[ServingStore], Transactor] = ServingTransactor
        super().__init__(loop, self._factory, ServingConnector(store))

    def _factory(self, open: Open) -> Transactor:
        transactor = self.make_transactor(self.store)
        self.transactors.append(transactor)
        return transactor


@pytest.fixture
def serving_driver(grpc_loop: EventLoopThread, serving_store: ServingStore) -> Iterator[ServingOverGrpc]:
    driver = ServingOverGrpc(grpc_loop, serving_store)
    yield driver
    driver.stop()
