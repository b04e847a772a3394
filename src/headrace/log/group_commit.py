"""Group commit: many concurrent appenders share one fsync.

One writer thread owns the log. It takes everything queued (up to `max_batch`), encodes, writes and
syncs it, then hands the whole batch back to the event loop with one `call_soon_threadsafe`, which
resolves every waiter with its record's offset. While that fsync runs, the event loop keeps
accepting requests; they queue up and become the next batch, which the thread takes as soon as the
fsync returns, without waiting for the event loop to get round to it (the loop is then busy
answering the batch just made durable). The number of fsyncs per second stays at what the disk can
do while throughput grows with concurrency.

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
import logging
import threading
import time
from collections.abc import Callable
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


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` in the OS too (/proc/<pid>/task/<tid>/comm, top -H, perf), so
    per-thread CPU can be told apart. Best effort: Linux only, 15 bytes."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode("ascii")[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def next_offset(offset: int, payload: bytes) -> int:
    """Where the record after `payload` (written at `offset`) starts: records are contiguous."""
    return offset + HEADER_BYTES + len(payload)


log = logging.getLogger(__name__)

# Called in the event loop once a batch is durable: (offsets, None), or (None, ServiceUnavailable).
Settled = Callable[[list[int] | None, BaseException | None], None]
_Entry = tuple[list[Any], "asyncio.Future[list[int]] | Settled"]


class GroupCommitter:
    def __init__(self, log: SegmentedLog, max_batch: int = 1024, max_wait_s: float = 0.0,
                 codec: BatchCodec | None = None) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._log = log
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._codec: BatchCodec = codec or _BytesCodec()
        # Shared with the writer thread, under _lock: the queue, its size, and the closing flag.
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._pending: collections.deque[_Entry] = collections.deque()
        self._pending_items = 0
        self._writer_waiting = False  # the writer sleeps on _wakeup: the next append notifies it
        self._closing = False
        self._writer: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer_done: asyncio.Future[None] | None = None  # resolved when the writer thread ends
        self._failure: str | None = None  # set after an fsync error: the log must be reopened

    @property
    def failure(self) -> str | None:
        """Why the log refuses appends (after an fsync error), or None while healthy."""
        return self._failure

    async def append(self, payload: bytes) -> int:
        """Append one record; returns its offset once it is durable (fsync'd)."""
        if not 0 < len(payload) <= MAX_PAYLOAD_BYTES:
            raise ValueError(f"a record payload must be 1..{MAX_PAYLOAD_BYTES} bytes, got {len(payload)}")
        return (await self.append_many([payload]))[0]

    def append_many(self, items: list[Any]) -> asyncio.Future[list[int]]:
        """Append items (payloads, or what the codec encodes) in one batch. Await the result for
        their offsets, once all are durable. (A plain future, not a coroutine: no task or coroutine
        object per request.)"""
        loop = self._loop_for_append()
        future: asyncio.Future[list[int]] = loop.create_future()
        self._enqueue(items, future)
        return future

    def append_many_then(self, items: list[Any], settled: Settled) -> None:
        """`append_many` for the HTTP hot path: `settled(offsets, None)`, or `settled(None, error)`,
        is called in the event loop once the batch is durable (or failed), straight from the batch's
        wake-up: no future, no done-callback and no extra turn of the loop per request."""
        self._loop_for_append()
        self._enqueue(items, settled)

    def _loop_for_append(self) -> asyncio.AbstractEventLoop:
        if self._failure is not None:
            raise ServiceUnavailable(f"could not write the source's log: {self._failure}")
        if self._closing:
            raise ServiceUnavailable("the source's log is closing")
        loop = self._loop
        if loop is None:  # started lazily: the committer may be built before the event loop runs
            loop = self._start()
        return loop

    def _enqueue(self, items: list[Any], waiter: asyncio.Future[list[int]] | Settled) -> None:
        with self._lock:
            self._pending.append((items, waiter))
            self._pending_items += len(items)
            # One futex wake-up per idle period of the writer, not per request. At once, not at the
            # end of this turn of the loop: the fsync then overlaps the loop's work on the others.
            if self._writer_waiting:
                self._writer_waiting = False
                self._wakeup.notify()

    @property
    def queued(self) -> int:
        """Items waiting for the next batch."""
        return self._pending_items

    async def close(self) -> None:
        """Commit everything already queued, then stop. Later appends raise ServiceUnavailable."""
        with self._lock:
            self._closing = True
            self._wakeup.notify()
        if self._writer_done is not None:
            await asyncio.shield(self._writer_done)

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._writer_done = loop.create_future()
        # A daemon: a loop that ends without close() must not keep the process alive.
        self._writer = threading.Thread(target=self._write_forever, name="group-commit", daemon=True)
        self._writer.start()
        return loop

    # -- the writer thread -------------------------------------------------------------------

    def _write_forever(self) -> None:
        name_os_thread("group-commit")
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                if batch:
                    self._commit(batch)
        except BaseException as error:  # a bug: never leave a waiter hanging, refuse later appends
            self._failure = f"the log writer stopped: {error!r}"
            with self._lock:
                self._closing = True
                orphans, self._pending = list(self._pending), collections.deque()
                self._pending_items = 0
            self._settle(orphans, None, self._failure)
            raise
        finally:
            self._call_in_loop(_set_done, self._writer_done)

    def _next_batch(self) -> list[_Entry] | None:
        """Wait for work; then whole entries (a request's rows stay together) up to max_batch items,
        at least one entry. None once closing and drained."""
        with self._lock:
            while not self._pending:
                if self._closing:
                    return None
                self._writer_waiting = True
                self._wakeup.wait()
            if self._max_wait_s > 0:  # fewer, larger fsyncs at some latency cost
                deadline = time.monotonic() + self._max_wait_s
                while self._pending_items < self._max_batch and not self._closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._writer_waiting = True
                    self._wakeup.wait(remaining)
                self._writer_waiting = False
            batch: list[_Entry] = []
            taken = 0
            pending = self._pending
            while pending and (not batch or taken + len(pending[0][0]) <= self._max_batch):
                items, waiter = pending.popleft()
                self._pending_items -= len(items)
                # The caller gave up before the write: it never got a 200. (Reading another
                # thread's future state is a benign race: at worst it is written anyway.)
                if not (isinstance(waiter, asyncio.Future) and waiter.cancelled()):
                    batch.append((items, waiter))
                    taken += len(items)
            return batch

    def _commit(self, batch: list[_Entry]) -> None:
        if self._failure is not None:
            self._settle(batch, None, self._failure)
            return
        items = batch[0][0] if len(batch) == 1 else [item for entry_items, _ in batch for item in entry_items]
        try:
            payloads = self._codec.encode(items, self._log.end_offset)
            offsets = self._log.append_offsets(payloads)  # checks each payload's size (ValueError: a bug)
        except OSError as error:  # the write was cut back: only this batch fails
            self._settle(batch, None, str(error))
            return
        except Exception as error:  # a bug, not the disk: stop trusting the log, keep answering
            self._failure = f"unexpected error: {error!r}"
            self._settle(batch, None, self._failure)
            return
        try:
            self._log.sync()
        except Exception as error:
            self._failure = f"fsync failed; the log must be reopened: {error}"
            self._settle(batch, None, str(error))
            return
        try:  # before the answer: whoever gets the 200 then sees the batch in the codec's state
            self._codec.durable(items, offsets, self._log.end_offset)
        except Exception as error:  # noqa: BLE001 - the batch is durable; only later appends are refused
            self._failure = f"could not record the batch after writing it: {error!r}"
        self._settle(batch, offsets, None)

    def _settle(self, batch: list[_Entry], offsets: list[int] | None, failure: str | None) -> None:
        """One wake-up of the event loop per batch."""
        self._call_in_loop(_resolve, batch, offsets, failure)

    def _call_in_loop(self, function: Any, *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _resolve(batch: list[_Entry], offsets: list[int] | None, failure: str | None) -> None:
    """Runs in the event loop: every waiter of a batch gets its offsets, or ServiceUnavailable."""
    position = 0
    single = len(batch) == 1
    for entry_items, waiter in batch:
        if offsets is None:
            mine, error = None, ServiceUnavailable(f"could not write the source's log: {failure}")
        else:
            count = len(entry_items)
            mine, error = (offsets if single else offsets[position:position + count]), None
            position += count
        if isinstance(waiter, asyncio.Future):
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(mine)
            else:
                waiter.set_exception(error)
            continue
        try:
            waiter(mine, error)
        except Exception:  # noqa: BLE001 - one waiter's bug must not keep the others of the batch waiting
            log.exception("a group commit waiter failed")
