"""foreachBatch: each Spark micro-batch becomes one materialization transaction.

Spark reads and decodes the new range of the log (pipeline/log_source.py: bounded batches, read in parallel
as Arrow). The batch is collected once as Arrow in log order and turned, column by column, into the net
changes of the source table, keyed by log offset: a new row is stored under its offset; a replacement (a row
whose idempotency key was seen within the window, decided at ingest) deletes the row at its `prev_offset` and
stores itself. A replacement of a row from the same micro-batch just takes its place. The source rows go to
the serving driver as ONE columnar Store (protocol.StoreColumns: an Arrow table of new rows, plus the deleted
offsets), not as a Python dict and a JSON message per row: their keys are fresh log offsets, so they need no
Load and no reduction. The runtime checkpoint names the Spark checkpoint epoch and batch id, so a batch that
Spark replays after a crash (offsets written, commit not) is recognised and not applied twice.

Materialized views over the source are further bindings of the same transaction (view_changes.py). Their
partial documents are computed on the DataFrame Spark handed to foreachBatch (persisted once, since both the
collection above and the views read it), not on a frame rebuilt from the collected Arrow table; the old
versions of replaced rows are a small extra frame, unioned only when the batch has replacements. A change a view
cannot evaluate (a cast out of range, a division by zero) does not fail the batch: the batch takes that path, the
change is left out of that view only and its error rides in the checkpoint (pipeline/view_errors.py)."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from headrace.catalog.items import WebhookSource
from headrace.materialize.columnar import ColumnarDocuments
from headrace.materialize.protocol import StoreColumns
from headrace.materialize.runtime import Runtime
from headrace.materialize.sources import source_binding
from headrace.pipeline.quarantine import (QUARANTINE_FIELD, QUARANTINE_SOURCE_FIELD, QuarantinedRecord,
                                          refused_records, without_records)
from headrace.pipeline.view_changes import OneJobBatch, SourceView, batch_changes, input_table, view_documents_isolating
from headrace.pipeline.status import batch_stats
from headrace.pipeline.view_errors import ERRORS_FIELD, ErrorEntry, is_data_error

log = logging.getLogger(__name__)
# A batch taking longer is logged with where its time went (HEADRACE_SLOW_BATCH_S=0 logs every batch).
SLOW_BATCH_S = float(os.environ.get("HEADRACE_SLOW_BATCH_S", "2.0"))


class SourceBatches:
    """The foreachBatch function of one source's streaming query."""

    def __init__(self, source: WebhookSource, runtime: Runtime, epoch: str, committed_batch_id: int,
                 views: Sequence[SourceView] = (), log_dir: Path | None = None) -> None:
        self.source = source
        self.views = tuple(views)  # maintained in the same transactions (pipeline/view_changes.py)
        self.view_ids = [view.view.id for view in self.views]
        self.log_dir = log_dir  # where replaced rows are read back from, for the views' retractions
        self.runtime = runtime
        self.epoch = epoch
        self.committed_batch_id = committed_batch_id
        self.binding = source_binding(source)
        self.last_batch_seconds = 0.0
        self.last_batch_at: float | None = None  # wall clock of the last transaction handed to the store
        self.stats = batch_stats(self.source.materialization)  # reported: source_status, /metrics (status.py)
        # One Spark job per batch when every view qualifies (view_changes.OneJobBatch); else persist + a job per view.
        self.one_job = OneJobBatch(source, self.views) if OneJobBatch.eligible(source, self.views) else None

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        if batch_id <= self.committed_batch_id:
            log.info("%s: batch %d already committed to the store; skipping its replay",
                     self.source.materialization, batch_id)
            return
        started = time.monotonic()
        if self.one_job is not None:
            try:
                self._one_job(frame, batch_id, started)
                return
            except Exception as exc:  # noqa: BLE001 - a row a view cannot evaluate: the general path isolates it
                if not is_data_error(exc):
                    raise
                log.warning("%s: batch %d has changes a view cannot evaluate; isolating them (pipeline/view_errors.py)",
                            self.source.materialization, batch_id)
        self._persisted(frame, batch_id, started)

    def commit_arrow(self, table: pa.Table, batch_id: int, spark: Any, read_started: float | None = None) -> None:
        """The batch loop's entry (pipeline/batch_loop.py): a batch the pipeline read itself, as Arrow in log order.

        The rows become the source's net changes as they are; nothing needs Spark without views. With views, only
        the columns they read go to Spark (a DataFrame of Arrow batches, pipeline/process.py build_spark) and only
        their projection comes back (OneJobBatch.project), else the views' general path runs on a DataFrame of the
        rows. `read_started`: when the loop began reading the rows (the batch's log line counts it as its read)."""
        if batch_id <= self.committed_batch_id or table.num_rows == 0:
            return
        read = time.monotonic()
        started = read if read_started is None else read_started
        checkpoint = self._checkpoint(batch_id, table)
        refused = refused_records(self.source, table)
        if refused:
            table = self._quarantine_rows(refused, table, checkpoint)
        source_rows = self.source_rows(table)
        collected = time.monotonic()
        documents: list[tuple[int, list[Any], dict[str, Any]]] = []
        columnar: list[ColumnarDocuments] = []
        if self.views and table.num_rows:
            documents, columnar, errors = self._arrow_view_documents(spark, table, batch_id)
            if errors:  # the error states of rows a view cannot evaluate (pipeline/view_errors.py)
                checkpoint[ERRORS_FIELD] = errors
        self._commit(batch_id, table, documents, checkpoint, source_rows, (started, read, collected, time.monotonic()),
                     columnar)

    def _arrow_view_documents(self, spark: Any, table: pa.Table, batch_id: int,
                              ) -> tuple[list[tuple[int, list[Any], dict[str, Any]]], list[ColumnarDocuments],
                                         list[ErrorEntry]]:
        if self.one_job is not None:
            try:
                projected = self.one_job.project(spark, table)
                documents, columnar = self.one_job.documents(spark, table, projected, self.log_dir)
                return documents, columnar, []
            except Exception as exc:  # noqa: BLE001 - a row a view cannot evaluate: the general path isolates it
                if not is_data_error(exc):
                    raise
                log.warning("%s: batch %d has changes a view cannot evaluate; isolating them (pipeline/view_errors.py)",
                            self.source.materialization, batch_id)
        documents, errors = self._view_documents(spark.createDataFrame(table), table)
        return documents, [], errors

    def _persisted(self, frame: DataFrame, batch_id: int, started: float) -> None:
        """The batch computed on the DataFrame persisted once, each view by a Spark job of its own."""
        if self.views:
            frame = frame.persist()  # read and decoded once for the collection and every view
        persisted = frame
        try:
            table = frame.toArrow()  # partitions are ordered offset ranges: rows arrive in log order
            read = time.monotonic()
            if table.num_rows == 0:
                return
            checkpoint = self._checkpoint(batch_id, table)
            refused = refused_records(self.source, table)
            if refused:  # rare: left out of the source's rows and its views, recorded with the checkpoint
                table, frame = self._quarantine(refused, table, frame, checkpoint)
            source_rows = self.source_rows(table)
            collected = time.monotonic()
            documents, errors = self._view_documents(frame, table) if self.views and table.num_rows else ([], [])
            if errors:  # the error states of rows a view cannot evaluate (pipeline/view_errors.py)
                checkpoint[ERRORS_FIELD] = errors
            viewed = time.monotonic()
        finally:
            if self.views:
                persisted.unpersist()
        self._commit(batch_id, table, documents, checkpoint, source_rows, (started, read, collected, viewed))

    def _one_job(self, frame: DataFrame, batch_id: int, started: float) -> None:
        assert self.one_job is not None
        table, projected = self.one_job.collect(frame)  # log order, as above
        read = time.monotonic()
        if table.num_rows == 0:
            return
        checkpoint = self._checkpoint(batch_id, table)
        refused = refused_records(self.source, table)
        if refused:  # rare: collected again without them (a second Spark job)
            table, frame = self._quarantine(refused, table, frame, checkpoint)
            table, projected = self.one_job.collect(frame)
        source_rows = self.source_rows(table)
        collected = time.monotonic()
        documents, columnar = ([], []) if table.num_rows == 0 else \
            self.one_job.documents(frame.sparkSession, table, projected, self.log_dir)
        self._commit(batch_id, table, documents, checkpoint, source_rows, (started, read, collected, time.monotonic()),
                     columnar)

    def _quarantine(self, refused: list[QuarantinedRecord], table: pa.Table, frame: DataFrame,
                    checkpoint: dict[str, Any]) -> tuple[pa.Table, DataFrame]:
        """The batch without the records the store refuses; they are listed in the checkpoint, which the serving
        driver records in the same transaction (pipeline/quarantine.py)."""
        from pyspark.sql import functions as F

        offsets = [record.log_offset for record in refused]
        return self._quarantine_rows(refused, table, checkpoint), frame.filter(~F.col("log_offset").isin(offsets))

    def _quarantine_rows(self, refused: list[QuarantinedRecord], table: pa.Table,
                         checkpoint: dict[str, Any]) -> pa.Table:
        for record in refused:
            log.warning("%s: quarantined the record at log offset %d: %s", self.source.materialization,
                        record.log_offset, record.refusal.describe())
        checkpoint[QUARANTINE_FIELD] = [record.as_checkpoint_entry() for record in refused]
        checkpoint[QUARANTINE_SOURCE_FIELD] = f"{self.source.schema}.{self.source.name}"
        return without_records(table, refused)

    def _checkpoint(self, batch_id: int, table: pa.Table) -> dict[str, Any]:
        """The runtime checkpoint this batch commits with. `views`: the views whose state it includes (a view
        missing here is backfilled)."""
        log_end = pc.max(table["next_offset"]).as_py()
        return {"epoch": self.epoch, "batch_id": batch_id, "log_end": log_end, "views": self.view_ids}

    def _commit(self, batch_id: int, table: pa.Table, documents: list[tuple[int, list[Any], dict[str, Any]]],
                checkpoint: dict[str, Any], source_rows: StoreColumns,
                marks: tuple[float, float, float, float], columnar: Sequence[ColumnarDocuments] = ()) -> None:
        started, read, collected, viewed = marks
        # Pipelined: the driver commits while Spark runs the next batch; the next transaction awaits StartedCommit
        # first (discard_checkpoint_ahead_of_store keeps this exactly once across crashes).
        self.runtime.transact(documents, checkpoint, [source_rows], columnar, wait_for_commit=False)
        self.committed_batch_id = batch_id
        self.last_batch_at = time.time()
        self.last_batch_seconds = time.monotonic() - started
        self.stats.observe(table.num_rows, {"read": read - started, "source_rows": collected - read,
                                            "views": viewed - collected, "transaction": time.monotonic() - viewed})
        if self.last_batch_seconds > SLOW_BATCH_S:
            phases = " ".join(f"{name} {seconds:.2f}" for name, seconds in self.runtime.phase_seconds.items())
            documents_count = len(documents) + sum(batch.partials.num_rows for batch in columnar)
            log.warning("%s: batch %d of %d rows, %d view documents took %.2f s (read %.2f, source rows %.2f, "
                        "views %.2f, transaction %.2f: %s)", self.source.materialization, batch_id, table.num_rows,
                        documents_count, self.last_batch_seconds, read - started, collected - read,
                        viewed - collected, time.monotonic() - viewed, phases)

    def source_rows(self, table: pa.Table) -> StoreColumns:
        """The batch's net changes of the source table as one columnar Store (binding 0).

        A row replaced within the batch is neither stored nor deleted (its replacement takes its place); one
        stored by an earlier transaction is deleted by key (a key the store lacks is ignored)."""
        offsets, previous = table["log_offset"], table["prev_offset"]
        replaced = pc.drop_null(previous)
        if len(replaced):
            kept = table.filter(pc.invert(pc.is_in(offsets, value_set=replaced.combine_chunks())))
            earlier = pc.filter(replaced, pc.invert(pc.is_in(replaced, value_set=offsets.combine_chunks())))
            deleted = pa.table({"log_offset": earlier}) if len(earlier) else None
        else:
            kept, deleted = table, None
        return StoreColumns(0, rows=input_table(self.source, kept), deleted=deleted)

    def _view_documents(self, frame: DataFrame, table: pa.Table) -> tuple[list[tuple[int, list[Any], dict[str, Any]]],
                                                                          list[ErrorEntry]]:
        changes = batch_changes(frame, self.source, table, self.log_dir)
        return view_documents_isolating(self.views, changes)


