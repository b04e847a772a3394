"""The idempotency index of one source: which keys were accepted within the window, and where.

On disk, so memory does not grow with the number of keys (seed 002's windowed idempotency): one
SQLite file beside the source's log, a table keyed by a 16-byte blake2b of the idempotency key
(WITHOUT ROWID, so the key lives in the B-tree itself) holding the row's arrival time, a hash of
its body and its log offset, plus an index on the arrival time for eviction. A bounded page cache
keeps RSS flat however many keys there are.

The index is derived state: the log is the truth. It is updated only after the records it names
are durable in the log, and it records, in the same SQLite transaction, the log offset it covers.
At start-up `catch_up` replays the log from that offset (applying a record twice is harmless), so
`synchronous=NORMAL` is enough: a lost SQLite transaction is rebuilt from the log.

Write-behind (what the ingest path uses). A SQLite transaction of random 16-byte keys dirties about
one page per key, and writing those pages to the WAL costs several times the log's own fsync. So
`record` only puts the entries in an in-memory overlay and queues them; a flusher thread, woken
when the queue stops being empty, gathers for half a second, commits everything queued in one
transaction (a group commit of its own) and then drops the entries from the overlay. `lookup` reads the overlay first, then SQLite through a second connection (WAL
readers do not wait for the writer), so a recorded key is always visible: an entry leaves the
overlay only after its transaction committed. The overlay is bounded: `record` waits while more
than `max_behind` entries are queued. A crash loses at most the queued entries, which `catch_up`
replays from the log, as for any lost transaction.

Negative lookups (webhook/key_filter.py). With `filter_bytes`, a Bloom filter of every recorded key
answers "never seen" without SQLite, which is what almost every fresh key gets; it is loaded from
the table by a background thread at start-up and answers "maybe" until then.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import threading
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import NamedTuple

from headrace.log.group_commit import name_os_thread
from headrace.log.reader import read_records
from headrace.webhook.key_filter import KeyFilter
from headrace.webhook.record import decode_fields

INDEX_FILE = "dedupe.sqlite3"
_LOOKUP_CHUNK = 500  # below SQLite's bound-parameter limit
_CATCH_UP_CHUNK = 10_000
_MAX_BEHIND = 50_000  # entries queued for the flusher before `record` waits (bounds the overlay's memory)
_FLUSH_LINGER_S = 0.5  # the flusher gathers this long: one transaction per many group commits, and
# fewer pages written per key (keys of one transaction share B-tree pages; 0.1 s cost ~40% more CPU)
_FILTER_LOAD_CHUNK = 20_000


def key_hash(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def body_hash(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=8).digest()


class KeyEntry(NamedTuple):
    received_at_us: int
    body_hash: bytes
    log_offset: int


# What the index holds per key: KeyEntry's fields, as a plain tuple on the ingest path (built per
# keyed row in the group-commit thread). Plain, because the garbage collector stops tracking a
# plain tuple of ints and bytes, never a NamedTuple's: the write-behind overlay holds half a second
# of entries, which would otherwise reach the oldest generation and start a full collection (a
# stall of the event loop) every few seconds under load.
Entry = tuple[int, bytes, int]  # (received_at_us, body_hash, log_offset)
RECEIVED_AT_US, BODY_HASH, LOG_OFFSET = 0, 1, 2


class DedupeIndex:
    """Thread-safe: the group-commit thread, the flusher and the evictor share it. `_lock` guards the
    writing connection, `_read_lock` the reading one, `_queue_changed` the overlay and the queue."""

    def __init__(self, path: Path, cache_bytes: int = 32 << 20, *, write_behind: bool = False,
                 max_behind: int = _MAX_BEHIND, filter_bytes: int = 0) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # derived state: rebuilt from the log if lost
        self._db.execute(f"PRAGMA cache_size=-{max(1, cache_bytes >> 10)}")
        self._db.execute("PRAGMA temp_store=MEMORY")
        self._write_behind = write_behind
        self._max_behind = max_behind
        self._queue_changed = threading.Condition()
        self._overlay: dict[bytes, Entry] = {}  # recorded, not yet committed (write-behind)
        self._queue: list[tuple[Sequence[tuple[bytes, Entry]], int]] = []
        self._queued_entries = 0
        self._flushing = False
        self._flush_waiters = 0  # callers of flush(): the flusher does not linger for them
        self._flush_error: BaseException | None = None
        self._flusher: threading.Thread | None = None
        self._closed = False
        self._db.execute("CREATE TABLE IF NOT EXISTS keys (key_hash BLOB PRIMARY KEY, received_at_us INTEGER NOT NULL,"
                         " body_hash BLOB NOT NULL, log_offset INTEGER NOT NULL) WITHOUT ROWID")
        self._db.execute("CREATE INDEX IF NOT EXISTS keys_by_arrival ON keys (received_at_us)")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        row = self._db.execute("SELECT value FROM meta WHERE name = 'covered_offset'").fetchone()
        self._covered_offset = int(row[0]) if row else 0
        self._read_lock = threading.Lock()
        self._reader = self._db
        if write_behind:
            self._reader = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._reader.execute(f"PRAGMA cache_size=-{max(1, cache_bytes >> 10)}")
        self._filter: KeyFilter | None = None
        self._filter_loader: threading.Thread | None = None
        if filter_bytes > 0:
            self._filter = KeyFilter(filter_bytes)
            self._filter_loader = threading.Thread(target=self._load_filter, name="dedupe-filter", daemon=True)
            self._filter_loader.start()

    @property
    def covered_offset(self) -> int:
        """Every keyed record before this log offset is reflected in the index."""
        return self._covered_offset

    def lookup(self, hashes: Collection[bytes]) -> dict[bytes, Entry]:
        found: dict[bytes, Entry] = {}
        key_filter = self._filter
        if self._write_behind:
            missing: list[bytes] = []
            with self._queue_changed:
                overlay = self._overlay
                for key in hashes:
                    entry = overlay.get(key)
                    if entry is not None:
                        found[key] = entry
                    elif key_filter is None or key_filter.might_contain(key):
                        missing.append(key)
            # Read after the overlay: an entry leaves it only once committed, so it is seen here.
            hashes = missing
        elif key_filter is not None:
            with self._queue_changed:
                hashes = [key for key in hashes if key_filter.might_contain(key)]
        unique = list(dict.fromkeys(hashes))
        if not unique:
            return found
        lock = self._read_lock if self._write_behind else self._lock
        with lock:
            for start in range(0, len(unique), _LOOKUP_CHUNK):
                chunk = unique[start:start + _LOOKUP_CHUNK]
                marks = ",".join("?" * len(chunk))
                for key, received_at_us, body, offset in self._reader.execute(
                        f"SELECT key_hash, received_at_us, body_hash, log_offset FROM keys WHERE key_hash IN ({marks})",
                        chunk):
                    found[key] = (received_at_us, body, offset)
        return found

    def record(self, entries: Sequence[tuple[bytes, Entry]], covered_offset: int) -> None:
        """Upsert entries (later ones win) and advance the covered offset, in one transaction (with
        write-behind: visible to `lookup` at once, committed soon by the flusher)."""
        if self._filter is not None:
            with self._queue_changed:  # before the commit: a key in SQLite is always in the filter
                self._filter.add_all([key for key, _ in entries])
        if not self._write_behind:
            self._commit(entries, covered_offset)
            return
        with self._queue_changed:
            if self._flush_error is not None:
                raise OSError(f"the idempotency index could not be written: {self._flush_error!r}")
            if self._closed:
                raise OSError("the idempotency index is closed")
            while self._queued_entries > self._max_behind and self._flush_error is None:
                self._queue_changed.wait()  # the flusher is behind: bound the overlay
            overlay = self._overlay
            for key, entry in entries:
                overlay[key] = entry
            self._queue.append((entries, covered_offset))
            self._queued_entries += len(entries)
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_forever, name="dedupe-flush", daemon=True)
                self._flusher.start()
            if len(self._queue) == 1 or self._queued_entries >= self._max_behind // 2:
                self._queue_changed.notify_all()  # not per batch: the flusher lingers to gather anyway

    def flush(self) -> None:
        """Wait until everything recorded is committed (raises if the flusher failed)."""
        with self._queue_changed:
            self._flush_waiters += 1
            self._queue_changed.notify_all()
            try:
                while (self._queue or self._flushing) and self._flush_error is None:
                    self._queue_changed.wait()
            finally:
                self._flush_waiters -= 1
            if self._flush_error is not None:
                raise OSError(f"the idempotency index could not be written: {self._flush_error!r}")

    def _flush_forever(self) -> None:
        name_os_thread("dedupe-flush")
        while True:
            with self._queue_changed:
                while not self._queue and not self._closed:
                    self._queue_changed.wait()
                if not self._queue:
                    return
                if not self._closed and not self._flush_waiters and self._queued_entries < self._max_behind // 2:
                    self._queue_changed.wait(_FLUSH_LINGER_S)  # gather (flush(), close, a full queue end it)
                taken, self._queue, self._queued_entries = self._queue, [], 0
                self._flushing = True
                self._queue_changed.notify_all()
            # In key order: neighbouring keys share B-tree pages, so the transaction dirties fewer.
            entries = sorted((entry for batch, _ in taken for entry in batch), key=_entry_key)
            try:
                self._commit(entries, taken[-1][1])
            except BaseException as error:  # noqa: BLE001 - reported to the next record(); the log stays the truth
                with self._queue_changed:
                    self._flush_error = error
                    self._flushing = False
                    self._queue_changed.notify_all()
                return
            with self._queue_changed:
                overlay = self._overlay
                for key, entry in entries:
                    if overlay.get(key) is entry:  # not superseded by a later record since
                        del overlay[key]
                self._flushing = False
                self._queue_changed.notify_all()

    def _load_filter(self) -> None:
        """Put the keys already in the table into the filter (keys recorded meanwhile add themselves)."""
        key_filter = self._filter
        assert key_filter is not None
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error:
            return  # the filter stays incomplete: every lookup goes to SQLite, as without one
        try:
            cursor = db.execute("SELECT key_hash FROM keys")
            while not self._closed:
                chunk = [row[0] for row in cursor.fetchmany(_FILTER_LOAD_CHUNK)]
                if not chunk:
                    with self._queue_changed:
                        key_filter.complete = True
                    return
                with self._queue_changed:
                    key_filter.add_all(chunk)
        except sqlite3.Error:
            return
        finally:
            db.close()

    def _commit(self, entries: Sequence[tuple[bytes, Entry]], covered_offset: int) -> None:
        # Many rows per statement, not executemany: the sqlite3 module releases the GIL around each
        # statement step, and re-taking it while the event loop runs costs a futex round trip and a
        # context switch, once per row with executemany, once per chunk here.
        parameters = [value for key, entry in entries for value in (key, *entry)]
        with self._lock:
            self._db.execute("BEGIN")
            try:
                for start in range(0, len(parameters), _UPSERT_CHUNK * 4):
                    chunk = parameters[start:start + _UPSERT_CHUNK * 4]
                    self._db.execute(_upsert_statement(len(chunk) // 4), chunk)
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('covered_offset', ?)", (covered_offset,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._covered_offset = covered_offset

    def evict(self, older_than_us: int, limit: int = 5_000) -> int:
        """Forget up to `limit` keys that arrived before `older_than_us`; returns how many."""
        self.flush()
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM keys WHERE key_hash IN "
                "(SELECT key_hash FROM keys WHERE received_at_us < ? ORDER BY received_at_us LIMIT ?)",
                (older_than_us, limit))
            return cursor.rowcount

    def reset(self) -> None:
        """Forget everything (the log must then be replayed from its start)."""
        self.flush()
        with self._lock:
            if self._filter is not None:
                with self._queue_changed:
                    self._filter.clear()
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM keys")
            self._db.execute("DELETE FROM meta")
            self._db.execute("COMMIT")
            self._covered_offset = 0

    def count(self) -> int:
        self.flush()
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM keys").fetchone()[0])

    def close(self) -> None:
        """Commit what is queued (best effort: the log replays anything lost), then close."""
        with self._queue_changed:
            self._closed = True
            self._queue_changed.notify_all()
        if self._flusher is not None:
            self._flusher.join()
        if self._filter_loader is not None:
            self._filter_loader.join()
        with self._read_lock:
            if self._reader is not self._db:
                self._reader.close()
        with self._lock:
            self._db.close()


def _entry_key(entry: tuple[bytes, Entry]) -> bytes:
    return entry[0]


_UPSERT_CHUNK = 200  # rows per INSERT statement (4 parameters each: far below SQLite's limit)


@functools.lru_cache(maxsize=_UPSERT_CHUNK)
def _upsert_statement(rows: int) -> str:
    # Rows are inserted in order: a key given twice keeps its later row, as with one statement per row.
    return "INSERT OR REPLACE INTO keys VALUES " + ",".join(("(?, ?, ?, ?)",) * rows)


def catch_up(index: DedupeIndex, log_dir: Path, log_end: int) -> int:
    """Bring the index up to `log_end` by replaying the log; returns how many records were read.

    An index that claims more than the log holds (the log lost a tail the index saw: only possible
    if the disk lied about an fsync) is rebuilt from the start."""
    if index.covered_offset > log_end:
        index.reset()
    replayed = 0
    pending: list[tuple[bytes, Entry]] = []
    for offset, payload in read_records(log_dir, index.covered_offset, log_end):
        replayed += 1
        received_at_us, key, _headers, body, _prev = decode_fields(payload)
        if key is not None:
            pending.append((key_hash(key), (received_at_us, body_hash(body), offset)))
        if len(pending) >= _CATCH_UP_CHUNK:
            index.record(pending, offset)  # covers everything before this record: replayed again later
            pending = []
    if replayed or index.covered_offset != log_end:
        index.record(pending, log_end)
    return replayed
