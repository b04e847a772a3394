"""One table's durable log in the server: appends through group commit, the acknowledged end (for
read-your-writes) and the overlay of acknowledged records the serving store may not have applied yet.

Writes to one table are serialized by `lock` (held by the coordinator around read, compute and append), so
the overlay and the duplicate-key checks are exact across sessions."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from headrace.catalog.tables import Table
from headrace.log.group_commit import GroupCommitter, next_offset
from headrace.log.reader import read_records
from headrace.log.segments import SegmentedLog
from headrace.store.table_log import Document, RowChange, decode_changes, encode_changes

Key = tuple[Any, ...]
_Overlay = tuple[int, dict[Key, Document | None]]  # (end offset of the record, key -> row after it)


class TableLog:
    # Bumped whenever any table's acknowledged end may have grown (an open, an append): a read that found
    # every table caught up stays caught up until this or the catalog changes (Tables.behind's memo).
    acknowledgements = 0

    def __init__(self, table: Table, log_dir: Path) -> None:
        TableLog.acknowledgements += 1
        self.table = table
        self.log_dir = log_dir
        self.lock = asyncio.Lock()
        self._log = SegmentedLog(log_dir)
        self._committer = GroupCommitter(self._log, max_batch=64)
        self.acked_end = self._log.end_offset  # everything in the log at open was durable (and may have been acked)
        self._overlay: list[_Overlay] = []

    def load_unapplied(self, applied_end: int) -> int:
        """At open: the records the store has not applied yet become the overlay. Returns how many."""
        self._overlay = []
        for offset, payload in read_records(self.log_dir, applied_end, self.acked_end):
            rows = {change.key: change.new for change in decode_changes(payload)}
            self._overlay.append((next_offset(offset, payload), rows))
        return len(self._overlay)

    @property
    def next_offset(self) -> int:
        """Where the next record goes. Exact while `lock` is held (appends happen under it, and are awaited)."""
        return self._log.end_offset

    async def append(self, changes: list[RowChange], transaction: str | None = None) -> int:
        """Append one record of changes; returns once it is durable (fsync'd). Hold `lock`."""
        payload = encode_changes(changes, transaction)
        offsets = await self._committer.append_many([payload])
        end = next_offset(offsets[0], payload)
        self._overlay.append((end, {change.key: change.new for change in changes}))
        self.acked_end = max(self.acked_end, end)
        TableLog.acknowledgements += 1
        return end

    def overlay(self, applied_end: int) -> dict[Key, Document | None]:
        """The rows of acknowledged records past `applied_end` (the store holds the rest), latest per key."""
        self._overlay = [entry for entry in self._overlay if entry[0] > applied_end]
        merged: dict[Key, Document | None] = {}
        for _, rows in self._overlay:
            merged.update(rows)
        return merged

    async def close(self) -> None:
        await self._committer.close()
        self._log.close()
