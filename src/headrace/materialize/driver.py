"""The driver side of the protocol: a connection loop that owns ordering and staging, around a small Transactor.

As in Estuary's materialize-boilerplate, drivers implement only `Transactor` (and optionally `Connector` for the
control requests Spec, Validate and Apply); `serve_driver_connection` runs the loop for every driver:
  * every request read and response written passes through TransactionLifecycle;
  * Spec / Validate / Apply -> connector.spec / validate / apply -> Spec / Validated / Applied (an Error if the
    driver has no connector);
  * Open -> transactor_factory(open), transactor.open -> Opened;
  * Acknowledge -> transactor.acknowledge() runs in the background (the previous commit is done by then, since
    start_commit commits before returning) and Acknowledged is written when it returns. Acknowledged thus waits
    for the runtime's Acknowledge, which is what recovery-log drivers need (apply only once the runtime's log
    committed) and costs transactional drivers nothing: the runtime sends Acknowledge first in every transaction;
  * Loads are staged, never evaluated before Acknowledged (read-committed), and evaluated in one batch at Flush;
    then Loaded..., Flushed;
  * Stores are handed over in batches; StartCommit -> transactor.start_commit -> StartedCommit.
  * LoadColumns (columnar Loads) are staged like Loads and answered at Flush, after the Loaded, by one LoadedColumns
    each from transactor.load_columns (a transactor without it refuses them);
  * StoreColumns (columnar Stores) go to transactor.store_columns, after the Stores staged before them; a
    transactor without that method refuses them (the runtime only sends them to drivers that take them).
Blocking transactor methods run in `executor`, one at a time per connection, so DuckDB work never blocks the
event loop. Any exception sends {"type": "Error", "message": ...} and ends the connection (after letting the
runtime read it); the transactor is closed (rolling back anything uncommitted) whenever the connection ends.

The loop talks to the runtime through a `MessageChannel` (receive a burst of requests, send responses, send the
final Error, linger, close), so every transport runs exactly this loop: `TcpChannel` here (framed JSON over
asyncio streams, transport.py) and the gRPC stream of `materialize/rpc/server.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from contextlib import suppress
from typing import Any, Protocol, TypeVar

from headrace import failpoints
from headrace.errors import HeadraceError
from headrace.materialize.lifecycle import TransactionLifecycle
from headrace.materialize.protocol import (
    Acknowledge,
    Acknowledged,
    Applied,
    Apply,
    ErrorResponse,
    FencedOff,
    Flush,
    Flushed,
    Load,
    LoadColumns,
    Loaded,
    Open,
    Opened,
    ProtocolOrderError,
    Response,
    Spec,
    SpecResponse,
    StartCommit,
    StartedCommit,
    Store,
    StoreColumns,
    Validate,
    Validated,
    from_wire,
    to_wire,
)
from headrace.materialize.transport import FrameReader, write_frame, write_frames
from headrace.metrics.materializations import LEDGER

logger = logging.getLogger(__name__)

STORE_BATCH = 4096  # Stores handed to the transactor at once
WRITE_BATCH = 2048  # Loaded responses per write before awaiting drain (back-pressure)
LINGER_SECONDS = 5.0  # after an Error, how long to wait for the runtime to read it and hang up
_DISCARD_CHUNK = 256 * 1024
_T = TypeVar("_T")


class MessageChannel(Protocol):
    """One runtime connection as the connection loop sees it. Only the loop calls receive() and close(); send() and
    send_error() are also called by its background acknowledgement, so they may overlap and must keep each write
    whole (TCP appends whole frames to one buffer; the gRPC channel serializes its writes)."""

    async def receive(self) -> Iterable[Any] | None:
        """The next burst of requests (at least one; decoding may be deferred to iteration, so a malformed message
        fails where it stands in the burst), or None when the runtime ended the stream. ConnectionError: the
        runtime went away uncleanly."""
        ...

    async def send(self, responses: list[Response]) -> None:
        """Write responses in order, awaiting back-pressure."""
        ...

    async def send_error(self, error: ErrorResponse) -> None:
        """Best effort: write the final Error and end the response stream (nothing is sent after it)."""
        ...

    async def linger(self) -> None:
        """After an Error: give the runtime (bounded) time to read it before the connection is closed."""
        ...

    async def close(self) -> None: ...


class TcpChannel:
    """A MessageChannel over asyncio streams carrying transport.py frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._frames = FrameReader(reader)

    async def receive(self) -> Iterable[Any] | None:
        burst = await self._frames.read_frames()
        return None if burst is None else (from_wire(frame) for frame in burst)

    async def send(self, responses: list[Response]) -> None:
        if len(responses) == 1:
            write_frame(self._writer, to_wire(responses[0]))
        else:
            write_frames(self._writer, [to_wire(r) for r in responses])
        await self._writer.drain()

    async def send_error(self, error: ErrorResponse) -> None:
        with suppress(ConnectionError, RuntimeError):
            write_frame(self._writer, to_wire(error))
            await self._writer.drain()
            if self._writer.can_write_eof():
                self._writer.write_eof()

    async def linger(self) -> None:
        """Discard what the runtime still sends until it hangs up (bounded). Closing a socket with unread data
        resets the connection, which can destroy the Error before the runtime reads it."""
        with suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(LINGER_SECONDS):
                while await self._reader.read(_DISCARD_CHUNK):
                    pass

    async def close(self) -> None:
        self._writer.close()
        with suppress(ConnectionError, RuntimeError):
            await self._writer.wait_closed()


