"""Windowed idempotency at ingest: the on-disk index, replacement records, eviction and rebuilding
the index from the log after a crash. Real logs, real RocksDB indexes, no HTTP."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.catalog.items import WebhookSource
from headrace.errors import ServiceUnavailable
from headrace.log.reader import read_records, scan_end
from headrace.log.segments import SegmentedLog
from headrace.webhook.dedupe import INDEX_FILE, DedupeIndex, KeyEntry, body_hash, catch_up, key_hash
from headrace.webhook.ingest import SourceIngestor
from headrace.webhook.record import WebhookRecord, decode, encode

SECOND = 1_000_000


def keyed_source() -> WebhookSource:
    return WebhookSource(id="u1", name="events", body_format="json", include_headers=False,
                         idempotent_expr="body->>'id'", create_sql="CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON")


def logged(log_dir: Path) -> list[tuple[int, WebhookRecord]]:
    return [(offset, decode(payload)) for offset, payload in read_records(log_dir, 0, scan_end(log_dir, 0))]


def live_rows(log_dir: Path) -> dict[int, WebhookRecord]:
    """What the pipeline makes of the log: each replacement deletes the row it names."""
    rows: dict[int, WebhookRecord] = {}
    for offset, record in logged(log_dir):
        if record.prev_offset is not None:
            assert record.prev_offset in rows, "a replacement must name a live row"
            del rows[record.prev_offset]
        rows[offset] = record
    return rows


@given(received_at_us=st.integers(0, 1 << 62), key=st.none() | st.text(), body=st.binary(min_size=0, max_size=64),
       headers=st.none() | st.dictionaries(st.text(), st.text()), prev=st.none() | st.integers(0, 1 << 62))
def test_record_codec_round_trip(received_at_us: int, key: str | None, body: bytes, headers: dict[str, str] | None,
                                 prev: int | None) -> None:
    record = WebhookRecord(received_at_us=received_at_us, idempotency_key=key, headers=headers, body=body,
                           prev_offset=prev)
    assert decode(encode(record)) == record


def test_index_lookup_record_and_covered_offset_survive_reopening(tmp_path: Path) -> None:
    index = DedupeIndex(tmp_path / INDEX_FILE)
    a, b = key_hash("a"), key_hash("b")
    index.record([(a, KeyEntry(10, body_hash(b"1"), 0)), (b, KeyEntry(11, body_hash(b"2"), 40))], covered_offset=80)
    index.record([(a, KeyEntry(12, body_hash(b"3"), 80))], covered_offset=120)
    index.close()
    reopened = DedupeIndex(tmp_path / INDEX_FILE)
    assert reopened.covered_offset == 120
    assert reopened.lookup([a, b, key_hash("c")]) == {a: KeyEntry(12, body_hash(b"3"), 80),
                                                      b: KeyEntry(11, body_hash(b"2"), 40)}
    reopened.close()


def test_eviction_drops_whole_buckets_older_than_the_cutoff(tmp_path: Path) -> None:
    index = DedupeIndex(tmp_path / INDEX_FILE, bucket_us=100)
    index.record([(key_hash(str(n)), KeyEntry(n, b"h" * 8, n)) for n in range(1000)], covered_offset=1000)
    assert index.evict(older_than_us=750) == 7  # [0, 700); 700-749 share a bucket with 750-799
    assert index.evict(older_than_us=750) == 0
    assert index.count() == 300
    assert set(index.lookup([key_hash("699"), key_hash("700")])) == {key_hash("700")}
    index.close()
    reopened = DedupeIndex(tmp_path / INDEX_FILE, bucket_us=7)  # an index keeps the width it was made with
    assert reopened.bucket_us == 100
    assert (reopened.evict(older_than_us=1000), reopened.count()) == (3, 0)
    reopened.close()


def run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_ingest_indexes_keys_and_bodies_as_the_log_replay_does(tmp_path: Path) -> None:
    # The ingest path hashes inline; catch_up (start-up) uses key_hash/body_hash: they must agree,
    # or a retry after a restart would be taken for a new key.
    body = '{"id": "\u00e9t\u00e9"}'.encode()

    async def scenario() -> None:
        ingestor = SourceIngestor(keyed_source(), tmp_path)
        assert await ingestor.ingest([], body, 100) == 0
        await ingestor.close()

    run(scenario())
    index = DedupeIndex(tmp_path / INDEX_FILE)
    assert index.lookup([key_hash("\u00e9t\u00e9")]) == {key_hash("\u00e9t\u00e9"): KeyEntry(100, body_hash(body), 0)}
    index.close()


def test_duplicate_with_identical_body_replaces_the_row_and_restarts_its_window(tmp_path: Path) -> None:
    async def scenario() -> None:
        ingestor = SourceIngestor(keyed_source(), tmp_path)
        first = await ingestor.ingest([], b'{"id": 1}', 100)
        second = await ingestor.ingest([], b'{"id": 1}', 200)
        other = await ingestor.ingest([], b'{"id": 2}', 300)
        assert (ingestor.metrics.rows_new, ingestor.metrics.rows_duplicate, ingestor.metrics.rows_replaced) == (2, 1, 0)
        await ingestor.close()
        records = dict(logged(tmp_path))
        assert records[second].prev_offset == first
        assert records[other].prev_offset is None
        rows = live_rows(tmp_path)
        assert sorted(rows) == [second, other]
        assert rows[second].received_at_us == 200  # the latest arrival

    run(scenario())


def test_changed_body_replaces_the_row(tmp_path: Path) -> None:
    async def scenario() -> None:
        ingestor = SourceIngestor(keyed_source(), tmp_path)
        await ingestor.ingest([], b'{"id": 1, "v": "old"}', 100)
        await ingestor.ingest([], b'{"id": 1, "v": "new"}', 200)
        assert ingestor.metrics.rows_replaced == 1
        await ingestor.close()
        [row] = live_rows(tmp_path).values()
        assert row.body == b'{"id": 1, "v": "new"}'

    run(scenario())


def test_same_key_concurrently_in_one_batch_makes_one_row(tmp_path: Path) -> None:
    async def scenario() -> None:
        ingestor = SourceIngestor(keyed_source(), tmp_path)
        offsets = await asyncio.gather(*(ingestor.ingest([], b'{"id": "same", "n": %d}' % n, 100 + n)
                                         for n in range(20)))
        await ingestor.close()
        assert len(set(offsets)) == 20  # every request was appended and answered
        [row] = live_rows(tmp_path).values()
        assert row.body == b'{"id": "same", "n": 19}'  # the last write in log order wins

    run(scenario())


def test_a_key_that_arrived_again_outlives_the_bucket_of_its_first_arrival(tmp_path: Path) -> None:
    index = DedupeIndex(tmp_path / INDEX_FILE, bucket_us=5)
    again, once = key_hash("again"), key_hash("once")
    index.record([(again, KeyEntry(1, b"a" * 8, 0)), (once, KeyEntry(2, b"o" * 8, 40))], covered_offset=80)
    index.record([(again, KeyEntry(10, b"b" * 8, 80))], covered_offset=120)
    assert index.lookup([again, once]) == {again: KeyEntry(10, b"b" * 8, 80), once: KeyEntry(2, b"o" * 8, 40)}
    assert index.evict(older_than_us=5) == 1  # the bucket of "once" and of the first "again"
    assert index.lookup([again, once]) == {again: KeyEntry(10, b"b" * 8, 80)}
    assert index.evict(older_than_us=15) == 1
    assert (index.lookup([again]), index.count()) == ({}, 0)
    index.close()


def test_keys_older_than_the_window_are_new_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        ingestor = SourceIngestor(keyed_source(), tmp_path, window_us=10 * SECOND)
        await ingestor.ingest([], b'{"id": 1}', 0)
        await ingestor.ingest([], b'{"id": 1}', 9 * SECOND)  # within: replaces, restarts the window
        await ingestor.ingest([], b'{"id": 1}', 18 * SECOND)  # within 10 s of the last write
        assert len(live_rows(tmp_path)) == 1
        await ingestor.ingest([], b'{"id": 1}', 29 * SECOND)  # 11 s after the last write: forgotten
        assert len(live_rows(tmp_path)) == 2
        # Eviction removes expired keys from disk (1-second buckets for a 10-second window); the live ones stay.
        await ingestor.ingest([], b'{"id": 2}', 29 * SECOND)
        index = ingestor._index
        assert index is not None and index.bucket_us == SECOND
        assert await ingestor.evict_expired(now_us=35 * SECOND) == 3  # the buckets of 0, 9 and 18 s
        assert set(index.lookup([key_hash("1"), key_hash("2")])) == {key_hash("1"), key_hash("2")}
        assert await ingestor.evict_expired(now_us=40 * SECOND) == 1
        assert index.lookup([key_hash("1"), key_hash("2")]) == {}
        await ingestor.close()

    run(scenario())


def test_index_is_rebuilt_from_the_log_after_a_crash(tmp_path: Path) -> None:
    """Records made durable while the index was not updated (a crash between the fsync and the
    index transaction) are replayed at open."""
    with SegmentedLog(tmp_path) as log:
        log.append_offsets([encode(WebhookRecord(100, "k1", None, b'{"id":"k1"}')),
                            encode(WebhookRecord(101, "k2", None, b'{"id":"k2"}'))])
        log.sync()

    async def scenario() -> None:
        ingestor = SourceIngestor(keyed_source(), tmp_path)
        await ingestor.ingest([], b'{"id":"k1"}', 200)
        assert ingestor.metrics.rows_duplicate == 1  # the same body as the replayed record
        await ingestor.close()
        assert len(live_rows(tmp_path)) == 2

    run(scenario())
    # The index itself lost (or older than the log): rebuilt too.
    shutil.rmtree(tmp_path / INDEX_FILE)
    index = DedupeIndex(tmp_path / INDEX_FILE)
    assert catch_up(index, tmp_path, scan_end(tmp_path, 0)) == 3
    assert set(index.lookup([key_hash("k1"), key_hash("k2")])) == {key_hash("k1"), key_hash("k2")}
    index.close()


def test_an_index_of_the_former_sqlite_layout_is_removed_and_rebuilt_from_the_log(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append_offsets([encode(WebhookRecord(100, "k1", None, b"{}")),
                            encode(WebhookRecord(101, "k2", None, b"{}"))])
        log.sync()
    for name in ("dedupe.sqlite3", "dedupe.sqlite3-wal"):
        (tmp_path / name).write_bytes(b"SQLite format 3\x00")
    index = DedupeIndex(tmp_path / INDEX_FILE)
    assert not (tmp_path / "dedupe.sqlite3").exists() and not (tmp_path / "dedupe.sqlite3-wal").exists()
    assert catch_up(index, tmp_path, scan_end(tmp_path, 0)) == 2
    assert set(index.lookup([key_hash("k1"), key_hash("k2")])) == {key_hash("k1"), key_hash("k2")}
    index.close()


def test_an_index_ahead_of_the_log_is_rebuilt_from_scratch(tmp_path: Path) -> None:
    index = DedupeIndex(tmp_path / INDEX_FILE)
    index.record([(key_hash("ghost"), KeyEntry(1, b"h" * 8, 5000))], covered_offset=5000)
    with SegmentedLog(tmp_path) as log:
        log.append_offsets([encode(WebhookRecord(100, "real", None, b"{}"))])
        log.sync()
    catch_up(index, tmp_path, scan_end(tmp_path, 0))
    assert set(index.lookup([key_hash("ghost"), key_hash("real")])) == {key_hash("real")}
    index.close()


def test_a_failed_fsync_answers_503_and_the_index_does_not_run_ahead(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        ingestor = SourceIngestor(keyed_source(), tmp_path)
        await ingestor.ingest([], b'{"id": "kept"}', 100)

        def failing_sync(self: SegmentedLog) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(SegmentedLog, "sync", failing_sync)
        with pytest.raises(ServiceUnavailable):
            await ingestor.ingest([], b'{"id": "lost"}', 200)
        assert ingestor.failure is not None
        with pytest.raises(ServiceUnavailable):  # the log must be reopened first
            await ingestor.ingest([], b'{"id": "later"}', 300)
        index = ingestor._index
        assert index is not None
        assert set(index.lookup([key_hash("kept"), key_hash("lost")])) == {key_hash("kept")}
        await ingestor.close()

    run(scenario())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 2), st.integers(0, 6)),
                         min_size=1, max_size=30),
       split=st.integers(1, 5))
def test_live_rows_match_the_window_model(tmp_path_factory: pytest.TempPathFactory,
                                          requests: list[tuple[str, int, int]], split: int) -> None:
    """Whatever the batching, the live rows are: per key, the latest write, plus rows left behind
    when a key came back after its window had passed."""
    log_dir = tmp_path_factory.mktemp("log")
    window = 3 * SECOND

    async def scenario() -> None:
        ingestor = SourceIngestor(keyed_source(), log_dir, window_us=window)
        now = 0
        for start in range(0, len(requests), split):  # requests of one chunk may share a batch
            chunk = []
            for key, body, gap in requests[start:start + split]:
                now += gap * SECOND
                chunk.append(ingestor.ingest([], b'{"id": "%s", "v": %d}' % (key.encode(), body), now))
            await asyncio.gather(*chunk)
        await ingestor.close()

    run(scenario())
    expected: list[tuple[str, int]] = []  # (key, body) of live rows
    last: dict[str, tuple[int, int]] = {}  # key -> (index in expected, time of last write)
    now = 0
    for key, body, gap in requests:
        now += gap * SECOND
        previous = last.get(key)
        if previous is not None and previous[1] >= now - window:
            expected[previous[0]] = ("", -1)  # replaced
        expected.append((key, body))
        last[key] = (len(expected) - 1, now)
    want = sorted(row for row in expected if row[1] >= 0)
    got = sorted((record.idempotency_key or "", int(record.body.split(b'"v": ')[1].rstrip(b"}")))
                 for record in live_rows(log_dir).values())
    assert got == want


# -- write-behind (what the ingest path uses) -------------------------------------------------------


def entry(n: int) -> tuple[bytes, KeyEntry]:
    return key_hash(f"k{n}"), KeyEntry(n, body_hash(b"%d" % n), n * 100)


def test_write_behind_keys_are_visible_at_once_and_committed_soon(tmp_path: Path) -> None:
    index = DedupeIndex(tmp_path / INDEX_FILE, write_behind=True)
    index.record([entry(1), entry(2)], covered_offset=200)
    assert index.lookup([entry(1)[0], entry(2)[0], entry(3)[0]]) == dict([entry(1), entry(2)])
    index.flush()
    # A copy of the files as they are now (what a kill -9 would leave): only what was written.
    shutil.copytree(tmp_path / INDEX_FILE, tmp_path / "copy", ignore=shutil.ignore_patterns("LOCK"))
    copy = DedupeIndex(tmp_path / "copy")
    assert copy.lookup([entry(1)[0], entry(2)[0]]) == dict([entry(1), entry(2)])
    assert copy.covered_offset == 200
    copy.close()
    assert index.lookup([entry(1)[0]]) == dict([entry(1)])  # now read from RocksDB
    index.close()


def test_write_behind_later_entries_win_across_flushes(tmp_path: Path) -> None:
    index = DedupeIndex(tmp_path / INDEX_FILE, write_behind=True)
    key = key_hash("same")
    first, second = KeyEntry(1, b"a" * 8, 0), KeyEntry(2, b"b" * 8, 40)
    index.record([(key, first)], covered_offset=40)
    index.flush()
    index.record([(key, second)], covered_offset=80)
    assert index.lookup([key]) == {key: second}
    index.close()  # commits what is queued
    reopened = DedupeIndex(tmp_path / INDEX_FILE)
    assert reopened.lookup([key]) == {key: second}
    assert reopened.covered_offset == 80
    reopened.close()


def test_one_flush_of_many_statements_keeps_the_latest_entry_of_a_repeated_key(tmp_path: Path) -> None:
    index = DedupeIndex(tmp_path / INDEX_FILE, write_behind=True)
    many = [entry(n) for n in range(1, 1001)]  # several multi-row statements in one transaction
    key = key_hash("same")
    first, second = KeyEntry(1, b"a" * 8, 0), KeyEntry(2, b"b" * 8, 40)
    index.record([*many[:500], (key, first)], covered_offset=100)
    index.record([(key, second), *many[500:]], covered_offset=200)  # one flush takes both batches
    index.close()
    reopened = DedupeIndex(tmp_path / INDEX_FILE)
    assert reopened.lookup([key]) == {key: second}
    assert reopened.lookup([hashed for hashed, _ in many]) == dict(many)
    assert (reopened.count(), reopened.covered_offset) == (1001, 200)
    reopened.close()


def test_write_behind_waits_when_the_flusher_is_far_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = DedupeIndex(tmp_path / INDEX_FILE, write_behind=True, max_behind=10)
    unblocked = threading.Event()
    write = DedupeIndex._write

    def stalled_write(self: DedupeIndex, entries: list[tuple[bytes, KeyEntry]], covered_offset: int) -> None:
        unblocked.wait()  # a disk that does not take writes: nothing is written
        write(self, entries, covered_offset)

    monkeypatch.setattr(DedupeIndex, "_write", stalled_write)
    finished = threading.Event()

    def producer() -> None:
        for batch in range(5):
            index.record([entry(batch * 10 + n) for n in range(10)], covered_offset=(batch + 1) * 1000)
        finished.set()

    thread = threading.Thread(target=producer)
    thread.start()
    assert not finished.wait(0.5)  # the queue is over its bound: record() waits
    assert index.lookup([entry(0)[0]]) == dict([entry(0)])  # lookups still answer meanwhile
    unblocked.set()
    assert finished.wait(10)
    thread.join()
    assert index.count() == 50
    index.close()


_CRASH_AFTER_INGEST = """
import asyncio, os, sys, threading
from pathlib import Path
from headrace.catalog.items import WebhookSource
from headrace.webhook.dedupe import DedupeIndex
from headrace.webhook.ingest import SourceIngestor

