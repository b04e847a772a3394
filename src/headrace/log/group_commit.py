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

from headrace.errors import ServiceUnavailable
from headrace.log.segments import MAX_PAYLOAD_BYTES, SegmentedLog


class GroupCommitter:
    def __init__(self, log: SegmentedLog, max_batch: int = 1024, max_wait_s: float = 0.0) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._log = log
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._pending: collections.deque[tuple[bytes, asyncio.Future[int]]] = collections.deque()
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
        if self._failure is not None:
            raise ServiceUnavailable(f"could not write the source's log: {self._failure}")
        if self._closing:
            raise ServiceUnavailable("the source's log is closing")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((payload, future))
        self._ensure_drainer().set()
        return await future

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
        while len(self._pending) < self._max_batch and not self._closing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return

    def _take_batch(self) -> list[tuple[bytes, asyncio.Future[int]]]:
        batch: list[tuple[bytes, asyncio.Future[int]]] = []
        while self._pending and len(batch) < self._max_batch:
            payload, future = self._pending.popleft()
            if not future.cancelled():  # the caller gave up before the write: it never got a 200
                batch.append((payload, future))
        return batch

    async def _commit(self, batch: list[tuple[bytes, asyncio.Future[int]]]) -> None:
        if self._failure is not None:
            self._fail(batch, self._failure)
            return
        payloads = [payload for payload, _ in batch]
        try:
            offsets = await asyncio.to_thread(self._write_and_sync, payloads)
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
            raise
        for (_, future), offset in zip(batch, offsets, strict=True):
            if not future.done():
                future.set_result(offset)

    def _write_and_sync(self, payloads: list[bytes]) -> list[int]:
        """Runs in a worker thread so the event loop keeps taking requests during the fsync."""
        offsets = self._log.append_offsets(payloads)
        try:
            self._log.sync()
        except OSError as error:
            self._failure = f"fsync failed; the log must be reopened: {error}"
            raise
        return offsets

    def _fail(self, batch: list[tuple[bytes, asyncio.Future[int]]], reason: str) -> None:
        for _, future in batch:
            if not future.done():
                future.set_exception(ServiceUnavailable(f"could not write the source's log: {reason}"))
