"""From a validated request to durable, deduplicated rows: one log per webhook source, and their registry.

The coordinator fills the registry on CREATE/DROP SOURCE and at start; the HTTP layer looks
sources up by (database, schema, name) and awaits `ingest`, which returns once every row of the
request is fsync'd. Log directories are named by the source's stable id, so DROP + CREATE starts afresh.

Idempotency (seed 002) happens here, at ingest, per row of a source with IDEMPOTENT:
- key not seen within the window: the row is appended as new;
- key seen within the window (same body or not): the row is appended as a replacement carrying
  `prev_offset`, the log offset of the row it supersedes; the pipeline deletes that row and stores
  this one, so the source holds one row per key with the latest body and arrival time, and the
  key's window restarts from this write.
The decision is taken in the group-commit thread for a whole batch at once (one index lookup per
batch); two rows with one key in the same batch make the second a replacement of the first. The
index learns a batch only after it is durable, so it never runs ahead of the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from hashlib import blake2b as _blake2b
from pathlib import Path

from headrace.catalog.items import DEFAULT_WINDOW_US, WebhookSource
from headrace.errors import DuplicateObject, InternalError
from headrace.log.group_commit import GroupCommitter, Settled
from headrace.log.segments import HEADER_BYTES, SegmentedLog
from headrace.webhook.dedupe import (BODY_HASH, INDEX_FILE, LOG_OFFSET, RECEIVED_AT_US, DedupeIndex, Entry,
                                     bucket_width_for, catch_up)
from headrace.webhook.handler import Headers, WebhookHandler
from headrace.webhook.metrics import SourceMetrics
from headrace.webhook.record import WebhookRecord, encode
from headrace.webhook.request_log import RequestLog

log = logging.getLogger(__name__)

SourceKey = tuple[str, str, str]  # (database, schema, name)

NEW, DUPLICATE, REPLACED = 0, 1, 2  # what the index made of a row


@dataclass(frozen=True)
class IngestSettings:
    """System settings of webhook ingest (CLI flags of `headrace up`; see docs/webhooks.md)."""

    max_body_bytes: int = 5 << 20
    max_concurrent_requests: int = 500  # in flight at once, all sources: beyond it, 429
    max_concurrent_requests_per_source: int = 500
    group_commit_max_batch: int = 1024  # rows per fsync
    group_commit_max_wait_ms: float = 0.0  # wait this long for a batch to fill: throughput against latency
    request_log_size: int = 100  # requests kept per source in headrace_internal.webhook_requests
    dedupe_cache_mb: int = 32  # RocksDB block cache per source's idempotency index
    dedupe_filter_mb: int = 8  # Bloom filter per source's idempotency index (fresh keys skip the on-disk lookup)
    eviction_interval_s: float = 1.0  # how often the index's buckets older than the window are dropped (cheap)


class DedupeCodec:
    """The group committer's codec, in its writer thread: hashes each row's key and body and decides
    new or replacement against the index (before the write), then records the batch in the index
    and counts the rows' outcomes (after the fsync). The items are the requests' WebhookRecords.
    Doing all of it here keeps it off the event loop, which is what bounds requests/s."""

    def __init__(self, index: DedupeIndex | None, window_us: int, metrics: SourceMetrics | None = None) -> None:
        self.index = index
        self.window_us = window_us
        self.metrics = metrics or SourceMetrics()
        self._entries: list[tuple[bytes, Entry]] = []
        self._span = (0, 0)  # where the batch being written starts and ends, as encoded
        self._outcomes = [0, 0, 0]  # NEW, DUPLICATE, REPLACED of the batch being written

    def encode(self, records: list[WebhookRecord], start_offset: int) -> list[bytes]:
        if self.index is None:
            self._outcomes = [len(records), 0, 0]
            self._span = (-1, -1)
            return [encode(record) for record in records]
        if (write_error := self.index.write_error) is not None:
            # Refused before the write (an OSError fails this batch only: 503, retried by the sender): recording
            # more keys than the index can write would grow the overlay without bound.
            raise OSError(f"the idempotency index cannot be written, retrying: {write_error}")
        # Per row, in the thread that shares the GIL with the event loop: dedupe.key_hash and
        # body_hash, and the offset arithmetic, inlined (a call costs as much as the work it wraps).
        hashes = [None if (key := record.idempotency_key) is None
                  else _blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
                  for record in records]
        try:
            known = self.index.lookup([hashed for hashed in hashes if hashed is not None])
        except Exception as error:  # noqa: BLE001 - the index is being reopened after an I/O fault
            raise OSError(f"the idempotency index cannot be read, retrying: {error}") from error
        in_batch: dict[bytes, Entry] = {}
        payloads: list[bytes] = []
        outcomes = [0, 0, 0]
        offset = start_offset
        window_us = self.window_us
        for record, hashed in zip(records, hashes):
            if hashed is not None:
                hashed_body = _blake2b(record.body, digest_size=8).digest()
                previous = in_batch.get(hashed) or known.get(hashed)
                if previous is not None and previous[RECEIVED_AT_US] >= record.received_at_us - window_us:
                    outcomes[DUPLICATE if previous[BODY_HASH] == hashed_body else REPLACED] += 1
                    record = record.replacing(previous[LOG_OFFSET])
                else:
                    outcomes[NEW] += 1
                in_batch[hashed] = (record.received_at_us, hashed_body, offset)  # an Entry
            else:
                outcomes[NEW] += 1
            payload = encode(record)
            payloads.append(payload)
            offset += HEADER_BYTES + len(payload)  # next_offset(offset, payload)
        self._entries = list(in_batch.items())
        self._outcomes = outcomes
        self._span = (start_offset, offset)
        return payloads

    def durable(self, records: list[WebhookRecord], offsets: list[int], end_offset: int) -> None:
        new, duplicate, replaced = self._outcomes
        metrics = self.metrics  # only this thread writes these counters
        metrics.rows_new += new
        metrics.rows_duplicate += duplicate
        metrics.rows_replaced += replaced
        if self.index is None:
            return
        # Records are contiguous: the same start and end mean every record is where it was expected.
        if self._span != (offsets[0], end_offset):
            raise InternalError("the log placed records at other offsets than the index expected")
        self.index.record(self._entries, end_offset)


class SourceIngestor:
    """Validates requests for one source, deduplicates their rows and appends them durably to its log."""

    def __init__(self, source: WebhookSource, log_dir: Path, settings: IngestSettings | None = None,
                 window_us: int | None = None) -> None:
        self.source = source
        self.log_dir = log_dir
        self.settings = settings or IngestSettings()
        self.handler = WebhookHandler(source)  # first: a bad expression must not leave a log open
        self.metrics = SourceMetrics()
        self.requests = RequestLog(self.settings.request_log_size)
        self.in_flight = 0
        self._log = SegmentedLog(log_dir)
        self._index: DedupeIndex | None = None
        window = window_us if window_us is not None else _window_of(source)
        try:
            if source.idempotent_expr is not None:
                self._index = DedupeIndex(log_dir / INDEX_FILE, cache_bytes=self.settings.dedupe_cache_mb << 20,
                                          write_behind=True, filter_bytes=self.settings.dedupe_filter_mb << 20,
                                          bucket_us=bucket_width_for(window))
                replayed = catch_up(self._index, log_dir, self._log.end_offset)
                if replayed:
                    log.info("%s: idempotency index caught up over %d log records", source.name, replayed)
        except BaseException:
            self._close_files()
            raise
        self._codec = DedupeCodec(self._index, window, self.metrics)
        self._committer = GroupCommitter(self._log, max_batch=self.settings.group_commit_max_batch,
                                         max_wait_s=self.settings.group_commit_max_wait_ms / 1000,
                                         codec=self._codec)
        self._evictor: asyncio.Task[None] | None = None
        with contextlib.suppress(RuntimeError):  # no running loop: no background eviction (unit tests)
            if self._index is not None:
                self._evictor = asyncio.get_running_loop().create_task(self._evict_forever(), name="dedupe-evict")

    @property
    def log_end_offset(self) -> int:
        """The end of the source's log (what the pipeline must commit up to: headrace_internal.materializations)."""
        return self._log.end_offset

    @property
    def window_us(self) -> int:
        return self._codec.window_us

    def set_window(self, window_us: int) -> None:
        """ALTER SOURCE ... SET (WINDOW = ...): applies from the next batch on."""
        self._codec.window_us = window_us

    async def ingest(self, headers: Sequence[tuple[str, str]], body: bytes, received_at_us: int) -> int:
        """Like `ingest_rows`, returning the log offset of the request's first row."""
        offsets = await self.ingest_rows(headers, body, received_at_us)
        return offsets[0] if offsets else -1

    async def ingest_rows(self, headers: Sequence[tuple[str, str]], body: bytes, received_at_us: int) -> list[int]:
        """Validate (WebhookRejected) and append every row; returns their log offsets once all are
        durable. Raises ServiceUnavailable when the log cannot be written."""
        pending = self.submit(headers, body, received_at_us)
        return pending if isinstance(pending, list) else await pending

    def submit(self, headers: Sequence[tuple[str, str]], body: bytes,
               received_at_us: int) -> list[int] | asyncio.Future[list[int]]:
        """`ingest_rows` without a coroutine (the HTTP hot path): validates and queues the rows at once,
        returning [] for a request without rows or a future of the rows' offsets, resolved once durable."""
        records = self.handler.validate(headers, body, received_at_us)
        if isinstance(records, WebhookRecord):  # the handler of one row per request
            records = [records]
        if not records:
            return []
        # Rows are counted (new, duplicate, replaced) by the codec once durable, in the writer thread.
        return self._committer.append_many(records)

    def submit_then(self, headers: Headers, body: bytes, received_at_us: int,
                    settled: Settled) -> bool:
        """`submit` without a future: False for a request without rows (nothing queued, `settled`
        never called); else True, and `settled(offsets, error)` runs in the event loop once durable."""
        records = self.handler.validate(headers, body, received_at_us)
        if not records:
            return False
        self._committer.append_many_then(records, settled)
        return True

    @property
    def failure(self) -> str | None:
        """Why the log refuses writes (after an fsync error it needs reopening), or None."""
        return self._committer.failure

    async def evict_expired(self, now_us: int | None = None) -> int:
        """Forget the index's time buckets older than the window (webhook/dedupe.py); returns how many."""
        if self._index is None:
            return 0
        cutoff = (now_us if now_us is not None else time.time_ns() // 1000) - self.window_us
        return await asyncio.to_thread(self._index.evict, cutoff)

    async def _evict_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.eviction_interval_s)
            if self._index is not None and self._index.write_error is not None:
                continue  # the index is recovering from an I/O fault (already refused to senders as 503)
            try:
                await self.evict_expired()
            except OSError as error:  # eviction failing only delays forgetting; ingest goes on
                log.warning("%s: evicting expired idempotency keys: %s", self.source.name, error)
            except Exception:  # noqa: BLE001
                log.exception("%s: evicting expired idempotency keys", self.source.name)

    async def close(self) -> None:
        """Finish the appends already queued, then close the log and the index."""
        if self._evictor is not None:
            self._evictor.cancel()
            await asyncio.gather(self._evictor, return_exceptions=True)
        await self._committer.close()
        self._close_files()

    def _close_files(self) -> None:
        self._log.close()
        if self._index is not None:
            self._index.close()


