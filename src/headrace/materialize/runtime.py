"""The materialization runtime: drives one driver through Flow's transaction protocol, one transaction per batch.

Contract (one `Runtime` per materialization key range per connection):

  open(driver_state) -> runtime checkpoint held by the driver, or None (use your own recovery log), or {}
      (explicit zero: rebuild from scratch). Opening fences off every earlier runtime of the same range.
  transact(documents, checkpoint) runs one transaction:
      1. Acknowledge (unless `acknowledge()` already sent it): the previous transaction is committed to the
         caller's recovery log (for Spark: the previous foreachBatch returned and Spark recorded it).
      2. Load each distinct key of non-delta-updates bindings, in batches, without waiting.
      3. Await Acknowledged: the driver's previous commit is done, so loads are read-committed.
      4. Flush; collect Loaded until Flushed.
      5. Reduce: documents of one key are combined in arrival order by the binding's reducer, then the loaded
         document (if any) is reduced with that combination. Store each key once, exists = it was loaded.
      6. StartCommit(checkpoint); await StartedCommit.
  What is durable when transact returns: with a remote-authoritative driver (the serving store), the documents
  and `checkpoint` committed together in the driver's store. With recovery-log drivers, the driver's effects are
  durable only once the caller commits its own log and the next Acknowledge reaches the driver.

transact pauses Python's cyclic GC while it runs (it creates no cycles; see _cyclic_gc_paused for the figure).

Any failure (driver Error, FencedOff, ordering violation, lost connection) poisons this Runtime: close it, open
a new one, and replay from the checkpoint that open() returns. Recovery after a crash between the driver's commit
and the caller's log commit is the caller's: compare the batch with open()'s checkpoint and skip what it covers.

Pipelining hook: `_begin` (steps 1-2) needs nothing from the driver, `_finish` (3-6) does. A pipelined caller
can run `_begin` of batch N+1 while batch N's commit is in flight, with no change to drivers: they already
stage Loads until their commit completes (see driver.py).
"""

from __future__ import annotations

import gc
from collections.abc import Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

from headrace.materialize.lifecycle import TransactionLifecycle
from headrace.materialize.protocol import (
    Acknowledge,
    Acknowledged,
    DriverError,
    ErrorResponse,
    FencedOff,
    Flush,
    Flushed,
    Load,
    Loaded,
    MaterializationError,
    MaterializationSpec,
    Open,
    Opened,
    ProtocolOrderError,
    Request,
    Response,
    StartCommit,
    StartedCommit,
    Store,
    apply_state_update,
    from_wire,
    key_identity,
    to_wire,
)
from headrace.materialize.reduce import Reducer, combine_lww
from headrace.materialize.transport import FrameSocket

SEND_BATCH = 2048  # messages per send: bounds memory of encoded frames while keeping syscalls few
Document = dict[str, Any]


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic GC for one transaction. transact allocates several containers per document and
    creates no cycles, yet each automatic collection rescans the caller's whole batch: measured at 100k
    documents, that was ~35% of transact's time. Cycles made meanwhile by other threads wait until after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _driver_error(response: ErrorResponse) -> DriverError:
    return (FencedOff if response.fenced_off else DriverError)(response.message)


class DriverConnection(Protocol):
    """A bidirectional message stream to one driver. Blocking; used by one thread at a time."""

    def send(self, msgs: list[Request]) -> None: ...

    def recv(self) -> Response: ...

    def close(self) -> None: ...


