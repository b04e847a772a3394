"""Group commit: many concurrent appenders share one fsync.

One background task owns the log. It takes everything queued (up to `max_batch`), writes and syncs
it in a worker thread, then resolves every waiter with its record's offset. While that fsync runs,
the event loop keeps accepting requests; they queue up and become the next batch, so the number of
fsyncs per second stays at what the disk can do while throughput grows with concurrency.

Failure policy. A failed write leaves the log consistent (SegmentedLog cuts the partial write
back), so only that batch fails. A failed fsync is different: Linux reports a writeback error once
and may drop the dirty pages, so the page cache can show bytes that are not on disk. Appending and
syncing more records to the same file could then acknowledge records that sit after a hole, and
recovery after a crash would cut them off at the hole. So after an fsync error the committer
refuses every later append (ServiceUnavailable: senders retry, and idempotency keys absorb the
duplicates) until the log is reopened with a new SegmentedLog and GroupCommitter, which runs
recovery. Reopening is a deliberate act (a restart, or DROP/CREATE of the ingestor): recovery
validates what the files read back as, which is the best knowledge available once the disk is
trusted again.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Sequence
from typing import Any, Protocol

from headrace.errors import ServiceUnavailable
from headrace.log.segments import HEADER_BYTES, MAX_PAYLOAD_BYTES, SegmentedLog


class BatchCodec(Protocol):
    """Turns queued items into payloads and learns when they are durable. Both methods run in the
    writer thread, one batch at a time, so they may keep state between `encode` and `durable`."""

    def encode(self, items: list[Any], start_offset: int) -> list[bytes]:
        """One payload per item; the first lands at `start_offset`, the next right after it."""
        ...

    def durable(self, items: list[Any], offsets: list[int], end_offset: int) -> None:
        """The batch is fsync'd. An exception here stops later appends (the batch stays acknowledged)."""
        ...


class _BytesCodec:
    def encode(self, items: list[Any], start_offset: int) -> list[bytes]:
        return items

    def durable(self, items: list[Any], offsets: list[int], end_offset: int) -> None:
        pass


def next_offset(offset: int, payload: bytes) -> int:
    """Where the record after `payload` (written at `offset`) starts: records are contiguous."""
    return offset + HEADER_BYTES + len(payload)


_Entry = tuple[list[Any], "asyncio.Future[list[int]]"]


class GroupCommitter:
    def __init__(self, log: SegmentedLog, max_batch: int = 1024, max_wait_s: float = 0.0,
                 codec: BatchCodec | None = None) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._log = log
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._codec: BatchCodec = codec or _BytesCodec()
        self._pending: collections.deque[_Entry] = collections.deque()
        self._pending_items = 0
        self._wakeup: asyncio.Event | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._failure: str | None = None  # set after an fsync error: the log must be reopened
        self._closing = False

    @property
    def failure(self) -> str | None:
        """Why the log refuses appends (after an fsync error), or None while healthy."""
        return self._failure

    async def append(self, payload: bytes) -> int:
        """Append one record; returns its offset once it is durable (fsync'd)."""
        if not 0 < len(payload) <= MAX_PAYLOAD_BYTES:
            raise ValueError(f"a record payload must be 1..{MAX_PAYLOAD_BYTES} bytes, got {len(payload)}")
        return (await self.append_many([payload]))[0]

    async def append_many(self, items: list[Any]) -> list[int]:
        """Append items (payloads, or what the codec encodes) in one batch; returns their offsets
        once all are durable."""
        if self._failure is not None:
            raise ServiceUnavailable(f"could not write the source's log: {self._failure}")
        if self._closing:
            raise ServiceUnavailable("the source's log is closing")
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        self._pending_items += len(items)
        self._ensure_drainer().set()
        return await future

    @property
    def queued(self) -> int:
        """Items waiting for the next batch."""
        return self._pending_items
    async def close(self) -> None:
        """Commit everything already queued, then stop. Later appends raise ServiceUnavailable."""
        self._closing = True
        if self._drainer is not None:
            assert self._wakeup is not None
            self._wakeup.set()
            # A drainer that was cancelled has already failed its waiters; closing still succeeds.
            await asyncio.gather(self._drainer, return_exceptions=True)

    def _ensure_drainer(self) -> asyncio.Event:
        # Started lazily: the committer may be built before the event loop runs.
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        if self._drainer is None:
            self._drainer = asyncio.get_running_loop().create_task(self._drain(), name="group-commit")
        return self._wakeup

    async def _drain(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._max_wait_s > 0:
                await self._grow_batch()
            batch = self._take_batch()
            if batch:
                await self._commit(batch)

    async def _grow_batch(self) -> None:
        """Wait up to max_wait_s for more appenders: fewer, larger fsyncs at some latency cost."""
        assert self._wakeup is not None
        deadline = time.monotonic() + self._max_wait_s
        while self._pending_items < self._max_batch and not self._closing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return

    def _take_batch(self) -> list[_Entry]:
        """Whole entries (a request's rows stay together) up to max_batch items, at least one entry."""
        batch: list[_Entry] = []
        taken = 0
        while self._pending and (not batch or taken + len(self._pending[0][0]) <= self._max_batch):
            items, future = self._pending.popleft()
            self._pending_items -= len(items)
            if not future.cancelled():  # the caller gave up before the write: it never got a 200
                batch.append((items, future))
                taken += len(items)
        return batch

    async def _commit(self, batch: list[_Entry]) -> None:
        if self._failure is not None:
            self._fail(batch, self._failure)
            return
        items = [item for entry_items, _ in batch for item in entry_items]
        try:
            offsets = await asyncio.to_thread(self._write_and_sync, items)
        except OSError as error:
            self._fail(batch, str(error))
            return
        except Exception as error:  # a bug, not the disk: stop trusting the log, keep answering
            self._failure = f"unexpected error: {error!r}"
            self._fail(batch, self._failure)
            return
        except asyncio.CancelledError:
            # The loop is going away while a worker thread may still be writing: fail everyone
            # (never leave a waiter hanging) and refuse appends, as the log's state is unknown.
            self._failure = "the group committer was cancelled"
            self._fail(batch, self._failure)
            self._fail(list(self._pending), self._failure)
            self._pending.clear()
            self._pending_items = 0
            raise
        position = 0
        for entry_items, future in batch:
            count = len(entry_items)
            if not future.done():
                future.set_result(offsets[position:position + count])
            position += count

    def _write_and_sync(self, items: list[Any]) -> list[int]:
        """Runs in a worker thread so the event loop keeps taking requests during the fsync."""
        payloads = self._codec.encode(items, self._log.end_offset)
        for payload in payloads:
            if not 0 < len(payload) <= MAX_PAYLOAD_BYTES:
                raise ValueError(f"a record payload must be 1..{MAX_PAYLOAD_BYTES} bytes, got {len(payload)}")
        offsets = self._log.append_offsets(payloads)
        try:
            self._log.sync()
        except OSError as error:
            self._failure = f"fsync failed; the log must be reopened: {error}"
            raise
        try:
            self._codec.durable(items, offsets, self._log.end_offset)
        except Exception as error:  # noqa: BLE001 - the batch is durable; only later appends are refused
            self._failure = f"could not record the batch after writing it: {error!r}"
        return offsets

    def _fail(self, batch: Sequence[_Entry], reason: str) -> None:
        for _, future in batch:
            if not future.done():
                future.set_exception(ServiceUnavailable(f"could not write the source's log: {reason}"))
