"""The materialization runtime: drives one driver through Flow's transaction protocol, one transaction per batch.

Contract (one `Runtime` per materialization key range per connection):

  spec() / validate() / apply(), before open(): the control requests. validate() refuses (InvalidFieldSelection)
      a spec selecting a field the driver forbids or cannot store, or omitting one it requires.
  open(driver_state) -> runtime checkpoint held by the driver, or None (use your own recovery log), or {}
      (explicit zero: rebuild from scratch). Opening fences off every earlier runtime of the same range.
      With a `recovery_log` (drivers that are not remote-authoritative), open() sends the log's driver state and
      returns the log's checkpoint when the driver holds none; {} from the driver resets the log.
  transact(documents, checkpoint) runs one transaction:
      1. Acknowledge (unless `acknowledge()` already sent it): the previous transaction is committed to the
         caller's recovery log (for Spark: the previous foreachBatch returned and Spark recorded it).
      2. Load each distinct key of non-delta-updates bindings, in batches, without waiting.
      3. Await Acknowledged: the driver's previous commit is done, so loads are read-committed.
      4. Flush; collect Loaded until Flushed.
      5. Reduce: documents of one key are combined in arrival order by the binding's reducer, then the loaded
         document (if any) is reduced with that combination (fully, `reducer.full(loaded, combined)`, when the
         reducer has `.full`, as SchemaReducer does; None from it deletes), then the binding's finalizer, if any,
         derives the stored document (None: delete the key, or nothing if it was never stored). Store each key once, exists = it was loaded;
         a reduced document marked deleted (`{"_meta": {"op": "d"}}`, Flow's convention) is a Store with
         delete=True, or nothing if the key was not stored. Delta-updates bindings store this transaction's
         combination only (never loaded).
      6. StartCommit(checkpoint); await StartedCommit; with a recovery log, commit checkpoint + driver state.
         With wait_for_commit=False, StartedCommit is awaited at the start of the next transaction instead.
      Columnar documents (materialize/columnar.py) go through steps 2-5 as LoadColumns / LoadedColumns / StoreColumns.
  What is durable when transact returns: with a remote-authoritative driver (the serving store), the documents
  and `checkpoint` committed together in the driver's store. With recovery-log drivers, the driver's effects are
  durable only once the caller commits its own log and the next Acknowledge reaches the driver.

transact pauses Python's cyclic GC while it runs (it creates no cycles; see _cyclic_gc_paused for the figure).

Any failure (driver Error, FencedOff, ordering violation, lost connection) poisons this Runtime: close it, open
a new one, and replay from the checkpoint that open() returns. Recovery after a crash between the driver's commit
and the caller's log commit is the caller's: compare the batch with open()'s checkpoint and skip what it covers.

Pipelining: `PipelinedRuntime` (materialize/pipelined.py) runs transactions back to back on a committer thread while producers `feed()`
documents: whatever arrives while a commit is in flight is combined into the next transaction, whose Acknowledge
and Loads go out before the driver's Acknowledged (drivers stage Loads until their commit completes).
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

from headrace.materialize.lifecycle import TransactionLifecycle
from headrace.materialize.protocol import (
    Acknowledge,
    Acknowledged,
    Applied,
    Apply,
    DriverError,
    ErrorResponse,
    FencedOff,
    Flush,
    Flushed,
    Load,
    LoadColumns,
    Loaded,
    LoadedColumns,
    MaterializationError,
    MaterializationSpec,
    REQUEST_TYPES,
    Open,
    Opened,
    ProtocolOrderError,
    Request,
    Response,
    Spec,
    SpecResponse,
    StartCommit,
    StartedCommit,
    Store,
    StoreColumns,
    ValidateBinding,
    Validate,
    Validated,
    apply_state_update,
    check_field_selection,
    from_wire,
    key_identity,
    to_wire,
    validate_binding_of,
)
from headrace.materialize.columnar import ColumnarDocuments
from headrace.materialize.recovery import RecoveryLog
from headrace.materialize.reduce import Reducer, combine_lww
from headrace.materialize.transport import FrameSocket

SEND_BATCH = 2048  # messages per send: bounds memory of encoded frames while keeping syscalls few
Document = dict[str, Any]
# After full reduction, per binding: derives the stored document from the reduced one; None deletes the key.
Finalizer = Callable[[Document], Document | None]
FullReducer = Callable[[Document | None, Document], Document | None]


@dataclass(frozen=True)
class DerivedBinding:
    """A binding whose documents derive, within the same transaction, from another binding's changes (a view over
    a view). `derive(changes, runtime_checkpoint)` gets, per changed key of `upstream`, (the stored document before
    or None, the stored document after or None) and returns [(key, document)] of `binding`, which the runtime then
    Loads in a further round, reduces, finalizes and Stores like any other binding's documents."""

    upstream: int
    binding: int
    derive: Callable[[list[tuple[Document | None, Document | None]], dict[str, Any]],
                     Iterable[tuple[list[Any], Document]]]


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