def _window_of(source: WebhookSource) -> int:
    window = getattr(source, "window_us", None)  # catalog items carry WINDOW from the webhook issue on
    return int(window) if window else DEFAULT_WINDOW_US


class IngestRegistry:
    def __init__(self, settings: IngestSettings | None = None) -> None:
        self.settings = settings or IngestSettings()
        self._ingestors: dict[SourceKey, SourceIngestor] = {}

    def add(self, source: WebhookSource, log_dir: Path) -> SourceIngestor:
        key = (source.database, source.schema, source.name)
        if key in self._ingestors:
            raise DuplicateObject(f'webhook source "{".".join(key)}" is already registered')
        ingestor = SourceIngestor(source, log_dir, self.settings)
        self._ingestors[key] = ingestor
        return ingestor

    def update(self, source: WebhookSource) -> None:
        """The catalog item changed in place (ALTER SOURCE ... SET (WINDOW = ...))."""
        ingestor = self._ingestors.get((source.database, source.schema, source.name))
        if ingestor is not None:
            ingestor.source = source
            ingestor.set_window(_window_of(source))

    async def remove(self, database: str, schema: str, name: str) -> None:
        """Stop taking requests for the source (at once), then finish and close its log."""
        ingestor = self._ingestors.pop((database, schema, name), None)
        if ingestor is not None:
            await ingestor.close()

    def lookup(self, database: str, schema: str, name: str) -> SourceIngestor | None:
        return self._ingestors.get((database, schema, name))

    def items(self) -> Iterator[tuple[SourceKey, SourceIngestor]]:
        return iter(list(self._ingestors.items()))

    def __len__(self) -> int:
        return len(self._ingestors)

    async def close_all(self) -> None:
        ingestors = list(self._ingestors.values())
        self._ingestors.clear()
        for ingestor in ingestors:
            await ingestor.close()
