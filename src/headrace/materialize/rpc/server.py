"""The driver side over gRPC: the Driver service (driver.proto) running driver.py's connection loop per stream.

`serve_grpc_driver(transactor_factory, connector, address)` serves a Transactor (and optional Connector) with
grpc.aio. Each `Materialize` stream runs EXACTLY the loop of the TCP transport (`driver.serve_channel`: ordering
through TransactionLifecycle, Loads staged until Flush, background Acknowledge, Error then end of stream, the
transactor closed when the stream ends), through `GrpcChannel`, a MessageChannel over the stream.

A runtime that goes away cancels the RPC, and grpc.aio cancels the handler's task wherever it awaits: possibly
in the middle of a transactor call running in the executor, which cannot be interrupted. So the loop runs in its
own task, shielded from that cancellation: once the stream is gone its reads end and its writes fail, and it
shuts down as after a lost TCP connection (waiting for the running transactor call, then closing the transactor).

`run_grpc_driver` is a blocking main for a driver process started by headrace (`INTO EXTERNAL (COMMAND = ...)`):
it serves on $HEADRACE_DRIVER_ADDRESS until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor
from contextlib import suppress
from typing import Any

import grpc

from headrace.materialize.driver import Connector, TransactorFactory, serve_channel
from headrace.materialize.protocol import ErrorResponse, Request, Response
from headrace.materialize.rpc import driver_pb2 as pb
from headrace.materialize.rpc import driver_pb2_grpc as pb_grpc
from headrace.materialize.rpc.codec import request_from_proto, response_to_proto
from headrace.materialize.transport import MAX_FRAME_BYTES

logger = logging.getLogger(__name__)

ADDRESS_VARIABLE = "HEADRACE_DRIVER_ADDRESS"
# Messages as large as the TCP transport's frames; clients may ping an idle stream every minute (client.py pings
# every 5 minutes, gRPC's default minimum, so it works with drivers on default settings too).
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_FRAME_BYTES),
    ("grpc.max_send_message_length", MAX_FRAME_BYTES),
    ("grpc.http2.min_ping_interval_without_data_ms", 60_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


class GrpcChannel:
    """A MessageChannel (driver.py) over one grpc.aio Materialize stream: one request per burst."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._writing = asyncio.Lock()  # one write at a time: the loop and its background acknowledgement
        self._ended = False  # the Error was sent, or the stream is gone: nothing more to write

    def lost(self) -> None:
        """The RPC was cancelled (the runtime went away, or the server is stopping)."""
        self._ended = True

    async def receive(self) -> Iterable[Request] | None:
        try:
            request = await self._context.read()
        except Exception as exc:  # the stream failed under us: like a reset TCP connection
            raise ConnectionError(f"runtime stream failed: {exc!r}") from exc
        if request is grpc.aio.EOF:
            return None
        return _decoded(request)

    async def send(self, responses: list[Response]) -> None:
        async with self._writing:
            if self._ended:
                raise ConnectionError("runtime stream is gone")
            try:
                for response in responses:
                    await self._context.write(response_to_proto(response))
            except (grpc.RpcError, asyncio.InvalidStateError, RuntimeError) as exc:
                # grpc.aio raises its internal ExecuteBatchError (a RuntimeError) on a cancelled stream
                self._ended = True
                raise ConnectionError(f"runtime stream is gone: {exc!r}") from exc

    async def send_error(self, error: ErrorResponse) -> None:
        async with self._writing:
            if self._ended:
                return
            self._ended = True
            with suppress(Exception):
                await self._context.write(response_to_proto(error))

    async def linger(self) -> None:
        """Nothing to do: the handler's return ends the stream after the Error (HTTP/2 does not reset it)."""

    async def close(self) -> None:
        self._ended = True


def _decoded(request: pb.Request) -> Iterator[Request]:
    yield request_from_proto(request)  # decoded in the loop, so a malformed request is answered with Error


class _DriverService(pb_grpc.DriverServicer):
    def __init__(self, transactor_factory: TransactorFactory, connector: Connector | None,
                 executor: Executor | None) -> None:
        self._factory = transactor_factory
        self._connector = connector
        self._executor = executor

    async def Materialize(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        channel = GrpcChannel(context)
        session = asyncio.ensure_future(serve_channel(channel, self._factory, self._executor, self._connector))
        cancelled = False
        while not session.done():
            try:
                await asyncio.shield(session)
            except asyncio.CancelledError:
                cancelled = True  # see module docstring: the session ends by itself, and must not be cut short
                channel.lost()
        if cancelled:
            raise asyncio.CancelledError
        session.result()


class GrpcDriverServer:
    """A started grpc.aio server hosting the Driver service."""

    def __init__(self, server: grpc.aio.Server, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self, grace: float | None = 5.0) -> None:
        """Stop accepting streams; cancel open ones after `grace` seconds (their loops then shut down)."""
        await self.server.stop(grace)

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()


async def serve_grpc_driver(transactor_factory: TransactorFactory, connector: Connector | None, address: str,
                            executor: Executor | None = None) -> GrpcDriverServer:
    """Serve the Driver service on `address` ("host:port"; port 0 picks a free one) from the running event loop.
    Blocking transactor methods run in `executor` (None: the loop's default executor)."""
    host, _, port_text = address.rpartition(":")
    if not host or not port_text.isdigit():
        raise ValueError(f"driver address must be host:port, not {address!r}")
    server = grpc.aio.server(options=SERVER_OPTIONS)
    pb_grpc.add_DriverServicer_to_server(_DriverService(transactor_factory, connector, executor), server)
    port = server.add_insecure_port(address)  # raises if the address cannot be bound
    await server.start()
    return GrpcDriverServer(server, host, port)


def run_grpc_driver(transactor_factory: TransactorFactory, connector: Connector | None = None,
                    address: str | None = None) -> None:
    """Blocking: serve on `address` (default $HEADRACE_DRIVER_ADDRESS) until SIGTERM / SIGINT, then stop, giving
    open streams 5 s to finish."""
    address = address or os.environ.get(ADDRESS_VARIABLE)
    if not address:
        raise SystemExit(f"{ADDRESS_VARIABLE} is not set: headrace passes the address to serve on")

    async def main() -> None:
        server = await serve_grpc_driver(transactor_factory, connector, address)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        logger.info("driver serving on %s", server.address)
        await stopping.wait()
        await server.stop(5.0)

    asyncio.run(main())
