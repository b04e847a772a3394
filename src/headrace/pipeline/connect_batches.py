"""foreachBatch through Spark Connect.

With Spark Connect the pipeline process is a client: the function given to foreachBatch is pickled and runs in a
Python process on the Connect server, once per query, called for each micro-batch. A source's foreachBatch
(batches.SourceBatches, table_batches.TableBatches) holds an open runtime (a connection to the materialization
driver, and its fence), which cannot be pickled. RemoteBatches carries only what rebuilds it: the item's and its
views' definitions, the driver's address (--advertise-host), the Spark checkpoint's epoch and how to read the log
(the log read service). On its first batch it opens its own runtime there, which fences off any older one, and
learns from the store's checkpoint which batch was committed last (a replayed batch is skipped, as in local mode).

Needs, on the Connect server's side: the same Python minor version and headrace importable (connect_check.py)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class RemoteBatches:
    def __init__(self, item_id: str, create_sql: str, view_entries: list[dict[str, str]],
                 driver_address: tuple[str, int], epoch: str, log_access: Any) -> None:
        self.item_id = item_id
        self.create_sql = create_sql
        self.view_entries = view_entries
        self.driver_address = tuple(driver_address)
        self.epoch = epoch
        self.log_access = log_access
        self._batches: Any = None  # built where it runs (never pickled)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_batches": None}

    @property
    def last_batch_at(self) -> float | None:
        return None  # known only on the Connect server's side

    def __call__(self, frame: Any, batch_id: int) -> None:
        if self._batches is None:
            self._batches = self._open(frame.sparkSession)
        self._batches(frame, batch_id)

    def _open(self, spark: Any) -> Any:
        from headrace.catalog.views import MaterializedView
        from headrace.pipeline.process import open_runtime, query_kind
        from headrace.pipeline.table_batches import is_table_entry
        from headrace.sql.ddl import item_from_create_sql
        from headrace.sql.table_statements import table_from_create_sql

        parse = table_from_create_sql if is_table_entry(self.create_sql) else item_from_create_sql
        item = parse(self.item_id, self.create_sql)
        kind = query_kind(item)
        views = [MaterializedView.from_entry(entry) for entry in self.view_entries]
        source_views, _failed = kind.compile_views(item, views)  # the client logged those that failed
        runtime = open_runtime(kind, item, source_views, self.driver_address, spark)  # type: ignore[arg-type]
        try:
            stored = runtime.open() or {}
        except BaseException:
            runtime.close()
            raise
        committed_batch_id = int(stored["batch_id"]) if stored.get("epoch") == self.epoch else -1
        log.warning("%s: foreachBatch opened its runtime on the Spark Connect server (committed batch %d)",
                    item.materialization, committed_batch_id)
        return kind.batches(item, runtime, self.epoch, committed_batch_id, source_views, self.log_access)
