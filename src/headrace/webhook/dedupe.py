"""The idempotency index of one source: which keys were accepted within the window, and where.

On disk, so memory does not grow with the number of keys (seed 002's windowed idempotency): one
RocksDB database (rocksdict) beside the source's log. Its keys:
- `k` + time bucket + a 16-byte blake2b of the idempotency key -> the row's arrival time, a hash of
  its body and its log offset. A bucket is a fixed span of arrival time (a sixteenth of the window
  the index was created for, at least a second, kept in `w`);
- `m` -> the log offset the index covers.
Eviction drops whole buckets older than the window with one range deletion: no per-key work, so
forgetting a window's keys costs nothing on the ingest path. A key that arrives again is written
into the current bucket; its older entry stays until its bucket goes, and `lookup` takes the latest.
Keys stay on disk up to one bucket longer than the window; the ingest path compares each key's
arrival with the window itself. A bounded block cache and small memtables keep RSS flat however
many keys there are.

Why a log-structured store and not a B-tree (it was SQLite before): fresh idempotency keys are
random, so a B-tree transaction dirties about one 4 KiB page per key, written to the WAL and again
by the checkpoint: at 10,000 webhooks/s ~40 MB/s of writes and 7 us of CPU per key. Measured at
10,000 requests/s on 2 cores, ack p99: 14-25 ms with SQLite, 9 ms with no index writes at all,
8-12 ms with RocksDB written every 50 ms. RocksDB appends a batch to its write-ahead log (no
fsync) and a memtable, under a microsecond per key, and sorts to disk in background threads that
do not hold the GIL (writes themselves do: see _FLUSH_LINGER_S). Per-key eviction (an arrival-order
mark per key, deleted when it expired) held the GIL as long again and took the p99 to 16-43 ms
once keys expired as fast as they arrived; time buckets take that cost away.

The index is derived state: the log is the truth. It is updated only after the records it names
are durable in the log, and each update carries the log offset it covers, written last. RocksDB
recovers a prefix of its writes after a crash, so the covered offset never runs ahead of the entries;
at start-up `catch_up` replays the log from that offset (applying a record twice is harmless).

Write-behind (what the ingest path uses). `record` only puts the entries in an in-memory overlay
and queues them; a flusher thread, woken when the queue stops being empty, gathers for 50 ms
and writes everything queued in small batches (rocksdict holds the GIL while it writes a
batch, so a batch is kept well under a millisecond), then drops the entries from the overlay.
`lookup` reads the overlay first, then RocksDB, so a recorded key is always visible: an entry leaves
the overlay only after it was written. The overlay is bounded: `record` waits while more than
`max_behind` entries are queued. A crash loses at most the queued entries, which `catch_up`
replays from the log, as for any lost write.

Negative lookups (webhook/key_filter.py). With `filter_bytes`, a Bloom filter of every recorded key
answers "never seen" without RocksDB, which is what almost every fresh key gets; it is loaded from
the index by a background thread at start-up and answers "maybe" until then.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import NamedTuple

from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

from headrace.catalog.items import DEFAULT_WINDOW_US
from headrace.log.group_commit import name_os_thread
from headrace.log.reader import read_records
from headrace.webhook.key_filter import KeyFilter
from headrace.webhook.record import decode_fields

INDEX_FILE = "dedupe.rocksdb"  # a directory
_FORMER_INDEX_FILES = ("dedupe.sqlite3", "dedupe.sqlite3-wal", "dedupe.sqlite3-shm")  # derived: removed, rebuilt
_CATCH_UP_CHUNK = 10_000
_MAX_BEHIND = 50_000  # entries queued for the flusher before `record` waits (bounds the overlay's memory)
# The flusher gathers this long. Short: a RocksDB write costs the same per entry in any batch, and
# holds the GIL throughout, so half a second's worth (5,000 entries at 10,000 webhooks/s, with an
# arrival mark per key then: 1.6 us each) stalled the event loop for 10-15 ms; at 0.05 s the ack p99
# at 10,000/s went from 17-19 ms to 8-12 ms.
_FLUSH_LINGER_S = 0.05
_WRITE_CHUNK = 256  # entries per RocksDB write: rocksdict holds the GIL while writing (~0.2 ms for this many)
_MEMTABLE_BYTES = 16 << 20  # per memtable (two at most): also bounds what a crash leaves to replay
_FILTER_LOAD_CHUNK = 20_000

_MAIN, _COVERED, _BUCKET_WIDTH = b"k", b"m", b"w"
_VALUE = struct.Struct(">q8sq")  # received_at_us, body_hash, log_offset
_BUCKET = struct.Struct(">Q")  # bucket number with the sign bit flipped: byte order is time order
_OFFSET = struct.Struct(">q")
_SIGN = 1 << 63
_BUCKETS_PER_WINDOW = 16
_MIN_BUCKET_US = 1_000_000


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
# plain tuple of ints and bytes, never a NamedTuple's: the write-behind overlay holds a moment's
# entries, which would otherwise reach the oldest generation and start a full collection (a
# stall of the event loop) every few seconds under load.
Entry = tuple[int, bytes, int]  # (received_at_us, body_hash, log_offset)
RECEIVED_AT_US, BODY_HASH, LOG_OFFSET = 0, 1, 2


def bucket_width_for(window_us: int) -> int:
    """The span of arrival time one bucket holds, for an index created for `window_us`."""
    return max(_MIN_BUCKET_US, window_us // _BUCKETS_PER_WINDOW)


def _bucket_prefix(bucket: int) -> bytes:
    return _MAIN + _BUCKET.pack((bucket + _SIGN) & (_SIGN * 2 - 1))


_PREFIX_BYTES = len(_MAIN) + _BUCKET.size


def _bucket_of_key(db_key: bytes) -> int:
    return _BUCKET.unpack(db_key[len(_MAIN):_PREFIX_BYTES])[0] - _SIGN


def _open_rocksdb(path: Path, cache_bytes: int) -> Rdict:
    for name in _FORMER_INDEX_FILES:
        (path.parent / name).unlink(missing_ok=True)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_compression_type(DBCompressionType.none())  # hashes do not compress
    options.set_write_buffer_size(_MEMTABLE_BYTES)
    options.set_max_write_buffer_number(2)
    options.set_max_background_jobs(2)
    options.set_keep_log_file_num(2)
    options.set_max_log_file_size(1 << 20)
    table = BlockBasedOptions()
    table.set_block_cache(Cache(max(1 << 20, cache_bytes)))
    table.set_cache_index_and_filter_blocks(True)  # index blocks count against the cache: bounded memory
    options.set_block_based_table_factory(table)
    db = Rdict(str(path), options)
    write = WriteOptions()
    write.sync = False  # derived state: a write lost with the OS is replayed from the log
    db.set_write_options(write)
    return db


class DedupeIndex:
    """Thread-safe: the group-commit thread, the flusher and the evictor share it. `_lock` orders
    writes to RocksDB (reads need no lock), `_queue_changed` guards the overlay and the queue."""

    def __init__(self, path: Path, cache_bytes: int = 32 << 20, *, write_behind: bool = False,
                 max_behind: int = _MAX_BEHIND, filter_bytes: int = 0, bucket_us: int | None = None) -> None:
        """`bucket_us`: the bucket width for a new index (default: bucket_width_for the default window);
        an existing index keeps the width it was created with."""
        self.path = path
        self._lock = threading.Lock()
        self._cache_bytes = cache_bytes
        self._db = _open_rocksdb(path, cache_bytes)
        self._write_behind = write_behind
        self._max_behind = max_behind
        self._queue_changed = threading.Condition()
        self._overlay: dict[bytes, Entry] = {}  # recorded, not yet written (write-behind)
        self._queue: list[tuple[Sequence[tuple[bytes, Entry]], int]] = []
        self._queued_entries = 0
        self._flushing = False
        self._flush_waiters = 0  # callers of flush(): the flusher does not linger for them
        self._flush_error: BaseException | None = None
        self._flusher: threading.Thread | None = None
        self._closed = False
        width = self._db.get(_BUCKET_WIDTH)
        if width is None:
            self.bucket_us = bucket_us or bucket_width_for(DEFAULT_WINDOW_US)
            self._db.put(_BUCKET_WIDTH, _OFFSET.pack(self.bucket_us))
        else:
            self.bucket_us = _OFFSET.unpack(width)[0]
        self._buckets = self._scan_buckets()  # ascending; written under _lock, read as a whole (a list swap)
        covered = self._db.get(_COVERED)
        self._covered_offset = _OFFSET.unpack(covered)[0] if covered is not None else 0
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
            # Read after the overlay: an entry leaves it only once written, so it is seen here.
            hashes = missing
        elif key_filter is not None:
            with self._queue_changed:
                hashes = [key for key in hashes if key_filter.might_contain(key)]
        unique = list(dict.fromkeys(hashes))
        if not unique:
            return found
        prefixes = [_bucket_prefix(bucket) for bucket in self._buckets]
        # One multi-get over every bucket (rocksdict releases the GIL for it); the latest arrival wins.
        values = self._db.get([prefix + key for prefix in prefixes for key in unique])
        for position, value in enumerate(values):
            if value is not None:
                key = unique[position % len(unique)]
                entry = _VALUE.unpack(value)
                previous = found.get(key)
                if previous is None or entry[RECEIVED_AT_US] >= previous[RECEIVED_AT_US]:
                    found[key] = entry
        return found

    def record(self, entries: Sequence[tuple[bytes, Entry]], covered_offset: int) -> None:
        """Upsert entries (later ones win) and advance the covered offset (with write-behind:
        visible to `lookup` at once, written soon by the flusher)."""
        if self._filter is not None:
            with self._queue_changed:  # before the write: a key in RocksDB is always in the filter
                self._filter.add_all([key for key, _ in entries])
        if not self._write_behind:
            self._write(entries, covered_offset)
            return
        with self._queue_changed:
            # A failing flusher does not refuse these entries: their records are durable in the log already. It
            # keeps them queued and retries; meanwhile `write_error` makes the ingest path refuse new requests.
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
        """Wait until everything recorded is written (raises if the flusher failed)."""
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
            entries = [entry for batch, _ in taken for entry in batch]
            try:
                self._write(entries, taken[-1][1])
            except Exception as error:  # noqa: BLE001 - disk full or another I/O fault: kept queued, retried
                with self._queue_changed:
                    self._flush_error = error
                    self._queue[:0] = taken
                    self._queued_entries += len(entries)
                    self._flushing = False
                    self._queue_changed.notify_all()
                if not self._recover():
                    return  # closed while failing: what is queued is replayed from the log at the next open
                continue
            with self._queue_changed:
                self._flush_error = None
                overlay = self._overlay
                for key, entry in entries:
                    if overlay.get(key) is entry:  # not superseded by a later record since
                        del overlay[key]
                self._flushing = False
                self._queue_changed.notify_all()

    @property
    def write_error(self) -> str | None:
        """Why the index cannot be written now (the flusher retries), or None."""
        error = self._flush_error
        return None if error is None else str(error)

    def _recover(self) -> bool:
        """After a failed write: RocksDB refuses every write once one failed (its background error stays until
        the database is reopened), so reopen it, with backoff, until that works or the index is closed. Entries
        lost with the failed write are still queued; the covered offset, written last, never ran ahead of them."""
        delay = 0.1
        while True:
            with self._queue_changed:
                self._queue_changed.wait_for(lambda: self._closed, timeout=delay)
                if self._closed:
                    return False
            delay = min(delay * 2, 5.0)
            with self._lock:
                try:
                    self._db.close()
                except Exception:  # noqa: BLE001 - already closed by an earlier try
                    pass
                try:
                    self._db = _open_rocksdb(self.path, self._cache_bytes)
                    return True
                except Exception as error:  # noqa: BLE001 - still no space: try again later
                    self._flush_error = error

    def _load_filter(self) -> None:
        """Put the keys already in the index into the filter (keys recorded meanwhile add themselves)."""
        key_filter = self._filter
        assert key_filter is not None
        try:
            iterator = self._db.iter()
            iterator.seek(_MAIN)
            while not self._closed:
                chunk: list[bytes] = []
                while iterator.valid() and len(chunk) < _FILTER_LOAD_CHUNK:
                    key = iterator.key()
                    if key[:1] != _MAIN:
                        break
                    chunk.append(key[_PREFIX_BYTES:])
                    iterator.next()
                with self._queue_changed:
                    key_filter.add_all(chunk)
                    if len(chunk) < _FILTER_LOAD_CHUNK:
                        key_filter.complete = True
                        return
        except Exception:  # noqa: BLE001 - the filter stays incomplete: lookups go to RocksDB, as without one
            return

    def _write(self, entries: Sequence[tuple[bytes, Entry]], covered_offset: int) -> None:
        """Entries in order (a key given twice keeps its later entry), then the covered offset, last:
        RocksDB recovers a prefix of its writes, so the offset never covers an entry that was lost."""
        width = self.bucket_us
        with self._lock:
            for start in range(0, len(entries), _WRITE_CHUNK):
                batch = WriteBatch(raw_mode=True)
                chunk = entries[start:start + _WRITE_CHUNK]
                buckets = {received_at_us // width for _, (received_at_us, _, _) in chunk}
                if not buckets.issubset(self._buckets):
                    self._buckets = sorted(buckets.union(self._buckets))  # before the write: lookups see it
                prefixes = {bucket: _bucket_prefix(bucket) for bucket in buckets}
                for key, (received_at_us, body, offset) in chunk:
                    batch.put(prefixes[received_at_us // width] + key, _VALUE.pack(received_at_us, body, offset))
                self._db.write(batch)
            self._db.put(_COVERED, _OFFSET.pack(covered_offset))
            self._covered_offset = covered_offset

    def evict(self, older_than_us: int) -> int:
        """Forget the buckets whose every key arrived before `older_than_us` (one range deletion);
        returns how many buckets went."""
        self.flush()
        with self._lock:
            expired = [bucket for bucket in self._buckets if (bucket + 1) * self.bucket_us <= older_than_us]
            if not expired:
                return 0
            self._db.delete_range(_bucket_prefix(expired[0]), _bucket_prefix(expired[-1] + 1))
            self._buckets = self._buckets[len(expired):]
            return len(expired)

    def _scan_buckets(self) -> list[int]:
        """The buckets holding keys: one seek per bucket."""
        buckets: list[int] = []
        iterator = self._db.iter()
        iterator.seek(_MAIN)
        while iterator.valid():
            key = iterator.key()
            if key[:len(_MAIN)] != _MAIN:
                break
            bucket = _bucket_of_key(key)
            buckets.append(bucket)
            iterator.seek(_bucket_prefix(bucket + 1))
        return buckets

    def reset(self) -> None:
        """Forget everything (the log must then be replayed from its start)."""
        self.flush()
        with self._lock:
            if self._filter is not None:
                with self._queue_changed:
                    self._filter.clear()
            self._db.delete_range(b"\x00", b"\xff")
            self._db.put(_BUCKET_WIDTH, _OFFSET.pack(self.bucket_us))
            self._covered_offset = 0
            self._buckets = []

    def count(self) -> int:
        """How many keys the index holds (a scan: for tests and tools, not the ingest path)."""
        self.flush()
        iterator = self._db.iter()
        iterator.seek(_MAIN)
        total = 0
        while iterator.valid() and iterator.key()[:1] == _MAIN:
            total += 1
            iterator.next()
        return total

    def close(self) -> None:
        """Write what is queued (best effort: the log replays anything lost), then close."""
        with self._queue_changed:
            self._closed = True
            self._queue_changed.notify_all()
        if self._flusher is not None:
            self._flusher.join()
        if self._filter_loader is not None:
            self._filter_loader.join()
        with self._lock:
            try:
                self._db.close()
            except Exception:  # noqa: BLE001 - a failed reopen left it closed
                pass


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