def is_deletion(doc: Document) -> bool:
    """Flow's deletion convention: a reduced document whose `_meta.op` is "d" removes its key."""
    meta = doc.get("_meta")
    return type(meta) is dict and meta.get("op") == "d"


def _driver_error(response: ErrorResponse) -> DriverError:
    return (FencedOff if response.fenced_off else DriverError)(response.message, sqlstate=response.sqlstate)


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
        if isinstance(msg, REQUEST_TYPES):
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
    loads_sent: int = 0  # entries of `combined` (in insertion order) whose Load was sent or is not needed
    loaded_columns: dict[int, list[Any]] = field(default_factory=dict)  # binding -> LoadedColumns tables


class Runtime:
    """The runtime side of the protocol for one materialization and key range. Not thread-safe."""

    def __init__(self, driver: DriverConnection, spec: MaterializationSpec, key_begin: int = 0,
                 key_end: int = 0xFFFFFFFF, reducers: Sequence[Reducer] | None = None,
                 recovery_log: RecoveryLog | None = None,
                 finalizers: Sequence[Finalizer | None] | None = None,
                 derived: Sequence[DerivedBinding] = ()) -> None:
        if reducers is not None and len(reducers) != len(spec.bindings):
            raise ValueError(f"{len(reducers)} reducers given for {len(spec.bindings)} bindings")
        if finalizers is not None and len(finalizers) != len(spec.bindings):
            raise ValueError(f"{len(finalizers)} finalizers given for {len(spec.bindings)} bindings")
        self._driver = driver
        self.spec = spec
        self.key_begin = key_begin
        self.key_end = key_end
        # Each binding's reducer comes from its collection's reduction annotations; lastWriteWins by default.
        self._reducers: tuple[Reducer, ...] = tuple(reducers or [combine_lww] * len(spec.bindings))
        # A reducer with .full (SchemaReducer) reduces the combination into the loaded document fully (deletions,
        # set removals take effect); others reduce it as a partial.
        self._full_reducers: tuple[FullReducer | None, ...] = tuple(getattr(r, "full", None) for r in self._reducers)
        self._finalizers: tuple[Finalizer | None, ...] = tuple(finalizers or [None] * len(spec.bindings))
        self._delta = [b.delta_updates for b in spec.bindings]
        for link in derived:
            if not (0 <= link.upstream < len(spec.bindings) and 0 <= link.binding < len(spec.bindings)) \
                    or spec.bindings[link.binding].delta_updates or spec.bindings[link.upstream].delta_updates:
                raise ValueError(f"derived binding {link.binding} of {link.upstream} is not a pair of keyed bindings")
        self._derived = tuple(derived)
        self.recovery_log = recovery_log
        self._lifecycle = TransactionLifecycle()
        self._failure: BaseException | None = None
        self._opened = False
        self._acknowledge_sent = False  # Acknowledge of the current transaction is on the wire
        self._acknowledged = False  # the driver's previous commit is done (Acknowledged received)
        self.driver_state: dict[str, Any] = {}  # the driver's state as of the last response that updated it
        self.committed_transactions = 0
        self._commit_in_flight: dict[str, Any] | None = None  # checkpoint of a StartCommit awaiting StartedCommit
        # Seconds per phase of the last transaction (observability: combine, ack_wait, load, reduce, store, commit).
        self.phase_seconds: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------ public

    def spec_of_driver(self) -> SpecResponse:
        """Spec: the driver's protocol and config schemas (before open)."""
        return self._control(Spec(), SpecResponse)  # type: ignore[return-value]

    def validate(self, bindings: Sequence[ValidateBinding] | None = None) -> Validated:
        """Validate the spec's bindings (by default each offering exactly its selected columns) and refuse the
        spec if it selects a forbidden or incompatible field or omits a required one (InvalidFieldSelection)."""
        proposals = tuple(bindings) if bindings is not None else tuple(validate_binding_of(b)
                                                                        for b in self.spec.bindings)
        validated = self._control(Validate(self.spec.name, proposals, self.spec.config), Validated)
        assert isinstance(validated, Validated)
        check_field_selection(self.spec, validated)
        return validated

    def apply(self, last_spec: MaterializationSpec | None = None, version: str = "") -> Applied:
        """Apply: create or migrate the spec's resources (idempotent; before open)."""
        applied = self._control(Apply(self.spec, version, last_spec, dict(self.driver_state)), Applied)
        assert isinstance(applied, Applied)
        self.driver_state = apply_state_update(self.driver_state, applied.state)
        return applied

    def open(self, driver_state: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Open the transactions RPC; returns the runtime checkpoint to resume from (see module docstring)."""
        if self._opened:
            raise MaterializationError("runtime is already open")
        self._opened = True
        log = self.recovery_log
        if driver_state is None and log is not None:
            driver_state = log.state.driver_state
        self.driver_state = dict(driver_state or {})
        with self._failing_permanently():
            self._send([Open(self.spec, self.key_begin, self.key_end, self.driver_state)])
            opened = self._expect(Opened)
            assert isinstance(opened, Opened)
            checkpoint = opened.runtime_checkpoint
            if log is not None:
                if checkpoint == {}:  # the explicit zero checkpoint: rebuild from scratch
                    log.rebuild()
                elif checkpoint is None:
                    checkpoint = log.state.runtime_checkpoint
            return checkpoint

    def acknowledge(self) -> None:
        """Tell the driver the last transaction is committed to the caller's recovery log (at most once).

        transact() does this itself; call it early so recovery-log drivers apply their effects without waiting
        for the next batch."""
        self._check_usable()
        self._finish_commit_in_flight()
        with self._failing_permanently():
            self._send_acknowledge()

    def transact(self, documents: Iterable[tuple[int, list[Any], Document]],
                 runtime_checkpoint: dict[str, Any], columns: Sequence[StoreColumns] = (),
                 columnar: Sequence[ColumnarDocuments] = (), wait_for_commit: bool = True) -> None:
        """Run one transaction of (binding index, key, document) triples that commits `runtime_checkpoint`.

        `columns`: columnar Stores sent as they are after the documents' Stores (no Load, no reduction): for keys
        the caller knows the state of, e.g. a source's rows under fresh log offsets and deletions of replaced ones.
        `columnar`: bindings' documents as Arrow tables, Loaded and reduced as columns (materialize/columnar.py).
        `wait_for_commit=False` returns once StartCommit is sent: the driver commits while the caller prepares the
        next transaction, whose first step (or `finish_commit()`) awaits StartedCommit. Nothing is durable on return
        then: only a caller whose recovery trusts the driver's checkpoint (remote-authoritative) may do this."""
        self._check_usable()
        # Documents may carry fields for the checkpoint they commit with (pipeline/view_errors.py: errors a backfill
        # found, whose checkpoint its caller builds).
        extra = getattr(documents, "checkpoint_fields", None)
        if extra:
            runtime_checkpoint = {**runtime_checkpoint, **extra}
        commit_wait = self._finish_commit_in_flight()
        upstreams = {derived.upstream for derived in self._derived}
        for batch in columnar:
            if self._delta[batch.binding] or batch.binding in upstreams:
                raise MaterializationError(f"binding {batch.binding} cannot take columnar documents "
                                           "(delta-updates, or read by a derived binding)")
        with self._failing_permanently(), _cyclic_gc_paused():
            started = time.perf_counter()
            txn = _Transaction()
            self._combine_into(txn, documents)
            combined = time.perf_counter() - started
            self._send_acknowledge()
            self._send_loads(self._new_loads(txn))
            bindings = self.spec.bindings
            self._send([LoadColumns(batch.binding, batch.partials.select(list(bindings[batch.binding].key)))
                        for batch in columnar if batch.partials.num_rows])
            self._finish(txn, runtime_checkpoint, columns, columnar, wait_for_commit)
            self.phase_seconds["combine"] = combined
            self.phase_seconds["commit_wait"] = commit_wait

    def finish_commit(self) -> None:
        """Await the StartedCommit of a transaction sent with wait_for_commit=False (nothing if none is in flight)."""
        self._check_usable()
        self._finish_commit_in_flight()

    def _finish_commit_in_flight(self) -> float:
        if self._commit_in_flight is None:
            return 0.0
        started = time.perf_counter()
        with self._failing_permanently():
            self._complete_commit(self._commit_in_flight)
        return time.perf_counter() - started

    def wait_acknowledged(self) -> None:
        """Acknowledge (if not yet sent) and wait for the driver's Acknowledged: its previous commit is done (for
        recovery-log drivers: applied), and its non-transactional state is recorded in the recovery log."""
        self._check_usable()
        self._finish_commit_in_flight()
        with self._failing_permanently():
            self._send_acknowledge()
            self._await_acknowledged()

    def close(self) -> None:
        """Drop the connection. A transaction in flight is abandoned (the driver rolls it back); a commit in flight
        (wait_for_commit=False) is awaited first, so a clean stop leaves the store as far as the caller went."""
        if self._failure is None and self._commit_in_flight is not None:
            with suppress(Exception):  # the store's checkpoint says what committed either way
                self._finish_commit_in_flight()
        self._failure = self._failure or MaterializationError("runtime is closed")
        self._driver.close()

    # ------------------------------------------------------------------------------------------ phases

    def _combine_into(self, txn: _Transaction, documents: Iterable[tuple[int, list[Any], Document]]) -> None:
        """Step 1 (pure): combine documents per key into `txn`, in arrival order."""
        combined = txn.combined
        reducers = self._reducers
        binding_count = len(reducers)
        for binding, key, doc in documents:
            if not 0 <= binding < binding_count:
                raise MaterializationError(f"document names binding {binding}, spec has {binding_count}")
            identity = key_identity(binding, key)
            entry = combined.get(identity)
            if entry is None:
                combined[identity] = [binding, key, doc]
            else:
                entry[2] = reducers[binding](entry[2], doc)

    def _new_loads(self, txn: _Transaction) -> list[Request]:
        """Loads for the keys combined into `txn` since the last call (delta-updates bindings are never loaded)."""
        delta = self._delta
        entries = itertools.islice(txn.combined.values(), txn.loads_sent, None)
        loads: list[Request] = [Load(binding, key) for binding, key, _ in entries if not delta[binding]]
        txn.loads_sent = len(txn.combined)
        return loads

    def _send_loads(self, loads: list[Request]) -> None:
        for start in range(0, len(loads), SEND_BATCH):
            self._send(loads[start:start + SEND_BATCH])

    def _await_acknowledged(self) -> None:
        while not self._acknowledged:
            self._expect(Acknowledged)
            self._acknowledged = True
            if self.recovery_log is not None:
                self.recovery_log.update_driver_state(self.driver_state)

    def _finish(self, txn: _Transaction, runtime_checkpoint: dict[str, Any],
                columns: Sequence[StoreColumns] = (), columnar: Sequence[ColumnarDocuments] = (),
                wait_for_commit: bool = True) -> None:
        """Steps 3-6: await the previous commit, flush loads, reduce, derive downstream bindings' documents (each a
        further round of Loads), store reduced documents, commit."""
        self.phase_seconds = phases = {}
        mark = time.perf_counter()

        def lap(phase: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            phases[phase] = phases.get(phase, 0.0) + now - mark
            mark = now

        self._await_acknowledged()
        lap("ack_wait")
        self._flush_round(txn)
        lap("load")
        finals: dict[Hashable, Document | None] = {}
        downstream = {derived.binding for derived in self._derived}
        self._reduce_into(txn, finals, lambda binding: binding not in downstream)
        lap("reduce")
        for derived in self._derived:  # in dependency order: an upstream is final before its readers derive
            changed = [(txn.loaded.get(identity), finals[identity])
                       for identity, (binding, _, _) in txn.combined.items()
                       if binding == derived.upstream and identity in finals]
            changed = [(old, new) for old, new in changed if old != new]
            if changed:
                documents = derived.derive(changed, runtime_checkpoint)
                self._combine_into(txn, ((derived.binding, key, doc) for key, doc in documents))
                loads = self._new_loads(txn)
                # A further round only for keys known just now: when the downstream view filters out every change
                # (or its keys are loaded already), a Flush here would follow the last Flush, which the protocol
                # forbids (lifecycle.py), and would fail every retry of the batch.
                if loads:
                    self._send_loads(loads)
                    self._flush_round(txn)
            self._reduce_into(txn, finals, lambda binding, target=derived.binding: binding == target)
        lap("derive")
        reduced = [self._reduce_columns(txn, batch) for batch in columnar if batch.partials.num_rows]
        lap("reduce_columns")
        self._send_stores(txn, finals)
        self._send([store for store in reduced if store is not None])
        for store_columns in columns:
            if not 0 <= store_columns.binding < len(self._delta):
                raise MaterializationError(f"columnar Store names binding {store_columns.binding}, "
                                           f"spec has {len(self._delta)}")
            self._send([store_columns])
        lap("store")
        self._send([StartCommit(runtime_checkpoint)])
        if wait_for_commit:
            self._complete_commit(runtime_checkpoint)
        else:
            self._commit_in_flight = runtime_checkpoint
        lap("commit")

    def _complete_commit(self, runtime_checkpoint: dict[str, Any]) -> None:
        """Await StartedCommit of the StartCommit just sent; then the next transaction may start."""
        self._commit_in_flight = None
        self._expect(StartedCommit)
        if self.recovery_log is not None:  # the checkpoint and StartedCommit's driver state, atomically
            self.recovery_log.commit(runtime_checkpoint, self.driver_state)
        # The next transaction starts: its Acknowledge is unsent and the driver's Acknowledged is pending.
        self._acknowledge_sent = False
        self._acknowledged = False
        self.committed_transactions += 1

    def _flush_round(self, txn: _Transaction) -> None:
        self._send([Flush()])
        while True:
            response = self._recv()
            if isinstance(response, Flushed):
                return
            if isinstance(response, LoadedColumns):
                txn.loaded_columns.setdefault(response.binding, []).append(response.docs)
                continue
            if not isinstance(response, Loaded):
                raise ProtocolOrderError(f"expected Loaded or Flushed, got {type(response).__name__}")
            txn.loaded[key_identity(response.binding, response.key)] = response.doc

    def _reduce_into(self, txn: _Transaction, finals: dict[Hashable, Document | None],
                     selected: Callable[[int], bool]) -> None:
        """The stored document of each selected binding's key: loaded reduced with the combination, finalized;
        None deletes (a `_meta.op == "d"` document of a non-delta binding too)."""
        full_reducers, finalizers = self._full_reducers, self._finalizers
        for identity, (binding, key, doc) in txn.combined.items():
            if identity in finals or not selected(binding):
                continue
            loaded = txn.loaded.get(identity)
            full = full_reducers[binding]
            if full is not None:
                doc = full(loaded, doc)
            elif loaded is not None:
                doc = self._reducers[binding](loaded, doc)
            finalize = finalizers[binding]
            if finalize is not None and doc is not None:
                doc = finalize(doc)
            finals[identity] = doc

    @staticmethod
    def _reduce_columns(txn: _Transaction, batch: ColumnarDocuments) -> StoreColumns | None:
        """One columnar binding's Store: its partials reduced with the rows the driver loaded for them."""
        import pyarrow as pa

        loaded = txn.loaded_columns.get(batch.binding) or []
        table = pa.concat_tables(loaded) if len(loaded) > 1 else (loaded[0] if loaded else None)
        stores = batch.reduce(batch.partials, table)
        if not any(t is not None and t.num_rows for t in (stores.rows, stores.updated, stores.deleted)):
            return None
        return StoreColumns(batch.binding, rows=stores.rows, updated=stores.updated, deleted=stores.deleted)

    def _send_stores(self, txn: _Transaction, finals: dict[Hashable, Document | None]) -> None:
        bindings = self.spec.bindings
        batch: list[Request] = []
        for identity, (binding, key, _) in txn.combined.items():
            loaded = txn.loaded.get(identity)
            doc = finals[identity]
            if doc is None:  # fully reduced or finalized away: the key is deleted
                if loaded is not None:
                    batch.append(Store(binding, key, [None] * len(bindings[binding].values), {}, exists=True,
                                       delete=True))
                continue
            values = [doc.get(name) for name in bindings[binding].values]
            if "_meta" in doc and is_deletion(doc):
                if loaded is None and not self._delta[binding]:
                    continue  # deleting a key the store does not hold: nothing to do
                batch.append(Store(binding, key, values, doc, exists=loaded is not None, delete=True))
            else:
                batch.append(Store(binding, key, values, doc, exists=loaded is not None))
            if len(batch) >= SEND_BATCH:
                self._send(batch)
                batch = []
        if batch:
            self._send(batch)

    # ------------------------------------------------------------------------------------------ plumbing

    def _control(self, request: Request, answer: type) -> Response:
        if self._opened:
            raise MaterializationError(f"{type(request).__name__} must come before open()")
        self._check_not_failed()
        with self._failing_permanently():
            self._send([request])
            return self._expect(answer)

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

    def _check_not_failed(self) -> None:
        if self._failure is not None:
            raise MaterializationError(f"runtime of {self.spec.name} is unusable after an earlier failure "
                                       f"({self._failure}); open a new one") from self._failure

    def _check_usable(self) -> None:
        self._check_not_failed()
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


# PipelinedRuntime lives in its own module; importable from here as before.
from headrace.materialize.pipelined import PipelinedRuntime  # noqa: E402,F401