class Transactor(Protocol):
    """What a driver implements. Methods block; the connection loop calls them one at a time, in order:
    open, then per transaction: acknowledge, load (only after the previous commit), store..., start_commit."""

    def open(self, open: Open) -> Opened: ...

    def load(self, loads: list[Load]) -> Iterable[Loaded]: ...

    def store(self, stores: list[Store]) -> None: ...

    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit: ...

    def acknowledge(self) -> Acknowledged: ...

    def close(self) -> None: ...


TransactorFactory = Callable[[Open], Transactor]


class Connector(Protocol):
    """The control requests of a driver (blocking, called one at a time): describe, validate, create/migrate."""

    def spec(self, spec: Spec) -> SpecResponse: ...

    def validate(self, validate: Validate) -> Validated: ...

    def apply(self, apply: Apply) -> Applied: ...


async def serve_driver_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                  transactor_factory: TransactorFactory, executor: Executor | None = None,
                                  connector: Connector | None = None) -> None:
    """Serve one runtime connection until it closes or fails (see module docstring)."""
    await serve_channel(TcpChannel(reader, writer), transactor_factory, executor, connector)


async def serve_channel(channel: MessageChannel, transactor_factory: TransactorFactory,
                        executor: Executor | None = None, connector: Connector | None = None) -> None:
    """Run the connection loop over any transport's channel until the runtime ends it or it fails."""
    await _DriverSession(channel, transactor_factory, executor, connector).run()


