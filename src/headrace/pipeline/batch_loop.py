"""Many sources, one pipeline: a driver-side loop that serves every source and table (issue 17, item 4).

Structured Streaming costs, per query, a trigger thread, a Python runner process for its data source and seconds
to start; with one query per source, 10 idle sources took 24 processes and ~4 GB. Here no streaming query runs:
one loop in the pipeline process looks at every log every TICK_S and, for each log that grew, runs that source's
batch: the same foreachBatch code (batches.SourceBatches, table_batches.TableBatches), handed either the rows the
loop read itself (a small batch: Arrow in log order; with no views nothing of Spark runs at all) or a DataFrame of
a batch read whose offset ranges Spark tasks read in parallel (log_source.LogRangesReader, through the log read
service on a cluster). Batches of different sources run on a few threads at once (BATCH_THREADS); a source at rest
is a few objects and an open connection to the materialization driver, no process and no thread. A source's batches
never overlap (the next one is looked for once the last was handed to the driver), so its commits stay in order.

Exactly once: the store's runtime checkpoint is the only offset truth. A source starts from the `log_end` its
stored checkpoint holds (the Open of its runtime fences off any older runtime), and each batch commits its range's
end with its rows. The next batch of a source starts only after the previous one was handed to the driver; a commit
that fails surfaces at that source's next transaction (or its next idle look, `finish_commit`), and the source is
then restarted from the store's checkpoint, as after a crash. There is no Spark checkpoint to disagree with.

Creating or dropping a source or view touches only that source: its start (Open, backfill of new views) runs on
the control thread while the loop goes on with the others; a stop waits at most for that source's batch in flight.

Whether a log grew is first asked of the file system (LogWatch: the mtimes of the log's directory and tail segment),
so an idle source costs two stat calls per tick, not a scan of its log."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from headrace.catalog.views import MaterializedView
from headrace.log.access import FileLogAccess
from headrace.log.segments import list_segments, segment_path
from headrace.materialize.runtime import Runtime
from headrace.pipeline.log_source import ARROW_SCHEMA, HeadraceLogSource, LogStreamReader, format_ranges
from headrace.pipeline.process import LogService, backfill, open_runtime, query_kind
from headrace.pipeline.status import one_line_error, status_row

log = logging.getLogger("headrace.pipeline")

TICK_S = 0.2  # as the streaming trigger was: a row waits at most this long to be seen
BATCH_THREADS = int(os.environ.get("HEADRACE_PIPELINE_BATCH_THREADS", "4"))
LOOP_EPOCH = "batch-loop"  # the epoch the loop's checkpoints carry (batch ids only order a source's commits)
# A log written to within this long is scanned whatever its mtimes say: a write within the file system's timestamp
# granularity of the last look may have left the mtime unchanged.
RECENT_NS = 1_000_000_000


class LogWatch:
    """Whether a log may have grown since the last look, from stat() alone (see RECENT_NS)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._directory_mtime: int | None = None
        self._tail: Path | None = None
        self._tail_mtime: int | None = None

    def may_have_grown(self) -> bool:
        now = time.time_ns()
        try:
            directory_mtime = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            return False  # no log yet (or a dropped one)
        if directory_mtime != self._directory_mtime:  # a segment was added or removed
            bases = list_segments(self.directory)
            self._tail = segment_path(self.directory, bases[-1]) if bases else None
        try:
            tail_mtime = os.stat(self._tail).st_mtime_ns if self._tail is not None else None
        except FileNotFoundError:
            directory_mtime, tail_mtime = -1, None  # list the segments again next time
        changed = (directory_mtime, tail_mtime) != (self._directory_mtime, self._tail_mtime)
        recent = now - max(directory_mtime, tail_mtime or 0) < RECENT_NS
        self._directory_mtime, self._tail_mtime = directory_mtime, tail_mtime
        return changed or recent


@dataclass
class LoopEntry:
    """One source or table in the loop."""
    item: Any  # WebhookSource | Table
    views: list[MaterializedView]
    runtime: Runtime
    batches: Any  # SourceBatches | TableBatches
    reader: Any  # LogStreamReader | TableLogStreamReader over the log's files: ends, caps and partitions
    arrow_schema: pa.Schema
    log_options: dict[str, str]  # how Spark tasks reach the log (a large batch of a source)
    position: int  # the log end of the last batch handed to the store
    next_batch_id: int
    watch: LogWatch
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False
    in_flight: bool = False  # handed to the pool, not done yet: not looked at meanwhile
    # The last look found records: look again at the next tick whatever the watch says (a capped batch left more,
    # or records came while it ran). Only a look that finds nothing hands the source back to its LogWatch.
    pending: bool = True

    @property
    def definition(self) -> tuple[Any, ...]:
        return (self.item.create_sql, tuple((view.id, view.create_sql) for view in self.views))

    @property
    def last_batch_at(self) -> float | None:
        return getattr(self.batches, "last_batch_at", None)