async def main() -> None:
    DedupeIndex._write = lambda self, entries, covered_offset: threading.Event().wait()  # nothing reaches disk
    source = WebhookSource(id="u1", name="events", body_format="json", include_headers=False,
                           idempotent_expr="body->>'id'", create_sql="CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON")
    ingestor = SourceIngestor(source, Path(sys.argv[1]))
    for n in range(20):
        await ingestor.ingest([], b'{"id": %d}' % n, 100 + n)
    print("acknowledged", flush=True)
    os._exit(0)  # a crash: the index's queued entries were never committed

asyncio.run(main())
"""


def test_entries_lost_from_the_write_behind_queue_are_caught_up_from_the_log(tmp_path: Path) -> None:
    SegmentedLog(tmp_path).close()
    result = subprocess.run([sys.executable, "-c", _CRASH_AFTER_INGEST, str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.strip() == "acknowledged", result.stderr
    committed = DedupeIndex(tmp_path / INDEX_FILE)
    assert committed.count() == 0  # none of the 20 keys reached the index
    committed.close()

    async def scenario() -> None:
        ingestor = SourceIngestor(keyed_source(), tmp_path)  # catch_up replays the log
        for n in range(20):
            await ingestor.ingest([], b'{"id": %d}' % n, 200 + n)
        assert (ingestor.metrics.rows_new, ingestor.metrics.rows_duplicate) == (0, 20)
        await ingestor.close()

    run(scenario())
    assert len(live_rows(tmp_path)) == 20
