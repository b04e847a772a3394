"""The pipeline side of tables: a Spark streaming data source over a table's log, and the foreachBatch that
turns each micro-batch of change records into one materialization transaction.

A table's log records (store/table_log.py) carry each change's key, new row and old row; a micro-batch
becomes, per key, the row after the batch's last change (stored) or a deletion (Flow's _meta.op = "d"),
keyed by the table's primary key (or hidden row id). The runtime checkpoint names the Spark checkpoint
epoch and batch id (a replayed batch is skipped) and `log_end` (read-your-writes waits for it).

Materialized views over a table are further bindings of the same transaction: the changes become the
change-stream contract of pipeline/views.py (+1 new row, -1 old row), see `table_changes_frame`."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from headrace.catalog.tables import Table
from headrace.log.access import FileLogAccess, LogAccess
from headrace.log.read_client import log_access_from_options
from headrace.materialize.runtime import Runtime
from headrace.pipeline.log_source import RECORD_FRAME_BYTES, DriverSideReads, record_batches
from headrace.pipeline.status import batch_stats
from headrace.store.table_log import DELETE, Document, RowChange, decode_changes
from headrace.store.table_reads import table_binding

log = logging.getLogger(__name__)
SCHEMA = "log_offset long, next_offset long, payload binary"


class _Range(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end


TABLE_ARROW_SCHEMA = pa.schema([("log_offset", pa.int64()), ("next_offset", pa.int64()), ("payload", pa.binary())])


class TableLogStreamReader(DriverSideReads):
    """Each batch is one partition, read by the driver-side reader itself (log_source.DriverSideReads: no Python
    worker task per batch)."""

    def __init__(self, log: str | LogAccess, start_offset: int) -> None:
        self.log: LogAccess = FileLogAccess(Path(log)) if isinstance(log, str) else log  # files, or the network
        self.start_offset = start_offset
        self._known_end = start_offset

    def initialOffset(self) -> dict[str, int]:
        return {"offset": self.start_offset}

    def latestOffset(self) -> dict[str, int]:
        self._known_end = max(self._known_end, self.log.scan_end(self._known_end))
        return {"offset": self._known_end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [] if end["offset"] <= start["offset"] else [_Range(start["offset"], end["offset"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        return self._batches(partition.start, partition.end)

    def getCache(self, start: dict[str, int], end: dict[str, int]) -> Iterator[pa.RecordBatch] | None:  # type: ignore[override]
        return iter(list(self._batches(start["offset"], end["offset"]))) if end["offset"] > start["offset"] else None

    def _batches(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        rows = ((offset, offset + RECORD_FRAME_BYTES + len(payload), payload)
                for offset, payload in self.log.records(start, end))
        return record_batches(rows, TABLE_ARROW_SCHEMA)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: a table's log is its history."""


class HeadraceTableLogSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "headrace_table_log"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return TableLogStreamReader(log_access_from_options(self.options), int(self.options.get("startOffset", "0")))


def net_documents(table: Table, records: Sequence[list[RowChange]]) -> list[tuple[int, list[Any], Document]]:
    """One document per key touched (the row after the last change, or a deletion), for binding 0."""
    final: dict[tuple[Any, ...], Document | None] = {}
    for changes in records:
        for change in changes:
            final[change.key] = None if change.op == DELETE else change.new
    documents: list[tuple[int, list[Any], Document]] = []
    for key, row in final.items():
        if row is None:
            deletion: Document = dict(zip(table.store_key, key))
            deletion["_meta"] = {"op": "d"}
            documents.append((0, list(key), deletion))
        else:
            documents.append((0, list(key), row))
    return documents


class TableBatches:
    """The foreachBatch function of one table's streaming query."""

    def __init__(self, table: Table, runtime: Runtime, epoch: str, committed_batch_id: int,
                 views: Sequence[Any] = (), log_dir: Path | None = None) -> None:
        self.table = table
        self.runtime = runtime
        self.epoch = epoch
        self.committed_batch_id = committed_batch_id
        self.views = tuple(views)
        self.view_ids = [view.view.id for view in self.views]
        self.binding = table_binding(table)
        self.last_batch_seconds = 0.0
        self.last_batch_at: float | None = None  # wall clock of the last transaction committed
        self.stats = batch_stats(table.materialization)  # reported: source_status, /metrics (status.py)

    def __call__(self, frame: Any, batch_id: int) -> None:
        if batch_id <= self.committed_batch_id:
            log.info("%s: batch %d already committed; skipping its replay", self.table.materialization, batch_id)
            return
        self.commit_arrow(frame.toArrow(), batch_id, frame.sparkSession)

    def commit_arrow(self, arrow: pa.Table, batch_id: int, spark: Any, read_started: float | None = None) -> None:
        """One batch of the table's log as Arrow (TABLE_ARROW_SCHEMA); also the batch loop's entry
        (pipeline/batch_loop.py: `read_started`, when it began reading the rows). Spark is used only by the views."""
        if batch_id <= self.committed_batch_id:
            return
        started = time.monotonic() if read_started is None else read_started
        if arrow.num_rows == 0:
            return
        columns = arrow.to_pydict()
        records = [decode_changes(payload) for payload in columns["payload"]]
        checkpoint = {"epoch": self.epoch, "batch_id": batch_id, "log_end": max(columns["next_offset"]),
                      "views": self.view_ids}
        documents: list[tuple[int, list[Any], Document]] = net_documents(self.table, records)
        collected = time.monotonic()
        if self.views:
            from headrace.pipeline.table_views import view_documents_and_errors
            from headrace.pipeline.view_errors import ERRORS_FIELD

            found, errors = view_documents_and_errors(spark, self.table, self.views, records)
            documents.extend(found)
            if errors:  # rows a view cannot evaluate: errors of the view, not a failed batch (pipeline/view_errors.py)
                checkpoint[ERRORS_FIELD] = errors
        viewed = time.monotonic()
        self.runtime.transact(documents, checkpoint)
        self.committed_batch_id = batch_id
        self.last_batch_at = time.time()
        self.last_batch_seconds = time.monotonic() - started
        self.stats.observe(arrow.num_rows, {"read": 0.0, "source_rows": collected - started,
                                            "views": viewed - collected, "transaction": time.monotonic() - viewed})


def _read_table_log(spark: Any, log_options: dict[str, str], start_offset: int, stored: dict[str, Any]) -> Any:
    return (spark.readStream.format(HeadraceTableLogSource.name())
            .options(**log_options).option("startOffset", str(start_offset)).load())


def _no_derived(spark: Any, views: Sequence[Any]) -> list[Any]:
    return []  # views over views over a table are not maintained yet


def _table_query() -> Any:
    """The table's parts of Pipeline.start_source's one start path (pipeline/process.py QueryKind)."""
    from headrace.pipeline.process import QueryKind
    from headrace.pipeline.table_views import backfill_documents, compile_table_views

    return QueryKind(compile_table_views, table_binding, _no_derived, backfill_documents, TableBatches,
                     _read_table_log)


def is_table_entry(create_sql: str) -> bool:
    """Whether a control-message item is a table (its statement is CREATE TABLE)."""
    return create_sql.lstrip()[:12].upper().startswith("CREATE TABLE")


TABLE_QUERY = _table_query()
