"""Fixtures for sink drivers: any Transactor (and Connector) served by the real connection loop
(`start_driver_server`) on 127.0.0.1:<free port>, its event loop in a daemon thread, driven by a real `Runtime`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from headrace.materialize.driver import Connector, TransactorFactory, start_driver_server
from headrace.materialize.protocol import MaterializationSpec
from headrace.materialize.runtime import RpcDriverConnection, Runtime


class HostedDriver:
    """A driver server for one test: `runtime(spec)` connects a new Runtime to it (a new connection each time,
    as after a restart)."""

    def __init__(self, transactor_factory: TransactorFactory, connector: Connector | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hosted-driver", daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            start_driver_server("127.0.0.1", 0, transactor_factory, connector=connector), self._loop).result(10)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    def runtime(self, spec: MaterializationSpec, **kwargs: Any) -> Runtime:
        return Runtime(RpcDriverConnection(self.host, self.port, io_timeout=60), spec, **kwargs)

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


@contextmanager
def hosted_driver(transactor_factory: TransactorFactory, connector: Connector | None = None) -> Iterator[HostedDriver]:
    host = HostedDriver(transactor_factory, connector)
    try:
        yield host
    finally:
        host.stop()
