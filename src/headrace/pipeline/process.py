"""The pipeline process: a PySpark driver that keeps every source and table materialized.

By default one driver-side loop serves every source and table (pipeline/batch_loop.py); with Spark Connect, or
HEADRACE_PIPELINE_MODE=streaming, each source and table is one Structured Streaming query (Pipeline, below).

It shares no memory with the server: it learns the catalog over a control connection and talks to
the serving-store driver over the materialization protocol, so the same code can run against a
Spark cluster. It exits when the server goes away (control connection closed, or the parent
died: PR_SET_PDEATHSIG)."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from headrace.catalog.items import WebhookSource
from headrace.catalog.views import MaterializedView
from headrace.log.read_client import RemoteLogAccess
from headrace.log.read_service import TOKEN_ENV
from headrace.materialize.protocol import MaterializationSpec
from headrace.materialize.reduce import combine_lww, reducer_for_schema
from headrace.materialize.runtime import Runtime, RpcDriverConnection
from headrace.materialize.sources import source_binding
from headrace.materialize.transport import FrameSocket
from headrace.pipeline.batches import SLOW_BATCH_S, SourceBatches, discard_checkpoint_ahead_of_store
from headrace.pipeline.log_source import HeadraceLogSource
from headrace.pipeline.spark_master import BadSparkMaster, check_reachable, parse_master
from headrace.pipeline.status import one_line_error, status_row
from headrace.pipeline.view_changes import SourceView, backfill_documents, compile_source_views, derived_bindings
from headrace.sql.ddl import item_from_create_sql

log = logging.getLogger("headrace.pipeline")

TRIGGER_INTERVAL = "200 milliseconds"
EPOCH_FILE = "headrace-epoch"


@dataclass
class RunningSource:
    source: WebhookSource
    views: list[MaterializedView]  # maintained in the source's transactions
    query: Any  # pyspark StreamingQuery
    runtime: Runtime
    started_at: float
    batches: Any = None  # the foreachBatch function (SourceBatches): when it last committed

    @property
    def last_batch_at(self) -> float | None:
        return getattr(self.batches, "last_batch_at", None)

    @property
    def definition(self) -> tuple[Any, ...]:
        return _definition(self.source, self.views)


@dataclass(frozen=True)
class QueryKind:
    """What differs between a source's streaming query and a table's (pipeline/table_batches.py TABLE_QUERY);
    Pipeline.start_source and Pipeline._backfill are the one start path of both."""
    compile_views: Callable[[Any, list[MaterializedView]], tuple[list[SourceView], list[tuple[MaterializedView, Exception]]]]
    binding: Callable[[Any], Any]
    derived: Callable[[Any, list[SourceView]], list[Any]]  # (spark, views) -> views over views
    backfill_documents: Callable[[Any, Any, Path, int, list[SourceView]], list[Any]]  # (spark, item, log, end, views)
    batches: Callable[[Any, Runtime, str, int, list[SourceView], Any], Any]  # the foreachBatch function (log: Path | LogAccess)
    # (spark, the log's options (log_source.py: path, or service + token + log), start offset, stored) -> frame
    read_stream: Callable[[Any, dict[str, str], int, dict[str, Any]], Any]


def _read_source_log(spark: Any, log_options: dict[str, str], start_offset: int, stored: dict[str, Any]) -> Any:
    return (spark.readStream.format("headrace_log")
            .options(**log_options)
            .option("startOffset", str(start_offset))
            .option("resumeOffset", str(int(stored.get("log_end", start_offset))))  # log_source.py
            .load())


SOURCE_QUERY = QueryKind(compile_source_views, source_binding, derived_bindings, backfill_documents, SourceBatches,
                         _read_source_log)


def _definition(source: WebhookSource, views: list[MaterializedView]) -> tuple[Any, ...]:
    """What a source's query is started from: a change restarts the query with the new spec."""
    return (source.create_sql, tuple((view.id, view.create_sql) for view in views))


