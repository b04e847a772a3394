"""One sink at work: a thread that keeps its target equal to its input, one runtime transaction at a time.

The runner owns no protocol logic: the runtime (materialize/runtime.py) orders the transaction, the driver makes it
durable by its pattern, the ChangeReader (sink/changes.py) says what to send. The runner's loop:

    connect, Validate, Apply, Open -> checkpoint {"upto": T} (None, or {} from the driver: start with a snapshot)
    repeat: the changes after T, as one transaction committing {"upto": U}; T = U
            nothing new: finish the commit in flight and have the driver acknowledge it, then wait for a wake-up

Remote-authoritative drivers (POSTGRES) are opened without a recovery log: Open returns the checkpoint PostgreSQL
holds, so commits are pipelined (the next batch is read while PostgreSQL commits). Every other driver gets a
recovery log in the sink's state directory, committed by the runtime after each StartedCommit, and is asked to
Acknowledge right away, so a PARQUET sink's files are applied without waiting for the next batch.

Failures: the runtime is closed and the loop starts again after a backoff (1 s doubling to 30 s), reopening from
the checkpoint the driver or the log holds, so nothing is lost or applied twice. FencedOff (another runtime opened
the same target) is retried too, more slowly: the newest opener wins each time, and each commit stays exactly once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace import failpoints
from headrace.catalog.sinks import Sink
from headrace.durable import replace_file_durably
from headrace.errors import HeadraceError
from headrace.materialize.columnar import ColumnarDocuments, ColumnarStores
from headrace.materialize.drivers.builtin import BuiltinDriver
from headrace.materialize.protocol import Binding, FencedOff, MaterializationSpec, StoreColumns
from headrace.materialize.recovery import RecoveryLog
from headrace.materialize.runtime import DriverConnection, Runtime
from headrace.sink.changes import DELTA_COLUMNS, ChangeBatch, ChangeReader
from headrace.sink.configs import Endpoint
from headrace.sink.inputs import SinkInput, SinkStore

log = logging.getLogger(__name__)

IDLE_WAIT_SECONDS = 0.5  # between polls of the input when no wake-up comes (a commit of the input wakes us)
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
FENCED_BACKOFF_SECONDS = 10.0
SNAPSHOT_FILE = "snapshot_at"


@dataclass
class SinkStatus:
    """What SHOW SINKS and headrace_internal.sink_status show (updated by the runner thread)."""

    state: str = "starting"  # starting | running | retrying | fenced | stopped
    position: int | None = None  # the upstream commit timestamp the target holds everything up to (committed)
    committed_at: float | None = None  # when that commit was made (s since the epoch)
    transactions: int = 0  # committed by this runner since the server started
    documents: int = 0
    lag_transactions: int = 0
    lag_seconds: float = 0.0
    last_transaction_documents: int = 0
    last_transaction_seconds: float | None = None  # from reading its changes to its commit confirmed
    last_error: str | None = None
    last_error_at: float | None = None
    attempts: int = 0  # consecutive failures
    extra: dict[str, Any] = field(default_factory=dict)


def sink_spec(sink: Sink, endpoint: Endpoint, sink_input: SinkInput,
              columns: list[tuple[str, str]]) -> MaterializationSpec:
    """The materialization of a sink: one binding from its input's columns to the endpoint's resource."""
    types = dict(columns)
    key = sink_input.key
    if sink.delta_updates:
        types = {**dict(DELTA_COLUMNS), **types}
        key = (*key, "hr_timestamp", "hr_diff")
    values = tuple(name for name, _ in columns if name not in key)
    binding = Binding(endpoint.resource_path, tuple(key), values, {name: types[name] for name in (*key, *values)},
                      delta_updates=sink.delta_updates)
    return MaterializationSpec(sink.materialization, (binding,), endpoint.config)


class SinkRunner:
    """Runs one sink in a thread of its own (see module docstring). `connect` opens a new connection to the
    sink's driver; `builtin` is None for an external driver (which gets documents on the row path)."""

    def __init__(self, sink: Sink, spec: MaterializationSpec, reader: ChangeReader, store: SinkStore,
                 connect: Callable[[], DriverConnection], builtin: BuiltinDriver | None, state_dir: Path,
                 on_position: Callable[[int], None] | None = None) -> None:
        self.sink = sink
        self.spec = spec
        self.status = SinkStatus()
        self._reader = reader
        self._store = store
        self._connect = connect
        self._builtin = builtin
        self._state_dir = state_dir
        self._on_position = on_position or (lambda _position: None)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._runtime: Runtime | None = None
        self._runtime_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"headrace-sink-{sink.name}", daemon=True)

    @property
    def remote_authoritative(self) -> bool:
        return self._builtin is not None and self._builtin.remote_authoritative

    def start(self) -> None:
        self._thread.start()

    def check(self) -> None:
        """Validate and Apply with the driver, then hang up (CREATE SINK: refuse a sink that cannot work)."""
        runtime = Runtime(self._connect(), self.spec)
        try:
            runtime.validate()
            runtime.apply()
        finally:
            runtime.close()

    def wake(self) -> None:
        """The input committed: look for changes now rather than at the next poll."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the transaction in flight (its commit is awaited, so the target is as far as we went)."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():  # stuck in the driver (a retrying HTTP POST): drop the connection
            with self._runtime_lock:
                if self._runtime is not None:
                    self._runtime.close()
            self._thread.join(5.0)
        self.status.state = "stopped"

    # ---------------------------------------------------------------------------------------------- the loop

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._serve()
            except FencedOff as exc:
                self._failed(exc, "fenced")
                self._stopping.wait(FENCED_BACKOFF_SECONDS)
            except Exception as exc:  # noqa: BLE001 - any failure: reopen from the checkpoint after a backoff
                self._failed(exc, "retrying")
                self._stopping.wait(min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** (self.status.attempts - 1)))

    def _failed(self, exc: BaseException, state: str) -> None:
        message = str(exc) if isinstance(exc, HeadraceError) else f"{type(exc).__name__}: {exc}"
        if self._stopping.is_set():
            return
        self.status.state = state
        self.status.last_error = message
        self.status.last_error_at = time.time()
        self.status.attempts += 1
        log.warning("sink %s: %s (attempt %d)", self.sink.name, message, self.status.attempts)

    def _serve(self) -> None:
        log_file = None if self.remote_authoritative else RecoveryLog(self._state_dir / "recovery.json")
        runtime = Runtime(self._connect(), self.spec, recovery_log=log_file)
        with self._runtime_lock:
            self._runtime = runtime
        try:
            runtime.validate()
            runtime.apply()
            checkpoint = runtime.open()
            position = _position_of(checkpoint)
            if checkpoint == {}:  # the driver's explicit zero: rebuild, from a new snapshot
                (self._state_dir / SNAPSHOT_FILE).unlink(missing_ok=True)
            self._committed(position, committed=False)
            self.status.state = "running"
            pending: int | None = None  # a pipelined commit's position, not yet confirmed
            pending_batch = (0.0, 0)  # its (start, documents)
            acknowledged = True
            while not self._stopping.is_set():
                self._wake.clear()
                started = time.monotonic()
                if position is None and pending is None:
                    batch = self._snapshot()
                else:
                    batch = self._reader.next_batch(position if pending is None else pending)
                if batch is None:
                    if pending is not None:
                        runtime.finish_commit()
                        position, pending = self._committed(pending, timing=pending_batch), None
                        failpoints.reached("sink_after_commit")
                    if not acknowledged:
                        runtime.wait_acknowledged()  # the driver applies (PARQUET) and is idle
                        acknowledged = True
                    self._refresh_lag(position)
                    self._wake.wait(IDLE_WAIT_SECONDS)
                    continue
                self._transact(runtime, batch)
                self.status.documents += batch.documents
                acknowledged = False
                if self.remote_authoritative:
                    if pending is not None:  # transact awaited the previous StartedCommit first
                        position = self._committed(pending, timing=pending_batch)
                        failpoints.reached("sink_after_commit")  # committed in PostgreSQL, not Acknowledged
                    pending, pending_batch = batch.upto, (started, batch.documents)
                else:
                    position = self._committed(batch.upto, timing=(started, batch.documents))
                    failpoints.reached("sink_after_commit")  # the log holds it; the driver did not apply it yet
                    runtime.acknowledge()
                self.status.attempts = 0
        finally:
            with self._runtime_lock:
                self._runtime = None
            runtime.close()

    def _snapshot(self) -> ChangeBatch | None:
        """The first batch: the input as of a commit timestamp pinned (durably, before anything is sent) in the
        state directory, so a snapshot replayed after a crash is the same rows at the same timestamp (an HTTP
        receiver deduplicates them by it)."""
        pin = self._state_dir / SNAPSHOT_FILE
        try:
            snapshot_at: int | None = int(pin.read_text())
        except FileNotFoundError:
            snapshot_at = self._reader.latest()
            if snapshot_at is None:
                return None  # the input never committed: nothing to send yet
            self._on_position(snapshot_at)  # hold the changes after it first
            self._state_dir.mkdir(parents=True, exist_ok=True)
            replace_file_durably(pin, str(snapshot_at).encode())
        return self._reader.next_batch(None, snapshot_at=snapshot_at)

    def _committed(self, position: int | None, committed: bool = True,
                   timing: tuple[float, int] | None = None) -> int | None:
        self.status.position = position
        if committed:
            self.status.transactions += 1
            self.status.committed_at = time.time()
        if timing is not None:
            self.status.last_transaction_seconds = time.monotonic() - timing[0]
            self.status.last_transaction_documents = timing[1]
        if position is not None:
            self._on_position(position)
        return position

    def _refresh_lag(self, position: int | None) -> None:
        lag = self._reader.lag(position)
        self.status.lag_transactions = lag.transactions
        self.status.lag_seconds = 0.0 if lag.oldest_pending is None else max(0.0, time.time() - lag.oldest_pending / 1000)

    # ---------------------------------------------------------------------------------------------- one transaction

    def _transact(self, runtime: Runtime, batch: ChangeBatch) -> None:
        checkpoint = {"upto": batch.upto}
        pipelined = self.remote_authoritative
        if self._builtin is None:
            runtime.transact(self._documents(batch), checkpoint)
            return
        if batch.delta is not None:
            runtime.transact([], checkpoint, columns=[StoreColumns(0, rows=batch.delta)], wait_for_commit=not pipelined)
        elif batch.snapshot and batch.rows is not None and self._builtin.loads_columns:
            # The target may hold some keys already (a table that existed): Load them, update those.
            key = list(self.spec.bindings[0].key)
            runtime.transact([], checkpoint, columnar=[ColumnarDocuments(0, batch.rows, _split_by_loaded(key))],
                             wait_for_commit=not pipelined)
        else:
            columns = [StoreColumns(0, rows=batch.rows, updated=batch.updated, deleted=batch.deleted)]
            runtime.transact([], checkpoint, columns=[c for c in columns if _any_rows(c)],
                             wait_for_commit=not pipelined)

    def _documents(self, batch: ChangeBatch) -> list[tuple[int, list[Any], dict[str, Any]]]:
        """The row path (external drivers): each changed key's document, or a deletion, per the protocol."""
        from headrace.materialize.drivers.arrow_values import documents_from_table

        binding = self.spec.bindings[0]
        columns = [(name, binding.column_types[name]) for name in binding.columns]
        documents: list[tuple[int, list[Any], dict[str, Any]]] = []
        for table in (batch.delta, batch.rows, batch.updated):
            if table is not None:
                for document in documents_from_table(columns, table):
                    documents.append((0, [document[name] for name in binding.key], document))
        if batch.deleted is not None:
            for document in documents_from_table([c for c in columns if c[0] in binding.key], batch.deleted):
                key = [document[name] for name in binding.key]
                documents.append((0, key, {**document, "_meta": {"op": "d"}}))
        return documents


