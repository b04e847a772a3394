"""Crash-atomic COMMIT across tables: a durable commit intent written before the per-table appends.

A COMMIT that changed several tables appends one record per table log, each with its own fsync. Before the
first append it writes an intent: the transaction id and, per table, the log offset its record goes to (the
table's lock is held, so that is the log's end) and the record itself (which carries the transaction id,
store/table_log.py). It is one file under `<data>/table-commits/`, replaced durably (headrace/durable.py).
From that fsync on the transaction is decided: after the appends the intent is unlinked; at start every intent
still present is redone for each table whose log does not hold the record at its offset (the log ends there:
the append was lost), so the transaction ends up in every table or, when the crash came before the intent was
durable, in none. A stale intent whose records are all present (its unlink was lost) is just removed.

Sans-I/O apart from the files themselves; the logs are opened with SegmentedLog before the server opens them."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from headrace.durable import replace_file_durably
from headrace.log.reader import read_records
from headrace.log.segments import SegmentedLog
from headrace.store.table_log import record_transaction

log = logging.getLogger(__name__)

INTENTS_DIRECTORY = "table-commits"  # under the data root: not under logs/, whose unknown entries are orphans
_SUFFIX = ".intent"


@dataclass(frozen=True, slots=True)
class CommitIntent:
    transaction: str
    parts: dict[str, tuple[int, bytes]]  # table id -> (log offset the record is appended at, the record)

    def encode(self) -> bytes:
        return orjson.dumps({"t": self.transaction,
                             "p": {table_id: [offset, payload.decode("utf-8")]
                                   for table_id, (offset, payload) in self.parts.items()}})

    @staticmethod
    def decode(data: bytes) -> CommitIntent:
        document = orjson.loads(data)
        return CommitIntent(document["t"], {table_id: (int(offset), payload.encode("utf-8"))
                                            for table_id, (offset, payload) in document["p"].items()})


def new_transaction_id() -> str:
    return uuid.uuid4().hex


def intents_directory(data_root: Path) -> Path:
    return data_root / INTENTS_DIRECTORY


def write_intent(directory: Path, intent: CommitIntent) -> Path:
    """Make the intent durable (write, fsync, rename, fsync the directory); returns its path."""
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(directory.parent, os.O_RDONLY)
        try:
            os.fsync(descriptor)  # the new directory's entry, else the intent could vanish with it
        finally:
            os.close(descriptor)
    path = directory / f"{intent.transaction}{_SUFFIX}"
    replace_file_durably(path, intent.encode(), mode=0o600, temporary=directory / f"{intent.transaction}.tmp")
    return path


def remove_intent(path: Path) -> None:
    """After every record is durable. Not fsync'd: a resurrected intent is recognized at start (records present)."""
    path.unlink(missing_ok=True)


def holds_record(log_dir: Path, log_end: int, offset: int, transaction: str) -> bool:
    """Whether the log (ending at `log_end`) holds the transaction's record at `offset`."""
    if log_end <= offset:
        return False
    for _, payload in read_records(log_dir, offset, log_end):
        found = record_transaction(payload)
        if found != transaction:
            # Something else sits where the record was to go: the append cannot be redone in place.
            log.error("log %s: the record at offset %d belongs to transaction %s, not %s; not redoing it",
                      log_dir, offset, found, transaction)
        return True
    return False


def recover(directory: Path, log_dir_of: Callable[[str], Path | None]) -> list[tuple[str, str]]:
    """At start, before the table logs are opened: redo the missing records of every intent left behind, then
    remove it. `log_dir_of(table id)` is the table's log directory, None for a dropped table. Returns the
    (transaction, table id) pairs redone."""
    if not directory.is_dir():
        return []
    redone: list[tuple[str, str]] = []
    for path in sorted(directory.iterdir()):
        if path.suffix != _SUFFIX:
            path.unlink(missing_ok=True)  # a temporary file of an intent that never became durable
            continue
        intent = CommitIntent.decode(path.read_bytes())
        for table_id, (offset, payload) in sorted(intent.parts.items()):
            log_dir = log_dir_of(table_id)
            if log_dir is None:
                continue
            with SegmentedLog(log_dir) as table_log:
                if holds_record(log_dir, table_log.end_offset, offset, intent.transaction):
                    continue
                if table_log.end_offset != offset:
                    log.error("log %s ends at %d, not at %d where transaction %s's record goes; appending it there",
                              log_dir, table_log.end_offset, offset, intent.transaction)
                table_log.append([payload])
                table_log.sync()
                redone.append((intent.transaction, table_id))
                log.warning("table %s: redid transaction %s of an interrupted COMMIT", table_id, intent.transaction)
        remove_intent(path)
    return redone
