"""The pipeline process: a PySpark driver that runs one streaming query per source.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headrace.catalog.items import WebhookSource
from headrace.materialize.runtime import Runtime, RpcDriverConnection
from headrace.materialize.sources import source_materialization
from headrace.materialize.transport import FrameSocket
from headrace.pipeline.batches import SourceBatches
from headrace.pipeline.log_source import HeadraceLogSource
from headrace.sql.ddl import item_from_create_sql

log = logging.getLogger("headrace.pipeline")

TRIGGER_INTERVAL = "200 milliseconds"
EPOCH_FILE = "headrace-epoch"


@dataclass
class RunningSource:
    source: WebhookSource
    query: Any  # pyspark StreamingQuery
    runtime: Runtime
    started_at: float


def build_spark(master: str, data_dir: Path) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("headrace-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # Idle costs nothing: no empty micro-batches when the log has not grown.
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.local.dir", str(data_dir / "pipeline" / "tmp"))
        .config("spark.sql.warehouse.dir", str(data_dir / "pipeline" / "warehouse"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(HeadraceLogSource)
    return spark


class Pipeline:
    def __init__(self, spark: Any, data_dir: Path, driver_address: tuple[str, int]) -> None:
        self.spark = spark
        self.data_dir = data_dir
        self.driver_address = driver_address
        self.running: dict[str, RunningSource] = {}
        self.failures: dict[str, int] = {}

    def reconcile(self, sources: list[WebhookSource]) -> None:
        desired = {source.id: source for source in sources}
        for source_id in list(self.running):
            if source_id not in desired or desired[source_id].create_sql != self.running[source_id].source.create_sql:
                self.stop_source(source_id)
        for source_id, source in desired.items():
            if source_id not in self.running:
                self.start_source(source)

    def start_source(self, source: WebhookSource) -> None:
        checkpoint_dir = self.data_dir / "pipeline" / "checkpoints" / source.materialization
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        epoch = _checkpoint_epoch(checkpoint_dir)
        runtime = Runtime(RpcDriverConnection(*self.driver_address), source_materialization(source))
        stored = runtime.open() or {}
        committed_batch_id, start_offset = -1, 0
        if stored.get("epoch") == epoch:
            committed_batch_id = int(stored["batch_id"])
        elif stored:
            # A new Spark checkpoint: resume from what the store says it holds, not from zero.
            start_offset = int(stored.get("log_end", 0))
        batches = SourceBatches(source, runtime, epoch, committed_batch_id)
        frame = (self.spark.readStream.format("headrace_log")
                 .option("path", str(self.data_dir / "logs" / source.id))
                 .option("startOffset", str(start_offset)).load())
        query = (frame.writeStream.foreachBatch(batches)
                 .option("checkpointLocation", str(checkpoint_dir))
                 .queryName(source.materialization)
                 .trigger(processingTime=TRIGGER_INTERVAL)
                 .start())
        self.running[source.id] = RunningSource(source, query, runtime, time.monotonic())
        log.warning("started %s (%s) from epoch %s, committed batch %d", source.name, source.materialization,
                    epoch, committed_batch_id)

    def stop_source(self, source_id: str) -> None:
        running = self.running.pop(source_id)
        try:
            running.query.stop()
        except Exception:  # noqa: BLE001 - stopping a query mid-batch can throw; the query is gone either way
            log.exception("stopping %s", running.source.materialization)
        running.runtime.close()

    def restart_failed(self) -> None:
        """A failed query (driver error, fenced off, I/O) restarts with backoff from its checkpoint."""
        for source_id, running in list(self.running.items()):
            if running.query.isActive:
                continue
            failures = self.failures.get(source_id, 0) + 1
            self.failures[source_id] = failures
            log.error("query %s stopped: %s; restarting (attempt %d)", running.source.materialization,
                      running.query.exception(), failures)
            self.running.pop(source_id)
            try:
                running.runtime.close()
            except Exception:  # noqa: BLE001
                pass
            time.sleep(min(10.0, 0.5 * 2 ** min(failures, 5)))
            self.start_source(running.source)

    def stop(self) -> None:
        for source_id in list(self.running):
            self.stop_source(source_id)


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headrace-pipeline")
    parser.add_argument("--control", required=True)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--spark-master", default="local[*]")
    args = parser.parse_args(argv)
    _die_with_parent()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s pipeline %(levelname)s %(message)s")

    # Reads time out every second so the loop can also look after failed queries.
    control = FrameSocket.connect(*_parse_address(args.control), timeout=30.0, io_timeout=1.0)
    control.send({"type": "hello", "pid": os.getpid()})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    spark = build_spark(args.spark_master, args.data_dir)
    pipeline = Pipeline(spark, args.data_dir, _parse_address(args.driver))
    control.send({"type": "ready"})
    try:
        while not stop.is_set():
            try:
                message = control.recv()
            except (socket.timeout, TimeoutError):
                pipeline.restart_failed()
                continue
            except (ConnectionError, OSError, EOFError):
                log.warning("server went away; stopping")
                break
            if message.get("type") == "sources":
                sources = [item_from_create_sql(item["id"], item["create_sql"]) for item in message["sources"]]
                pipeline.reconcile(sources)
                control.send({"type": "reconciled", "generation": message.get("generation")})
    finally:
        pipeline.stop()
        spark.stop()
        control.close()


if __name__ == "__main__":
    main()
