"""The server's sinks: a runner per sink (sink/runner.py), the built-in drivers hosted in process, and the holds
that keep each input's changelog from being compacted past what its sinks still need to send.

Built-in drivers are served by the same connection loop as any driver (materialize/driver.py), one loopback
listener per driver, their calls on threads a little below the event loop's priority (a sink must not delay a
webhook's acknowledgement). External drivers are started or reached per sink (materialize/rpc/external.py).

State per sink under `<data>/sinks/<sink id>/`: `recovery.json` (the runtime's recovery log, for drivers that are
not remote-authoritative) and `position` (the last committed upstream timestamp, for compaction holds).

`access` (catalog/host_access.py) is the server's allow-lists: the PARQUET driver hosted here and every EXTERNAL
driver started here are confined by it, whatever the catalog says."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from headrace.catalog.catalog import Catalog
from headrace.catalog.host_access import HostAccess
from headrace.catalog.sinks import Sink
from headrace.errors import HeadraceError
from headrace.materialize.driver import start_driver_server
from headrace.materialize.drivers.builtin import BUILTIN_DRIVERS, builtin_driver
from headrace.materialize.drivers.parquet import ParquetConnector, ParquetTransactor
from headrace.materialize.rpc.external import ExternalDriver, RemoteDriver, driver_for
from headrace.materialize.runtime import DriverConnection, RpcDriverConnection
from headrace.sink.changes import ChangeReader
from headrace.sink.configs import endpoint_of
from headrace.sink.inputs import SinkInput, SinkStore, resolve_input
from headrace.sink.runner import SinkRunner, read_hold, sink_spec, write_hold
from headrace.store.serving import changelog_name

log = logging.getLogger(__name__)

SINK_NICENESS = 4  # as the pipeline's commits (server.py APPLY_NICENESS): below the event loop

STATUS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "VARCHAR"), ("schema", "VARCHAR"), ("relation", "VARCHAR"), ("driver", "VARCHAR"),
    ("guarantee", "VARCHAR"), ("state", "VARCHAR"), ("position", "TIMESTAMPTZ"), ("committed_at", "TIMESTAMPTZ"),
    ("transactions", "BIGINT"), ("documents", "BIGINT"), ("lag_transactions", "BIGINT"),
    ("lag_seconds", "DOUBLE"), ("last_transaction_documents", "BIGINT"), ("last_transaction_seconds", "DOUBLE"),
    ("last_error", "VARCHAR"), ("last_error_at", "TIMESTAMPTZ"))


def _lower_priority() -> None:
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SINK_NICENESS)


class SinkManager:
    def __init__(self, catalog: Catalog, store: SinkStore, data_dir: Path,
                 view_plan: Callable[[Any], Any], access: HostAccess | None = None) -> None:
        self._catalog = catalog
        # The server's allow-lists (headrace up --allow-command / --allow-directory): checked again by the EXTERNAL
        # and PARQUET drivers before they touch the host. None: nothing allowed.
        self.access = access if access is not None else HostAccess(data_dir=data_dir)
        self._store = store
        self._data_dir = data_dir
        self._view_plan = view_plan
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="headrace-sink",
                                            initializer=_lower_priority)
        self._servers: dict[str, asyncio.Server] = {}
        self._addresses: dict[str, tuple[str, int]] = {}
        self._runners: dict[str, SinkRunner] = {}
        self._external: dict[str, ExternalDriver | RemoteDriver] = {}
        self._holds: dict[str, tuple[str, int]] = {}  # sink id -> (changelog name, position held)
        self._lock = threading.Lock()
        store.add_commit_listener(self.wake_all)

    async def start(self) -> None:
        """Host the built-in drivers and start every sink in the catalog."""
        access = self.access
        for name, driver in BUILTIN_DRIVERS.items():
            factory, connector = driver.transactor_factory, driver.connector()
            if name == "parquet":  # confined to the allow-list, whatever the catalog says
                factory, connector = (lambda _open: ParquetTransactor(access)), ParquetConnector(access)
            server = await start_driver_server("127.0.0.1", 0, factory, executor=self._executor,
                                               connector=connector)
            self._servers[name] = server
            self._addresses[name] = server.sockets[0].getsockname()[:2]
        for sink in self._catalog.sinks():
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.start_sink, sink)
            except Exception as exc:  # noqa: BLE001 - one broken sink must not keep the server down
                log.error("sink %s cannot start: %s", sink.name, exc)

    def state_dir(self, sink: Sink) -> Path:
        return self._data_dir / "sinks" / sink.id

    def sink_input(self, sink: Sink) -> SinkInput:
        return resolve_input(self._catalog, self._view_plan, sink.relation_schema, sink.relation_name,
                             self._store.dialect)

    def prepare(self, sink: Sink) -> SinkRunner:
        """Everything a runner needs, checked (unknown relation, connection, secret, column types): CREATE SINK
        calls this before it records the sink, so a bad sink is refused rather than failing in the background."""
        sink_input = self.sink_input(sink)
        endpoint = endpoint_of(sink, self._catalog.find_connection, self._catalog.secret_value, self._data_dir,
                               self.access)
        columns = sink_input.columns(self._store)
        spec = sink_spec(sink, endpoint, sink_input, columns)
        reader = ChangeReader(self._store, sink_input, columns, sink.delta_updates)
        state_dir = self.state_dir(sink)
        changelog = changelog_name(sink_input.resource_path)
        if not (state_dir / "position").exists():
            latest = self._store.latest_timestamp(sink_input.materialization)
            write_hold(state_dir, latest or 0)  # a new sink's snapshot is at or after this
        with self._lock:
            self._holds[sink.id] = (changelog, read_hold(state_dir))

        def on_position(position: int) -> None:
            with self._lock:
                self._holds[sink.id] = (changelog, position)
            write_hold(state_dir, position)

        if sink.driver == "external":
            external = driver_for(sink.options, name=f"sink {sink.name}", access=self.access)
            self._external[sink.id] = external
            return SinkRunner(sink, spec, reader, self._store, external.connection, None, state_dir, on_position)
        builtin = builtin_driver(sink.driver)
        if builtin.name not in self._addresses:
            raise HeadraceError("sinks are not running in this process (SinkManager.start was not called)")
        host, port = self._addresses[builtin.name]

        def connect() -> DriverConnection:
            return RpcDriverConnection(host, port, io_timeout=None)  # an HTTP sink's commit may retry for long

        return SinkRunner(sink, spec, reader, self._store, connect, builtin, state_dir, on_position)

    def start_sink(self, sink: Sink) -> SinkRunner:
        return self.launch(self.prepare(sink))

    def launch(self, runner: SinkRunner) -> SinkRunner:
        with self._lock:
            self._runners[runner.sink.id] = runner
        runner.start()
        return runner

    def view_aggregates(self, sink: Sink) -> bool:
        """Whether the sink's input is a view whose values are reductions other than last-write-wins."""
        view = self._catalog.find_view(sink.relation_schema, sink.relation_name)
        return view is not None and bool(self._view_plan(view).aggregating)

    def stop_sink(self, sink: Sink, remove_state: bool = False) -> None:
        """Stop the sink's runner (blocking); DROP SINK also removes its state (the target keeps its data)."""
        with self._lock:
            runner = self._runners.pop(sink.id, None)
            self._holds.pop(sink.id, None)
        if runner is not None:
            runner.stop()
        external = self._external.pop(sink.id, None)
        if external is not None:
            external.stop()
        if remove_state:
            shutil.rmtree(self.state_dir(sink), ignore_errors=True)

    def wake_all(self) -> None:
        for runner in list(self._runners.values()):
            runner.wake()

    def holds(self) -> dict[str, int]:
        """Per changelog, the lowest position a sink still needs changes after (compaction keeps them)."""
        holds: dict[str, int] = {}
        with self._lock:
            for changelog, position in self._holds.values():
                holds[changelog] = min(position, holds.get(changelog, position))
        return holds

    def runner(self, sink: Sink) -> SinkRunner | None:
        return self._runners.get(sink.id)

    def status_rows(self) -> list[tuple[Any, ...]]:
        rows = []
        for sink in self._catalog.sinks():
            runner = self._runners.get(sink.id)
            status = runner.status if runner is not None else None
            guarantee = _guarantee(sink)
            rows.append((
                sink.name, sink.schema, f"{sink.relation_schema}.{sink.relation_name}", sink.driver.upper(),
                guarantee, status.state if status else "not running",
                _time(status.position / 1000) if status and status.position is not None else None,
                _time(status.committed_at) if status and status.committed_at is not None else None,
                status.transactions if status else 0, status.documents if status else 0,
                status.lag_transactions if status else 0, status.lag_seconds if status else 0.0,
                status.last_transaction_documents if status else 0,
                status.last_transaction_seconds if status else None,
                status.last_error if status else None,
                _time(status.last_error_at) if status and status.last_error_at is not None else None))
        return rows

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sink in self._catalog.sinks():
            await loop.run_in_executor(None, self.stop_sink, sink)
        for server in self._servers.values():
            server.close()
        self._executor.shutdown(wait=False, cancel_futures=True)


def _guarantee(sink: Sink) -> str:
    if sink.driver == "redis":
        return "at least once (stream entries may repeat)" if sink.delta_updates else \
            "effectively once (full rows rewritten after a crash)"
    if sink.driver == "http":
        return "exactly once into a receiver deduplicating on Idempotency-Key, else at least once"
    if sink.driver == "external":
        return "the driver's"
    return "exactly once"


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)
