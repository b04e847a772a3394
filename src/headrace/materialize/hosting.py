"""A driver served in this process on its own thread: the real connection loop (`start_driver_server` on
127.0.0.1:<free port>) with an event loop of its own, for callers that are not on an event loop themselves (the
conformance kit, tests, benchmarks). A runtime reaches it over TCP exactly as it reaches any driver."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from headrace.materialize.driver import Connector, TransactorFactory, start_driver_server
from headrace.materialize.protocol import MaterializationSpec
from headrace.materialize.runtime import DriverConnection, RpcDriverConnection, Runtime


class ThreadedDriverServer:
    """Serves `transactor_factory` (and `connector`'s Spec / Validate / Apply) until `stop()`. Thread-safe."""

    def __init__(self, transactor_factory: TransactorFactory, connector: Connector | None = None,
                 thread_name: str = "driver-server", io_timeout: float = 60.0) -> None:
        self.io_timeout = io_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=thread_name, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            start_driver_server("127.0.0.1", 0, transactor_factory, connector=connector), self._loop).result(10)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    def connect(self) -> DriverConnection:
        return RpcDriverConnection(self.host, self.port, io_timeout=self.io_timeout)

    def runtime(self, spec: MaterializationSpec, **kwargs: Any) -> Runtime:
        """A new Runtime on a new connection (as after a restart)."""
        return Runtime(self.connect(), spec, **kwargs)

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