def spark_committed_batch(checkpoint_dir: Path) -> int | None:
    """The newest batch id Spark recorded as done (`commits/<id>`), or None."""
    commits = checkpoint_dir / "commits"
    ids = [int(path.name) for path in commits.iterdir() if path.name.isdigit()] if commits.is_dir() else []
    return max(ids, default=None)


def discard_checkpoint_ahead_of_store(checkpoint_dir: Path, epoch: str, stored: dict[str, Any]) -> bool:
    """Empty a Spark checkpoint that recorded batches the store does not hold; True if it did (take a new epoch).

    SourceBatches returns from foreachBatch once StartCommit is sent, so Spark may record batch N done while the
    store's commit of N fails or a crash cuts it: resuming after N would lose it. The store is the authority: such
    a checkpoint is dropped and the query resumes from the store's `log_end` under a new epoch, as after a lost
    Spark checkpoint. Called only while no query uses the directory."""
    committed = spark_committed_batch(checkpoint_dir)
    if committed is None or (stored.get("epoch") == epoch and committed <= int(stored.get("batch_id", -1))):
        return False
    log.warning("Spark checkpoint %s recorded batch %d, the store holds %s of epoch %s: resuming from the store's "
                "log end %s", checkpoint_dir, committed, stored.get("batch_id"), stored.get("epoch"),
                stored.get("log_end", 0))
    for path in checkpoint_dir.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return True


def deletion(offset: int) -> dict[str, Any]:
    """A document that deletes the row at `offset` (Flow's convention: _meta.op = "d")."""
    return {"log_offset": offset, "_meta": {"op": "d"}}