def _definition(item: Any, views: list[MaterializedView]) -> tuple[Any, ...]:
    return (item.create_sql, tuple((view.id, view.create_sql) for view in views))


def _backoff(failures: int) -> float:
    return min(10.0, 0.5 * 2 ** min(failures, 5))


class BatchLoop:
    """The pipeline of every source and table: Pipeline's interface (reconcile, restart_failed, status_report,
    stop), served by one loop thread instead of one streaming query each."""

    def __init__(self, spark: Any, data_dir: Path, driver_address: tuple[str, int],
                 log_service: LogService | None = None, threads: int = BATCH_THREADS, tick_s: float = TICK_S) -> None:
        self.spark = spark
        self.data_dir = data_dir
        self.driver_address = driver_address
        self.log_service = log_service  # Spark tasks read through it on a cluster; this process reads the files
        self.tick_s = tick_s
        self.entries: dict[str, LoopEntry] = {}
        self.unstarted: dict[str, tuple[Any, list[MaterializedView], float]] = {}  # (item, views, retry at)
        self.failures: dict[str, int] = {}
        self.last_errors: dict[str, tuple[str | None, float]] = {}
        self._last_batches: dict[str, float] = {}  # kept across restarts of a source
        self._lock = threading.Lock()  # guards the dicts above (the control thread and the loop share them)
        self._stopping = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(max(1, threads), thread_name_prefix="headrace-batch")
        self._thread = threading.Thread(target=self._run, name="headrace-batch-loop", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the control thread

    def reconcile(self, items: list[Any], views: list[MaterializedView] | None = None) -> None:
        from headrace.pipeline.process import views_by_source

        desired = {item.id: item for item in items}
        desired_views = views_by_source(items, views or [])
        with self._lock:
            running = dict(self.entries)
        for item_id, entry in running.items():
            if item_id not in desired or _definition(desired[item_id], desired_views[item_id]) != entry.definition:
                self.stop_source(item_id)
        for item_id, item in desired.items():
            with self._lock:
                if item_id in self.entries:
                    continue
                pending = self.unstarted.get(item_id)
                if pending is not None:  # failed: retried after its backoff, as it is defined now
                    self.unstarted[item_id] = (item, desired_views[item_id], pending[2])
                    continue
            self._try_start(item, desired_views[item_id])
        with self._lock:
            for item_id in [item_id for item_id in self.unstarted if item_id not in desired]:
                del self.unstarted[item_id]

    def restart_failed(self) -> None:
        """Start again, once their backoff has passed, the sources whose start or batch failed."""
        now = time.monotonic()
        with self._lock:
            due = [(item, views) for item, views, retry_at in self.unstarted.values() if retry_at <= now]
            for item, _ in due:
                del self.unstarted[item.id]
        for item, views in due:
            self._try_start(item, views)

    def _try_start(self, item: Any, views: list[MaterializedView]) -> None:
        try:
            self.start_source(item, views)
        except Exception as exc:  # noqa: BLE001 - one source must not stop the others
            log.exception("starting %s failed; retrying", item.materialization)
            self._failed(item, views, exc)

    def start_source(self, item: Any, views: list[MaterializedView] | None = None) -> None:
        kind = query_kind(item)
        views = list(views or [])
        log_dir = self.data_dir / "logs" / item.id
        source_views, failed = kind.compile_views(item, views)
        for view, error in failed:
            log.error("materialized view %s cannot be maintained: %s", view.name, error)
        runtime = open_runtime(kind, item, source_views, self.driver_address, self.spark)
        try:
            stored = runtime.open() or {}  # fences off any older runtime of this materialization
            if stored:
                backfill(self.spark, item, runtime, stored, source_views, log_dir, kind)
            position = int(stored.get("log_end", 0))
            committed = int(stored["batch_id"]) if stored.get("epoch") == LOOP_EPOCH else -1
            batches = kind.batches(item, runtime, LOOP_EPOCH, committed, source_views, log_dir)
            reader, schema = _reader(item, log_dir, position)
        except BaseException:
            runtime.close()
            raise
        entry = LoopEntry(item, views, runtime, batches, reader, schema, self._log_options(item.id, log_dir),
                          position, committed + 1, LogWatch(log_dir))
        with self._lock:
            self.entries[item.id] = entry
        log.warning("started %s (%s) with %d views at log offset %d", item.name, item.materialization,
                    len(source_views), position)

    def _log_options(self, log_id: str, log_dir: Path) -> dict[str, str]:
        if self.log_service is None:
            return {"path": str(log_dir)}
        return {"service": self.log_service.url, "token": self.log_service.token, "log": log_id}

    def stop_source(self, item_id: str) -> None:
        with self._lock:
            entry = self.entries.pop(item_id, None)
        if entry is None:
            return
        log.warning("stopping %s", entry.item.materialization)
        with entry.lock:  # waits for this source's batch in flight, if any
            entry.closed = True
            entry.runtime.close()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=60)
        for item_id in list(self.entries):
            self.stop_source(item_id)  # each waits for its batch in flight
        self._pool.shutdown(wait=True)

    def status_report(self) -> list[dict[str, Any]]:
        """Each source's state for headrace_internal.source_status (pipeline/status.py)."""
        with self._lock:
            items = [(item_id, entry.item, entry.last_batch_at, True) for item_id, entry in self.entries.items()]
            items += [(item_id, item, None, False) for item_id, (item, _, _) in self.unstarted.items()]
            failures, errors, last_batches = dict(self.failures), dict(self.last_errors), dict(self._last_batches)
        rows = []
        for item_id, item, last_batch_at, started in items:
            error, error_at = errors.get(item_id, (None, None))
            rows.append(status_row(f"{item.schema}.{item.name}", item.materialization, failures.get(item_id, 0),
                                   error, error_at, last_batch_at or last_batches.get(item_id), started))
        return rows

    # ------------------------------------------------------------------ the loop thread

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the loop itself must go on; per-source failures are handled inside
                log.exception("batch loop tick failed")
            self._stopping.wait(max(0.0, self.tick_s - (time.monotonic() - started)))

    def tick(self) -> int:
        """One look at every log not in a batch already; those that grew (or may have) get a batch on the pool.
        Returns how many were handed to the pool."""
        with self._lock:
            idle = [entry for entry in self.entries.values() if not entry.in_flight]
        due = [entry for entry in idle if entry.watch.may_have_grown() or entry.pending]  # stat first, then scan
        for entry in due:
            entry.in_flight = True
            self._pool.submit(self._advance, entry)
        return len(due)

    def _advance(self, entry: LoopEntry) -> None:
        try:
            with entry.lock:
                if entry.closed:
                    return
                entry.pending = self._batch(entry)
        except Exception as exc:  # noqa: BLE001 - this source restarts from the store's checkpoint
            log.error("%s: batch failed: %s; restarting it from the store's checkpoint", entry.item.materialization,
                      one_line_error(exc))
            with self._lock:
                if self.entries.get(entry.item.id) is not entry:
                    return  # stopped meanwhile
                del self.entries[entry.item.id]
            with entry.lock:
                entry.closed = True
                entry.runtime.close()
            self._failed(entry.item, entry.views, exc, entry.last_batch_at)
        finally:
            entry.in_flight = False

    def _batch(self, entry: LoopEntry) -> bool:
        """The source's next batch, if its log grew; whether it had one."""
        start = entry.position
        end = entry.reader.latestOffset()["offset"]
        if end <= start:
            entry.runtime.finish_commit()  # a commit in flight that failed shows now, not at the next batch
            return False
        ranges = entry.reader.partitions({"offset": start}, {"offset": end})
        batch_id = entry.next_batch_id
        if len(ranges) == 1 or self.log_service is None:
            # Read here, handed over as Arrow: every batch in local mode (Spark's tasks would decode in Python
            # workers, planned by a Python process per read: measured slower, docs/pipeline.md), and on a cluster
            # every batch of a source that keeps up.
            read_started = time.monotonic()
            table = pa.Table.from_batches([batch for part in ranges for batch in entry.reader.read(part)],
                                          schema=entry.arrow_schema)
            entry.batches.commit_arrow(table, batch_id, self.spark, read_started)
        else:  # a cluster's backlog: its executors read the ranges in parallel, through the log read service
            frame = (self.spark.read.format(HeadraceLogSource.name()).options(**entry.log_options)
                     .option("ranges", format_ranges(ranges)).load())
            entry.batches(frame, batch_id)
        entry.reader.commit({"offset": end})
        entry.position = end
        entry.next_batch_id = batch_id + 1
        return True

    def _failed(self, item: Any, views: list[MaterializedView], error: BaseException,
                last_batch_at: float | None = None) -> None:
        with self._lock:
            failures = self.failures.get(item.id, 0) + 1
            self.failures[item.id] = failures
            self.last_errors[item.id] = (one_line_error(error), time.time())
            if last_batch_at is not None:
                self._last_batches[item.id] = last_batch_at
            self.unstarted[item.id] = (item, views, time.monotonic() + _backoff(failures))


def _reader(item: Any, log_dir: Path, position: int) -> tuple[Any, pa.Schema]:
    """The log's offset tracker: ends (capped), partitions and reads, over the files (the pipeline process runs
    beside the server that writes them)."""
    if getattr(item, "kind", None) == "table":
        from headrace.pipeline.table_batches import TABLE_ARROW_SCHEMA, TableLogStreamReader

        return TableLogStreamReader(FileLogAccess(log_dir), position), TABLE_ARROW_SCHEMA
    return LogStreamReader(FileLogAccess(log_dir), position, position), ARROW_SCHEMA