async def start_driver_server(host: str, port: int, transactor_factory: TransactorFactory,
                              executor: Executor | None = None,
                              connector: Connector | None = None) -> asyncio.Server:
    """Listen for runtimes; executor None uses the event loop's default executor."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve_driver_connection(reader, writer, transactor_factory, executor, connector)
        except asyncio.CancelledError:
            pass  # the server is shutting down: the connection ends with it (asyncio would log it as an error)

    return await asyncio.start_server(handle, host, port)


class _DriverSession:
    """State of one connection: lifecycle, transactor, staged Loads/Stores, background acknowledgement, over a
    MessageChannel."""

    def __init__(self, channel: MessageChannel, transactor_factory: TransactorFactory, executor: Executor | None,
                 connector: Connector | None = None) -> None:
        self._connector = connector
        self._channel = channel
        self._factory = transactor_factory
        self._executor = executor
        self._lifecycle = TransactionLifecycle()
        self._transactor: Transactor | None = None
        self._staged_loads: list[Load] = []
        self._staged_column_loads: list[LoadColumns] = []
        self._staged_stores: list[Store] = []
        self._acknowledging: asyncio.Task[None] | None = None
        self._failed = False
        self._materialization: str | None = None  # from Open: what LEDGER records this session's commits under

    async def run(self) -> None:
        try:
            while not self._failed:
                try:
                    burst = await self._channel.receive()
                except ConnectionError as exc:  # only the runtime's side going away; driver errors go below
                    logger.info("runtime connection lost: %s", exc)
                    return
                if burst is None:
                    return  # the runtime hung up; an open transaction is abandoned by _shut_down
                for request in burst:
                    if self._failed:
                        break
                    await self._dispatch(request)
        except Exception as exc:
            await self._fail(exc)
        finally:
            if self._failed:
                await self._channel.linger()
            await self._shut_down()

    async def _dispatch(self, request: Any) -> None:
        if isinstance(request, (Opened, Acknowledged, Loaded, Flushed, StartedCommit, ErrorResponse, SpecResponse,
                                Validated, Applied)):
            raise ProtocolOrderError(f"runtime sent a response ({type(request).__name__}) instead of a request")
        self._lifecycle.on_request(request)
        kind = type(request)
        if kind is Load:  # staged until Flush: never evaluated before the previous commit is acknowledged
            self._staged_loads.append(request)
        elif kind is LoadColumns:
            if getattr(self._active(), "load_columns", None) is None:
                raise ProtocolOrderError("this driver does not take columnar Loads (LoadColumns)")
            self._staged_column_loads.append(request)
        elif kind is Store:
            self._staged_stores.append(request)
            if len(self._staged_stores) >= STORE_BATCH:
                await self._hand_over_stores()
        elif kind is StoreColumns:
            await self._hand_over_stores()  # keep the order of Stores and columnar Stores
            store_columns = getattr(self._active(), "store_columns", None)
            if store_columns is None:
                raise ProtocolOrderError("this driver does not take columnar Stores (StoreColumns)")
            await self._call(store_columns, request)
        elif isinstance(request, Acknowledge):
            self._acknowledging = asyncio.ensure_future(self._acknowledge())
        elif isinstance(request, Flush):
            await self._flush()
        elif isinstance(request, StartCommit):
            await self._hand_over_stores()
            failpoints.fail("start_commit", self._materialization)  # tests: a commit that keeps failing
            began = time.perf_counter()
            started = await self._call(self._active().start_commit, request.runtime_checkpoint)
            if self._materialization is not None:  # headrace_internal.materializations, /metrics
                LEDGER.committed(self._materialization, time.perf_counter() - began, request.runtime_checkpoint)
            await self._respond([started])
            failpoints.reached("after_started_commit")  # tests: kill -9 before the next Acknowledge
        elif isinstance(request, Open):
            self._materialization = request.spec.name
            LEDGER.opened(request.spec.name)
            self._transactor = await self._call(self._factory, request)
            opened = await self._call(self._transactor.open, request)
            await self._respond([opened])
        elif isinstance(request, (Spec, Validate, Apply)):
            if self._connector is None:
                raise ProtocolOrderError(f"this driver does not implement {request.TYPE}")
            handler = {Spec: self._connector.spec, Validate: self._connector.validate,
                       Apply: self._connector.apply}[type(request)]
            await self._respond([await self._call(handler, request)])

    async def _acknowledge(self) -> None:
        """Background: acknowledge the previous commit while the runtime keeps sending Loads (staged)."""
        try:
            acknowledged = await self._call(self._active().acknowledge)
            await self._respond([acknowledged])
        except Exception as exc:
            await self._fail(exc)

    async def _flush(self) -> None:
        # The lifecycle admitted Flush, so Acknowledged was written: the acknowledgement task is over.
        if self._acknowledging is not None:
            await self._acknowledging
            self._acknowledging = None
        loads, self._staged_loads = self._staged_loads, []
        loaded: list[Response] = (await self._call(lambda: list(self._active().load(loads)))) if loads else []
        for start in range(0, len(loaded), WRITE_BATCH):
            await self._respond(loaded[start:start + WRITE_BATCH])
        column_loads, self._staged_column_loads = self._staged_column_loads, []
        for column_load in column_loads:
            await self._respond([await self._call(self._active().load_columns, column_load)])  # type: ignore[attr-defined]
        await self._respond([Flushed()])

    async def _hand_over_stores(self) -> None:
        if self._staged_stores:
            stores, self._staged_stores = self._staged_stores, []
            await self._call(self._active().store, stores)

    async def _respond(self, responses: list[Response]) -> None:
        if self._failed:
            return
        for response in responses:
            self._lifecycle.on_response(response)
        await self._channel.send(responses)

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _active(self) -> Transactor:
        if self._transactor is None:  # unreachable past the lifecycle, which requires Open first
            raise ProtocolOrderError("no transactor: Open was not received")
        return self._transactor

    async def _fail(self, exc: BaseException) -> None:
        """Tell the runtime why, once, then stop writing: the protocol state is unknown after an error."""
        if self._failed:
            return
        self._failed = True
        message = str(exc) if isinstance(exc, HeadraceError) else f"{type(exc).__name__}: {exc}"
        if self._materialization is not None:
            LEDGER.failed(self._materialization, message)
        logger.warning("materialization driver failed: %s", message)
        sqlstate = exc.sqlstate if isinstance(exc, HeadraceError) and not exc.sqlstate.startswith("XX") else None
        await self._channel.send_error(ErrorResponse(message, fenced_off=isinstance(exc, FencedOff), sqlstate=sqlstate))

    async def _shut_down(self) -> None:
        if self._acknowledging is not None and not self._acknowledging.done():
            # Its executor call cannot be interrupted; wait so the transactor is never used concurrently.
            with suppress(Exception):
                await self._acknowledging
        if self._transactor is not None:
            try:
                await self._call(self._transactor.close)
            except Exception:
                logger.exception("closing the transactor failed")
        await self._channel.close()