def _position_of(checkpoint: dict[str, Any] | None) -> int | None:
    if not checkpoint:
        return None  # never committed, or the driver's explicit zero: start from a snapshot
    upto = checkpoint.get("upto")
    if type(upto) is not int:  # noqa: E721 - a bool is an int to isinstance
        raise HeadraceError(f"the sink's checkpoint {checkpoint!r} is not one of headrace's")
    return upto


def _any_rows(stores: StoreColumns) -> bool:
    return any(t is not None and t.num_rows for t in (stores.rows, stores.updated, stores.deleted))


def _split_by_loaded(key: list[str]) -> Callable[[pa.Table, pa.Table | None], ColumnarStores]:
    """A snapshot's columnar reduction: keys the driver loaded are updates, the others new rows."""

    def split(partials: pa.Table, loaded: pa.Table | None) -> ColumnarStores:
        if loaded is None or loaded.num_rows == 0:
            return ColumnarStores(rows=partials)
        held = loaded.select(key).cast(partials.select(key).schema).append_column(
            "__hr_held", pa.array([True] * loaded.num_rows))
        joined = partials.join(held, key, join_type="left outer")
        mask = joined["__hr_held"].is_valid()
        updated = joined.filter(mask).drop_columns(["__hr_held"]).select(partials.column_names)
        rows = joined.filter(pc.invert(mask)).drop_columns(["__hr_held"])
        return ColumnarStores(rows=rows.select(partials.column_names) if rows.num_rows else None,
                              updated=updated if updated.num_rows else None)

    return split


def write_hold(state_dir: Path, position: int) -> None:
    """Record the sink's position for changelog compaction (sink/manager.py): a stale value only holds more."""
    state_dir.mkdir(parents=True, exist_ok=True)
    temporary = state_dir / "position.tmp"
    temporary.write_text(str(position))  # no fsync: after a power cut an old or missing value holds more, not less
    os.replace(temporary, state_dir / "position")


def read_hold(state_dir: Path) -> int:
    try:
        return int((state_dir / "position").read_text())
    except (FileNotFoundError, ValueError):
        return 0  # unknown: hold every change
