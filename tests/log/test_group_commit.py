"""GroupCommitter: durable appends from many concurrent callers sharing fsyncs."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from headrace.errors import ServiceUnavailable
from headrace.log.group_commit import GroupCommitter
from headrace.log.reader import read_records, scan_end
from headrace.log.segments import SegmentedLog


class CountingLog(SegmentedLog):
    """A real log that counts its fsyncs, to see that requests share them."""

    syncs = 0

    def sync(self) -> None:
        self.syncs += 1
        super().sync()


def test_concurrent_appends_get_distinct_readable_offsets(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[int], int]:
        log = CountingLog(tmp_path, segment_bytes=4096)
        committer = GroupCommitter(log)
        payloads = [f"request-{i}".encode() * (1 + i % 5) for i in range(500)]
        offsets = await asyncio.gather(*(committer.append(p) for p in payloads))
        await committer.close()
        log.close()
        assert len(set(offsets)) == 500
        records = dict(read_records(tmp_path, 0, scan_end(tmp_path, 0)))
        assert [records[offset] for offset in offsets] == payloads
        return offsets, log.syncs

    offsets, syncs = asyncio.run(scenario())
    assert syncs < 100  # 500 requests, far fewer fsyncs: that is the group commit


def test_offset_is_returned_only_after_the_sync(tmp_path: Path) -> None:
    order: list[str] = []

    class OrderedLog(SegmentedLog):
        def sync(self) -> None:
            super().sync()
            order.append("synced")

    async def scenario() -> None:
        log = OrderedLog(tmp_path)
        committer = GroupCommitter(log)
        await committer.append(b"x")
        order.append("returned")
        await committer.close()
        log.close()

    asyncio.run(scenario())
    assert order == ["synced", "returned"]


def test_requests_during_an_fsync_form_the_next_batch(tmp_path: Path) -> None:
    batches: list[int] = []

    class SlowLog(SegmentedLog):
        def append_offsets(self, payloads: object) -> list[int]:
            batches.append(len(payloads))  # type: ignore[arg-type]
            return super().append_offsets(payloads)  # type: ignore[arg-type]

        def sync(self) -> None:
            super().sync()
            import time
            time.sleep(0.05)  # a slow disk

    async def scenario() -> None:
        log = SlowLog(tmp_path)
        committer = GroupCommitter(log)
        first = asyncio.create_task(committer.append(b"first"))
        await asyncio.sleep(0.01)  # the first batch is now in its fsync
        later = [asyncio.create_task(committer.append(b"later")) for _ in range(20)]
        await asyncio.gather(first, *later)
        await committer.close()
        log.close()

    asyncio.run(scenario())
    assert batches == [1, 20]


def test_max_batch_and_max_wait(tmp_path: Path) -> None:
    batches: list[int] = []

    class RecordingLog(SegmentedLog):
        def append_offsets(self, payloads: object) -> list[int]:
            batches.append(len(payloads))  # type: ignore[arg-type]
            return super().append_offsets(payloads)  # type: ignore[arg-type]

    async def scenario() -> None:
        log = RecordingLog(tmp_path)
        committer = GroupCommitter(log, max_batch=7, max_wait_s=0.2)
        tasks = []
        for _ in range(10):  # trickle in: without max_wait_s these would commit one by one
            tasks.append(asyncio.create_task(committer.append(b"r")))
            await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)
        await committer.close()
        log.close()

    asyncio.run(scenario())
    assert batches == [7, 3]


def test_fsync_failure_fails_the_batch_and_marks_the_log_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        log = SegmentedLog(tmp_path)
        committer = GroupCommitter(log)
        assert await committer.append(b"before") == 0

        def failing_fdatasync(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
        results = await asyncio.gather(*(committer.append(b"doomed") for _ in range(5)), return_exceptions=True)
        assert all(isinstance(r, ServiceUnavailable) for r in results)
        assert "could not write the source's log" in str(results[0])
        assert committer.failure is not None
        monkeypatch.undo()
        # The disk may be fine again, but what the page cache holds is unknown: still refused.
        with pytest.raises(ServiceUnavailable, match="reopened"):
            await committer.append(b"after")
        await committer.close()
        log.close()
        # Reopening runs recovery, and the log takes appends again.
        reopened = SegmentedLog(tmp_path)
        fresh = GroupCommitter(reopened)
        offset = await fresh.append(b"after reopen")
        await fresh.close()
        reopened.close()
        payloads = [p for _, p in read_records(tmp_path, 0, scan_end(tmp_path, 0))]
        assert payloads[0] == b"before" and payloads[-1] == b"after reopen"
        assert offset > 0

    asyncio.run(scenario())


def test_write_failure_fails_only_that_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        log = SegmentedLog(tmp_path)
        committer = GroupCommitter(log)
        monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: (_ for _ in ()).throw(OSError(28, "No space left")))
        with pytest.raises(ServiceUnavailable, match="No space left"):
            await committer.append(b"full disk")
        monkeypatch.undo()
        assert committer.failure is None  # the write was cut back: the log is still consistent
        assert await committer.append(b"space again") == 0
        await committer.close()
        log.close()

    asyncio.run(scenario())


def test_close_drains_then_refuses(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = SegmentedLog(tmp_path)
        committer = GroupCommitter(log)
        tasks = [asyncio.create_task(committer.append(b"queued")) for _ in range(50)]
        await asyncio.sleep(0)
        await committer.close()
        assert all(task.done() and not task.exception() for task in tasks)
        with pytest.raises(ServiceUnavailable, match="closing"):
            await committer.append(b"late")
        log.close()
        assert len(list(read_records(tmp_path, 0, scan_end(tmp_path, 0)))) == 50

    asyncio.run(scenario())


def test_a_caller_that_gave_up_before_the_write_is_skipped(tmp_path: Path) -> None:
    in_fsync = threading.Event()
    release = threading.Event()

    class HeldLog(SegmentedLog):
        def sync(self) -> None:
            super().sync()
            in_fsync.set()
            release.wait(10)  # the writer is busy with the first batch until the test says so

    async def scenario() -> None:
        log = HeldLog(tmp_path)
        committer = GroupCommitter(log)
        first = asyncio.create_task(committer.append(b"first"))
        await asyncio.to_thread(in_fsync.wait, 10)
        abandoned = asyncio.create_task(committer.append(b"abandoned"))
        await asyncio.sleep(0)  # queued behind the first batch
        abandoned.cancel()
        kept = asyncio.create_task(committer.append(b"kept"))
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, abandoned, kept, return_exceptions=True)
        assert abandoned.cancelled() and not kept.cancelled()
        await committer.close()
        log.close()
        assert [p for _, p in read_records(tmp_path, 0, scan_end(tmp_path, 0))] == [b"first", b"kept"]


def test_batches_are_resolved_with_one_loop_wakeup_each(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        calls = 0
        real = loop.call_soon_threadsafe

        def counting(*args: object, **kwargs: object) -> object:
            nonlocal calls
            calls += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        log = CountingLog(tmp_path)
        committer = GroupCommitter(log)
        await asyncio.gather(*(committer.append(b"r") for _ in range(300)))
        await committer.close()
        log.close()
        return calls, log.syncs

    calls, syncs = asyncio.run(scenario())
    assert syncs < 300
    assert calls <= syncs + 2  # one per batch (and the join at close), not one per request

    asyncio.run(scenario())


def test_committer_can_be_built_outside_the_loop(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path)
    committer = GroupCommitter(log)
    assert asyncio.run(committer.append(b"late start")) == 0
    log.close()


def test_callback_waiters_share_batches_with_futures_and_hear_of_failures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        log = SegmentedLog(tmp_path)
        committer = GroupCommitter(log)
        heard: dict[int, tuple[list[int] | None, BaseException | None]] = {}
        all_heard = asyncio.Event()

        def settled_for(index: int) -> object:
            def settled(offsets: list[int] | None, error: BaseException | None) -> None:
                heard[index] = (offsets, error)
                if len(heard) == 10:
                    all_heard.set()
            return settled

        futures = []
        for index in range(20):
            items = [f"r{index}-{n}".encode() for n in range(1 + index % 3)]
            if index % 2:
                committer.append_many_then(items, settled_for(index))  # type: ignore[arg-type]
            futures.append(committer.append_many(items))
        offsets_by_future = await asyncio.gather(*futures)
        await asyncio.wait_for(all_heard.wait(), 10)
        assert len(heard) == 10 and all(error is None for _, error in heard.values())
        records = dict(read_records(tmp_path, 0, scan_end(tmp_path, 0)))
        for index, (offsets, _) in heard.items():
            assert offsets is not None
            assert [records[offset] for offset in offsets] == [f"r{index}-{n}".encode() for n in range(1 + index % 3)]
        every_offset = [o for offsets in offsets_by_future for o in offsets]
        every_offset += [o for offsets, _ in heard.values() for o in offsets or []]
        assert len(set(every_offset)) == len(every_offset) == len(records)

        failed: list[tuple[list[int] | None, BaseException | None]] = []
        done = asyncio.Event()

        def failing_fdatasync(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
        committer.append_many_then([b"lost"], lambda offsets, error: (failed.append((offsets, error)), done.set()))
        await asyncio.wait_for(done.wait(), 10)
        monkeypatch.undo()
        assert failed[0][0] is None and isinstance(failed[0][1], ServiceUnavailable)
        with pytest.raises(ServiceUnavailable):
            committer.append_many_then([b"later"], lambda offsets, error: None)
        await committer.close()
        log.close()

    asyncio.run(scenario())
