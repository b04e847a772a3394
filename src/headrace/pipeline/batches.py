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
versions of replaced rows are a small extra frame, unioned only when the batch has replacements."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from headrace.catalog.items import WebhookSource
from headrace.materialize.protocol import StoreColumns
from headrace.materialize.runtime import Runtime
from headrace.materialize.sources import source_binding
from headrace.pipeline.view_changes import SourceView, batch_changes, input_table, view_documents_of

log = logging.getLogger(__name__)
SLOW_BATCH_S = 2.0  # a batch taking longer is logged with where its time went


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

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        if batch_id <= self.committed_batch_id:
            log.info("%s: batch %d already committed to the store; skipping its replay",
                     self.source.materialization, batch_id)
            return
        started = time.monotonic()
        if self.views:
            frame = frame.persist()  # read and decoded once for the collection and every view
        try:
            table = frame.toArrow()  # partitions are ordered offset ranges: rows arrive in log order
            if table.num_rows == 0:
                return
            log_end = pc.max(table["next_offset"]).as_py()
            # `views`: the views whose state this checkpoint includes (a view missing here is backfilled).
            checkpoint = {"epoch": self.epoch, "batch_id": batch_id, "log_end": log_end, "views": self.view_ids}
            source_rows = self.source_rows(table)
            collected = time.monotonic()
            documents = list(self._view_documents(frame, table)) if self.views else []
            viewed = time.monotonic()
        finally:
            if self.views:
                frame.unpersist()
        self.runtime.transact(documents, checkpoint, [source_rows])
        self.committed_batch_id = batch_id
        self.last_batch_seconds = time.monotonic() - started
        if self.last_batch_seconds > SLOW_BATCH_S:
            log.warning("%s: batch %d of %d rows took %.2f s (read %.2f, views %.2f, transaction %.2f)",
                        self.source.materialization, batch_id, table.num_rows, self.last_batch_seconds,
                        collected - started, viewed - collected, time.monotonic() - viewed)

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

    def _view_documents(self, frame: DataFrame, table: pa.Table) -> Iterator[tuple[int, list[Any], dict[str, Any]]]:
        changes = batch_changes(frame, self.source, table, self.log_dir)
        return view_documents_of(self.views, changes)


def deletion(offset: int) -> dict[str, Any]:
    """A document that deletes the row at `offset` (Flow's convention: _meta.op = "d")."""
    return {"log_offset": offset, "_meta": {"op": "d"}}