class RpcDriverConnection:
    """A DriverConnection over a framed TCP socket (see transport.py) to a driver server."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, io_timeout: float | None = None) -> None:
        self._socket = FrameSocket.connect(host, port, timeout=timeout, io_timeout=io_timeout)

    def send(self, msgs: list[Request]) -> None:
        self._socket.send_many([to_wire(m) for m in msgs])

    def recv(self) -> Response:
        msg = from_wire(self._socket.recv())
        if isinstance(msg, (Open, Acknowledge, Load, Flush, Store, StartCommit)):
            raise ProtocolOrderError(f"driver sent a request ({type(msg).__name__}) instead of a response")
        return msg

    def close(self) -> None:
        self._socket.close()


@dataclass(slots=True)
class _Transaction:
    """Documents of one transaction, combined per key in arrival order."""

    # key identity -> [binding, key, combined document]
    combined: dict[Hashable, list[Any]] = field(default_factory=dict)
    loaded: dict[Hashable, Document] = field(default_factory=dict)


class Runtime:
    """The runtime side of the protocol for one materialization and key range. Not thread-safe."""

    def __init__(self, driver: DriverConnection, spec: MaterializationSpec, key_begin: int = 0,
                 key_end: int = 0xFFFFFFFF, reducers: Sequence[Reducer] | None = None) -> None:
        if reducers is not None and len(reducers) != len(spec.bindings):
            raise ValueError(f"{len(reducers)} reducers given for {len(spec.bindings)} bindings")
        self._driver = driver
        self.spec = spec
        self.key_begin = key_begin
        self.key_end = key_end
        # Each binding's reducer comes from its collection's reduction annotations; lastWriteWins by default.
        self._reducers: tuple[Reducer, ...] = tuple(reducers or [combine_lww] * len(spec.bindings))
        self._lifecycle = TransactionLifecycle()
        self._failure: BaseException | None = None
        self._opened = False
        self._acknowledge_sent = False  # Acknowledge of the current transaction is on the wire
        self._acknowledged = False  # the driver's previous commit is done (Acknowledged received)
        self.driver_state: dict[str, Any] = {}  # the driver's state as of the last response that updated it
        self.committed_transactions = 0

    # ------------------------------------------------------------------------------------------ public

    def open(self, driver_state: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Open the transactions RPC; returns the driver-held runtime checkpoint (see module docstring)."""
        if self._opened:
            raise MaterializationError("runtime is already open")
        self._opened = True
        self.driver_state = dict(driver_state or {})
        with self._failing_permanently():
            self._send([Open(self.spec, self.key_begin, self.key_end, self.driver_state)])
            opened = self._expect(Opened)
            assert isinstance(opened, Opened)
            return opened.runtime_checkpoint

    def acknowledge(self) -> None:
        """Tell the driver the last transaction is committed to the caller's recovery log (at most once).

        transact() does this itself; call it early so recovery-log drivers apply their effects without waiting
        for the next batch."""
        self._check_usable()
        with self._failing_permanently():
            self._send_acknowledge()

    def transact(self, documents: Iterable[tuple[int, list[Any], Document]],
                 runtime_checkpoint: dict[str, Any]) -> None:
        """Run one transaction of (binding index, key, document) triples that commits `runtime_checkpoint`."""
        self._check_usable()
        with self._failing_permanently(), _cyclic_gc_paused():
            txn = self._begin(documents)
            self._finish(txn, runtime_checkpoint)

    def close(self) -> None:
        """Drop the connection. A transaction in flight is abandoned (the driver rolls it back)."""
        self._failure = self._failure or MaterializationError("runtime is closed")
        self._driver.close()

    # ------------------------------------------------------------------------------------------ phases

    def _begin(self, documents: Iterable[tuple[int, list[Any], Document]]) -> _Transaction:
        """Steps 1-2: combine documents per key, Acknowledge, send Loads. Waits for nothing."""
        txn = _Transaction()
        combined = txn.combined
        binding_count = len(self.spec.bindings)
        for binding, key, doc in documents:
            if not 0 <= binding < binding_count:
                raise MaterializationError(f"document names binding {binding}, spec has {binding_count}")
            identity = key_identity(binding, key)
            entry = combined.get(identity)
            if entry is None:
                combined[identity] = [binding, key, doc]
            else:
                entry[2] = self._reducers[binding](entry[2], doc)
        self._send_acknowledge()
        delta = [b.delta_updates for b in self.spec.bindings]
        loads: list[Request] = [Load(binding, key) for binding, key, _ in combined.values() if not delta[binding]]
        for start in range(0, len(loads), SEND_BATCH):
            self._send(loads[start:start + SEND_BATCH])
        return txn

    def _finish(self, txn: _Transaction, runtime_checkpoint: dict[str, Any]) -> None:
        """Steps 3-6: await the previous commit, flush loads, store reduced documents, commit."""
        while not self._acknowledged:
            self._expect(Acknowledged)
            self._acknowledged = True
        self._send([Flush()])
        while True:
            response = self._recv()
            if isinstance(response, Flushed):
                break
            if not isinstance(response, Loaded):
                raise ProtocolOrderError(f"expected Loaded or Flushed, got {type(response).__name__}")
            txn.loaded[key_identity(response.binding, response.key)] = response.doc
        self._send_stores(txn)
        self._send([StartCommit(runtime_checkpoint)])
        self._expect(StartedCommit)
        # The next transaction starts: its Acknowledge is unsent and the driver's Acknowledged is pending.
        self._acknowledge_sent = False
        self._acknowledged = False
        self.committed_transactions += 1

    def _send_stores(self, txn: _Transaction) -> None:
        bindings = self.spec.bindings
        batch: list[Request] = []
        for identity, (binding, key, doc) in txn.combined.items():
            loaded = txn.loaded.get(identity)
            if loaded is not None:
                doc = self._reducers[binding](loaded, doc)
            values = [doc.get(name) for name in bindings[binding].values]
            batch.append(Store(binding, key, values, doc, exists=loaded is not None))
            if len(batch) >= SEND_BATCH:
                self._send(batch)
                batch = []
        if batch:
            self._send(batch)

    # ------------------------------------------------------------------------------------------ plumbing

    def _send_acknowledge(self) -> None:
        if not self._acknowledge_sent:
            self._send([Acknowledge()])
            self._acknowledge_sent = True

    def _send(self, msgs: list[Request]) -> None:
        for msg in msgs:  # checked before anything reaches the wire
            self._lifecycle.on_request(msg)
        try:
            self._driver.send(msgs)
        except ConnectionError as exc:
            raise self._reason_for_lost_connection(exc) from exc

    def _reason_for_lost_connection(self, exc: ConnectionError) -> BaseException:
        """A failing driver sends Error and hangs up; if that is why sending failed, its Error is the cause."""
        try:
            response = self._driver.recv()
        except Exception:
            return exc
        return _driver_error(response) if isinstance(response, ErrorResponse) else exc

    def _recv(self) -> Response:
        response = self._driver.recv()
        if isinstance(response, ErrorResponse):
            raise _driver_error(response)
        self._lifecycle.on_response(response)
        if isinstance(response, (Acknowledged, Flushed, StartedCommit)):
            self.driver_state = apply_state_update(self.driver_state, response.state)
        return response

    def _expect(self, kind: type) -> Response:
        response = self._recv()
        if not isinstance(response, kind):
            raise ProtocolOrderError(f"expected {kind.__name__}, got {type(response).__name__}")
        return response

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise MaterializationError(f"runtime of {self.spec.name} is unusable after an earlier failure "
                                       f"({self._failure}); open a new one") from self._failure
        if not self._opened:
            raise MaterializationError("runtime is not open: call open() first")

    @contextmanager
    def _failing_permanently(self) -> Iterator[None]:
        """Any exception leaves the protocol state unknown, so the runtime and its connection end."""
        try:
            yield
        except BaseException as exc:
            if self._failure is None:
                self._failure = exc
                with suppress(OSError):  # the connection may be gone already; the original error matters
                    self._driver.close()
            raise