def views_by_source(sources: list[WebhookSource], views: list[MaterializedView]) -> dict[str, list[MaterializedView]]:
    """Each source's views, in dependency order; a view over a view belongs to its root source."""
    by_name = {(source.schema, source.name): source.id for source in sources}
    grouped: dict[str, list[MaterializedView]] = {source.id: [] for source in sources}
    for view in views:  # catalog order is dependency order, so a view's input view is assigned before it
        source_id = by_name.get((view.input_schema, view.input_name))
        if source_id is not None:
            grouped[source_id].append(view)
            by_name[(view.schema, view.name)] = source_id  # a view over this view joins the same source
    return grouped


# Session settings that Spark Connect lets a client set (the rest of build_spark's are the Connect server's own).
SESSION_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.checkpointFileManagerClass":  # see build_spark
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
}


def build_spark(master: str, data_dir: Path) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", "120")  # the same, for workers the conf does not reach
    from pyspark.sql import SparkSession

    if parse_master(master).is_connect:
        return build_connect_session(master)
    spark = (
        SparkSession.builder.master(master)
        .appName("headrace-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # Idle costs nothing: no empty micro-batches when the log has not grown.
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # The default (FileContext-based) manager renames through Hadoop's AbstractFileSystem, which on the local
        # file system forks `readlink` from the JVM for every checkpoint file: ~0.2-0.4 s per micro-batch here
        # (offsets + commits). The FileSystem-based one renames with rename(2): atomic on a local disk all the same.
        .config("spark.sql.streaming.checkpointFileManagerClass",
                "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager")
        .config("spark.driver.memory", "1g")
        # A streaming Python data source's runner process connects back to the JVM within this timeout (15 s by
        # default); with a dozen sources on 2 busy cores it took longer, and the stream hung unstarted.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .config("spark.local.dir", str(data_dir / "pipeline" / "tmp"))
        # Executors on other machines run this Python (default: the pipeline's own path, which must exist there).
        .config("spark.pyspark.python", os.environ.get("HEADRACE_EXECUTOR_PYTHON") or sys.executable)
        .config("spark.sql.warehouse.dir", str(data_dir / "pipeline" / "warehouse"))
        # createDataFrame(pyarrow.Table) (the batch loop's rows, retractions, backfill chunks): Arrow batches that
        # Spark's tasks convert in the JVM, as a streaming batch's rows handed over by getCache are, not a driver-side
        # LocalRelation (below 48 MB by default), whose projection the optimizer evaluates row by row, uncompiled
        # (ConvertToLocalRelation): measured 2-3x slower per batch, 5-8x for the first (docs/pipeline.md).
        .config("spark.sql.execution.arrow.localRelationThreshold", "0")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    _register_sources(spark)
    if "HEADRACE_SLOW_BATCH_S" in os.environ:  # diagnostics only: see SlowTriggerLog
        spark.streams.addListener(SlowTriggerLog())
    return spark


def _register_sources(spark: Any) -> None:
    spark.dataSource.register(HeadraceLogSource)
    from headrace.pipeline.table_batches import HeadraceTableLogSource  # tables' logs

    spark.dataSource.register(HeadraceTableLogSource)


def build_connect_session(url: str) -> Any:
    """A Spark Connect session (the server was started by someone else), checked first: the foreachBatch code and
    the Python data sources run in the Connect server's Python workers, which need the same Python minor version
    and headrace importable (connect_check.py)."""
    from pyspark.sql import SparkSession

    from headrace.pipeline.connect_check import check_connect_server

    spark = SparkSession.builder.remote(url).getOrCreate()
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)
    check_connect_server(spark)
    _register_sources(spark)
    return spark


class SlowTriggerLog(StreamingQueryListener):
    """Logs Spark's own phases (latestOffset, walCommit, addBatch = foreachBatch, commitOffsets, ...) of a trigger
    slower than HEADRACE_SLOW_BATCH_S: the part of a batch's time that foreachBatch (batches.py) cannot see.

    Registered only when that variable is set: a Python listener costs the JVM's listener thread ~25% of a core at
    3 micro-batches/s (each progress event is converted for Python through py4j), CPU the server's requests need."""

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        durations = progress.durationMs
        if durations.get("triggerExecution", 0) / 1000 > SLOW_BATCH_S:
            log.warning("%s: trigger of batch %d (%d rows): %s", progress.name, progress.batchId,
                        progress.numInputRows, " ".join(f"{k} {v}" for k, v in sorted(durations.items())))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


@dataclass(frozen=True)
class LogService:
    """The headrace server's log read service (log/read_service.py), which Spark reads the logs through when it
    may run elsewhere (any master but local[...])."""
    url: str  # http://host:port
    token: str


def open_runtime(kind: QueryKind, source: Any, source_views: list[SourceView], driver_address: tuple[str, int],
                 spark: Any) -> Runtime:
    """A (not yet opened) runtime for a source's or table's materialization: its binding, then its views'."""
    spec = MaterializationSpec(name=source.materialization,
                               bindings=(kind.binding(source), *(v.binding for v in source_views)))
    return Runtime(RpcDriverConnection(*driver_address), spec,
                   reducers=[combine_lww, *(reducer_for_schema(v.plan.reduce_schema) for v in source_views)],
                   finalizers=[None, *(v.plan.finalize for v in source_views)],
                   derived=kind.derived(spark, source_views))  # views over views


def backfill(spark: Any, source: Any, runtime: Runtime, stored: dict[str, Any], views: list[SourceView],
             log_dir: Path, kind: QueryKind = SOURCE_QUERY) -> None:
    """Views the stored checkpoint does not include start from the source's rows so far, in one transaction
    that also records them as included (pipeline/view_changes.py)."""
    included = set(stored.get("views") or ())
    missing = [view for view in views if view.view.id not in included]
    if not missing:
        return
    started = time.monotonic()
    end = int(stored.get("log_end", 0))
    documents = kind.backfill_documents(spark, source, log_dir, end, missing)
    runtime.transact(documents, {**stored, "views": [view.view.id for view in views]})
    log.warning("backfilled %s over %s up to offset %d: %d documents in %.1f s",
                ", ".join(view.view.name for view in missing), source.name, end, len(documents),
                time.monotonic() - started)


def query_kind(item: Any) -> QueryKind:
    if getattr(item, "kind", None) == "table":  # a table's log and records (pipeline/table_batches.py)
        from headrace.pipeline.table_batches import TABLE_QUERY

        return TABLE_QUERY
    return SOURCE_QUERY


class Pipeline:
    def __init__(self, spark: Any, data_dir: Path, driver_address: tuple[str, int],
                 log_service: LogService | None = None, connect: bool = False) -> None:
        self.connect = connect  # Spark Connect: foreachBatch runs on the server's side (connect_batches.py)
        self.spark = spark
        self.data_dir = data_dir
        self.driver_address = driver_address
        self.log_service = log_service  # None: the log files are read directly (local mode)
        self.running: dict[str, RunningSource] = {}
        self.failures: dict[str, int] = {}
        self.unstarted: dict[str, tuple[WebhookSource, list[MaterializedView]]] = {}  # start failed: retried
        self.last_errors: dict[str, tuple[str | None, float]] = {}  # per source: its last failure, and when
        self._last_batches: dict[str, float] = {}  # per source: its last commit, kept across restarts of its query

    def reconcile(self, sources: list[WebhookSource], views: list[MaterializedView] | None = None) -> None:
        desired = {source.id: source for source in sources}
        desired_views = views_by_source(sources, views or [])
        for source_id in list(self.running):
            if source_id not in desired or \
                    _definition(desired[source_id], desired_views[source_id]) != self.running[source_id].definition:
                self.stop_source(source_id)
        self.unstarted = {}
        for source_id, source in desired.items():
            if source_id not in self.running:
                self._try_start(source, desired_views[source_id])

    def _try_start(self, source: WebhookSource, views: list[MaterializedView]) -> None:
        """Start a source's query; a failure (driver unreachable, backfill error) is retried later."""
        try:
            self.start_source(source, views)
        except Exception as exc:  # noqa: BLE001 - one source must not stop the others
            log.exception("starting %s failed; retrying", source.materialization)
            self.unstarted[source.id] = (source, views)
            self.failures[source.id] = self.failures.get(source.id, 0) + 1
            self.last_errors[source.id] = (one_line_error(exc), time.time())

    def start_source(self, source: WebhookSource, views: list[MaterializedView] | None = None) -> None:
        kind = query_kind(source)
        views = list(views or [])
        checkpoint_dir = self.data_dir / "pipeline" / "checkpoints" / source.materialization
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        remove_torn_checkpoint_writes(checkpoint_dir)
        log_dir = self.data_dir / "logs" / source.id
        epoch = _checkpoint_epoch(checkpoint_dir)
        source_views, failed = kind.compile_views(source, views)
        for view, error in failed:
            log.error("materialized view %s cannot be maintained: %s", view.name, error)
        runtime = open_runtime(kind, source, source_views, self.driver_address, self.spark)
        try:
            stored = runtime.open() or {}
            if discard_checkpoint_ahead_of_store(checkpoint_dir, epoch, stored):  # pipelined commits: batches.py
                epoch = _checkpoint_epoch(checkpoint_dir)
            committed_batch_id, start_offset = -1, 0
            if stored.get("epoch") == epoch:
                committed_batch_id = int(stored["batch_id"])
            elif stored:
                # A new Spark checkpoint: resume from what the store says it holds, not from zero.
                start_offset = int(stored.get("log_end", 0))
            if stored:
                self._backfill(source, runtime, stored, source_views, log_dir, kind)
            if self.connect:
                # foreachBatch runs on the Connect server: it opens a runtime of its own there (fencing this one,
                # closed now), so nothing here but the query's handle lives on.
                from headrace.pipeline.connect_batches import RemoteBatches

                runtime.close()
                batches = RemoteBatches(source.id, source.create_sql, [view.to_entry() for view in views],
                                        self.driver_address, epoch, self.log_access(source.id, log_dir))
            else:
                batches = kind.batches(source, runtime, epoch, committed_batch_id, source_views,
                                       self.log_access(source.id, log_dir))
            frame = kind.read_stream(self.spark, self.log_options(source.id, log_dir), start_offset, stored)
            query = (frame.writeStream.foreachBatch(batches)
                     .option("checkpointLocation", str(checkpoint_dir))
                     .queryName(source.materialization)
                     .trigger(processingTime=TRIGGER_INTERVAL)
                     .start())
        except BaseException:
            runtime.close()
            raise
        self.running[source.id] = RunningSource(source, views, query, runtime, time.monotonic(), batches)
        log.warning("started %s (%s) with %d views from epoch %s, committed batch %d", source.name,
                    source.materialization, len(source_views), epoch, committed_batch_id)

    def log_options(self, log_id: str, log_dir: Path) -> dict[str, str]:
        """How the data source reaches a log: its directory, or the log read service (log_source.py's options)."""
        if self.log_service is None:
            return {"path": str(log_dir)}
        # Spark redacts options named like *token* from plans and logs (spark.redaction.regex).
        return {"service": self.log_service.url, "token": self.log_service.token, "log": log_id}

    def log_access(self, log_id: str, log_dir: Path) -> Path | RemoteLogAccess:
        """Where foreachBatch reads replaced rows from (view_changes.read_replaced): with Spark Connect it runs on the
        Connect server, so through the service as the data source does."""
        if self.log_service is None:
            return log_dir
        return RemoteLogAccess(self.log_service.url, self.log_service.token, log_id)

    def _backfill(self, source: WebhookSource, runtime: Runtime, stored: dict[str, Any],
                  views: list[SourceView], log_dir: Path, kind: QueryKind = SOURCE_QUERY) -> None:
        backfill(self.spark, source, runtime, stored, views, log_dir, kind)

    def stop_source(self, source_id: str) -> None:
        running = self.running.pop(source_id)
        log.warning("stopping %s", running.source.materialization)
        try:
            running.query.stop()
        except Exception:  # noqa: BLE001 - stopping a query mid-batch can throw; the query is gone either way
            log.exception("stopping %s", running.source.materialization)
        running.runtime.close()

    def restart_failed(self) -> None:
        """A failed query (driver error, fenced off, I/O) restarts with backoff from its checkpoint."""
        for source_id, (source, views) in list(self.unstarted.items()):
            failures = self.failures.get(source_id, 1)  # counted when the start failed
            time.sleep(min(10.0, 0.5 * 2 ** min(failures, 5)))
            del self.unstarted[source_id]
            self._try_start(source, views)
        for source_id, running in list(self.running.items()):
            if running.query.isActive:
                continue
            failures = self.failures.get(source_id, 0) + 1
            self.failures[source_id] = failures
            error = running.query.exception()
            self.last_errors[source_id] = (one_line_error(error) or "the query stopped", time.time())
            if running.last_batch_at is not None:
                self._last_batches[source_id] = running.last_batch_at
            log.error("query %s stopped: %s; restarting (attempt %d)", running.source.materialization,
                      error, failures)
            self.running.pop(source_id)
            try:
                running.runtime.close()
            except Exception:  # noqa: BLE001
                pass
            time.sleep(min(10.0, 0.5 * 2 ** min(failures, 5)))
            self._try_start(running.source, running.views)

    def stop(self) -> None:
        for source_id in list(self.running):
            self.stop_source(source_id)

    def status_report(self) -> list[dict[str, Any]]:
        """Each source's state for headrace_internal.source_status (pipeline/status.py)."""
        rows = []
        sources = [(source_id, running.source, True) for source_id, running in self.running.items()]
        sources += [(source_id, source, False) for source_id, (source, _) in self.unstarted.items()]
        for source_id, source, started in sources:
            running = self.running.get(source_id)
            last_batch_at = (running.last_batch_at if running is not None else None) or \
                self._last_batches.get(source_id)
            error, error_at = self.last_errors.get(source_id, (None, None))
            rows.append(status_row(f"{source.schema}.{source.name}", source.materialization,
                                   self.failures.get(source_id, 0), error, error_at, last_batch_at, started))
        return rows


def remove_torn_checkpoint_writes(checkpoint_dir: Path) -> list[Path]:
    """Delete the temporary files of Spark checkpoint writes cut short by a kill -9 (`offsets/.0.<uuid>.tmp`).

    Spark writes each offsets/commits entry to a hidden temporary file and renames it; a leftover one makes
    Spark 4.1 refuse to start a query whose log is otherwise empty (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY).
    The write never completed, so nothing refers to it; called only while no query uses the directory."""
    removed = []
    for log_dir in (checkpoint_dir / "offsets", checkpoint_dir / "commits"):
        if log_dir.is_dir():
            for path in log_dir.iterdir():
                if path.name.startswith(".") and path.name.endswith(".tmp"):
                    path.unlink(missing_ok=True)
                    removed.append(path)
    if removed:
        log.warning("removed %d torn checkpoint writes under %s", len(removed), checkpoint_dir)
    return removed


def _checkpoint_epoch(checkpoint_dir: Path) -> str:
    """A name for this Spark checkpoint, kept in the runtime checkpoint: batch ids only identify a
    batch within one Spark checkpoint."""
    path = checkpoint_dir / EPOCH_FILE
    if not path.exists():
        temporary = path.with_suffix(".tmp")
        temporary.write_text(uuid.uuid4().hex)
        os.replace(temporary, path)
    return path.read_text().strip()


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


# "loop" (default): every source and table in one driver-side loop (pipeline/batch_loop.py): a source at rest costs no
# process, and a busy source's batches were measured as fast and fresher (docs/pipeline.md); "streaming": one
# Structured Streaming query per source and table (this module's Pipeline), the model Spark Connect always uses.
PIPELINE_MODES = ("loop", "streaming")
PIPELINE_MODE = os.environ.get("HEADRACE_PIPELINE_MODE", "loop")
EXIT_BAD_MASTER = 3  # the supervisor does not restart a pipeline that exits with this before it was ever ready


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headrace-pipeline")
    parser.add_argument("--control", required=True)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--spark-master", default="local[*]")
    parser.add_argument("--log-service", help="http://host:port of the server's log read service (token: env "
                                              f"{TOKEN_ENV}); used for every master but local[...]")
    args = parser.parse_args(argv)
    _die_with_parent()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s pipeline %(levelname)s %(message)s")

    # Reads time out every second so the loop can also look after failed queries.
    control = FrameSocket.connect(*_parse_address(args.control), timeout=30.0, io_timeout=1.0)
    control.send({"type": "hello", "pid": os.getpid()})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    try:
        master = parse_master(args.spark_master)
        check_reachable(master)
        spark = build_spark(args.spark_master, args.data_dir)
    except BadSparkMaster as error:
        log.error("%s", error)
        control.send({"type": "fatal", "message": str(error)})
        control.close()
        sys.exit(EXIT_BAD_MASTER)
    log_service = None
    if not master.is_local:
        if not args.log_service or not os.environ.get(TOKEN_ENV):
            raise SystemExit(f"--spark-master {master.url} needs --log-service and {TOKEN_ENV}")
        log_service = LogService(args.log_service, os.environ[TOKEN_ENV])
    from headrace.pipeline.batch_loop import BatchLoop  # it builds on this module

    if PIPELINE_MODE not in PIPELINE_MODES:
        log.warning("HEADRACE_PIPELINE_MODE=%r is not one of %s; running the batch loop", PIPELINE_MODE,
                    ", ".join(PIPELINE_MODES))
    pipeline: Pipeline | BatchLoop
    if master.is_connect or PIPELINE_MODE == "streaming":
        pipeline = Pipeline(spark, args.data_dir, _parse_address(args.driver), log_service, connect=master.is_connect)
    else:  # one driver-side loop for every source and table (pipeline/batch_loop.py)
        pipeline = BatchLoop(spark, args.data_dir, _parse_address(args.driver), log_service)
    control.send({"type": "ready"})
    reported: list[dict[str, Any]] = []
    try:
        while not stop.is_set():
            try:
                message = control.recv()
            except (socket.timeout, TimeoutError):
                pipeline.restart_failed()
                report = pipeline.status_report()
                if report != reported:  # headrace_internal.source_status (pipeline/status.py)
                    control.send({"type": "status", "sources": report})
                    reported = report
                continue
            except (ConnectionError, OSError, EOFError):
                log.warning("server went away; stopping")
                break
            if message.get("type") == "sources":
                from headrace.pipeline.table_batches import is_table_entry
                from headrace.sql.table_statements import table_from_create_sql

                sources = [(table_from_create_sql if is_table_entry(item["create_sql"]) else item_from_create_sql)(
                    item["id"], item["create_sql"]) for item in message["sources"]]
                views = [MaterializedView.from_entry(entry) for entry in message.get("views", [])]
                pipeline.reconcile(sources, views)
                control.send({"type": "reconciled", "generation": message.get("generation")})
    finally:
        pipeline.stop()
        spark.stop()
        control.close()


if __name__ == "__main__":
    main()
