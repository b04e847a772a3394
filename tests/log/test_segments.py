"""SegmentedLog: framing, offsets, rolls and crash recovery of the writer side."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.log.reader import read_records, scan_end
from headrace.log.segments import (
    DEFAULT_PREALLOCATE_BYTES,
    LogCorruption,
    SegmentedLog,
    list_segments,
    segment_path,
    valid_prefix_length,
)


def read_all(directory: Path) -> list[tuple[int, bytes]]:
    return list(read_records(directory, 0, scan_end(directory, 0)))


def test_round_trip_and_offsets(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path) as log:
        first, end = log.append([b"alpha", b"beta"])
        assert (first, end) == (0, 8 + 5 + 8 + 4)
        assert log.append([b"gamma"]) == (end, end + 8 + 5)
        log.sync()
        assert log.end_offset == end + 13
    assert read_all(tmp_path) == [(0, b"alpha"), (13, b"beta"), (25, b"gamma")]


def test_frame_is_length_crc_payload_big_endian(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append([b"xyz"])
        log.sync()
    raw = segment_path(tmp_path, 0).read_bytes()
    frame = struct.pack(">II", 3, zlib.crc32(b"xyz")) + b"xyz"
    assert raw[:len(frame)] == frame
    assert raw[len(frame):] == bytes(len(raw) - len(frame))  # the preallocated rest is zeros


def test_empty_append_and_empty_payload(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path) as log:
        assert log.append([]) == (0, 0)
        with pytest.raises(ValueError):
            log.append([b"ok", b""])  # a zero-length record is what a zero-filled block looks like
        assert log.end_offset == 0  # validation happens before anything is written


def test_reopen_continues_at_the_end(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append([b"one"])
        log.sync()
    with SegmentedLog(tmp_path) as log:
        assert log.end_offset == 11
        assert log.append([b"two"]) == (11, 22)
        log.sync()
    assert [payload for _, payload in read_all(tmp_path)] == [b"one", b"two"]


def test_rolls_keep_records_whole_and_segments_contiguous(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path, segment_bytes=40) as log:
        offsets = log.append_offsets([b"a" * 10, b"b" * 10, b"c" * 30, b"d" * 50])
        log.sync()
    # 18 + 18 fit in 40, a third record does not; one bigger than a segment gets its own.
    assert offsets == [0, 18, 36, 74]
    assert list_segments(tmp_path) == [0, 36, 74]
    sizes = [segment_path(tmp_path, base).stat().st_size for base in list_segments(tmp_path)]
    assert sizes == [36, 38, 58]
    assert [offset for offset, _ in read_all(tmp_path)] == offsets


@pytest.mark.parametrize(
    "tail",
    [
        b"\x00\x00",  # a partial header
        struct.pack(">II", 100, 0) + b"short",  # a header promising more than was written
        struct.pack(">II", 5, zlib.crc32(b"right")) + b"wrong",  # a checksum mismatch
        b"\x00" * 4096,  # a zero-filled block
        os.urandom(1000),  # garbage
    ],
    ids=["partial-header", "partial-payload", "bad-crc", "zeros", "garbage"],
)
def test_torn_tail_is_cut_off_and_appends_continue(tmp_path: Path, tail: bytes) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append([b"first", b"second"])
        log.sync()
        good_end = log.end_offset
    with open(segment_path(tmp_path, 0), "ab") as segment:
        segment.write(tail)
    assert scan_end(tmp_path, 0) == good_end  # readers never see past the damage
    with SegmentedLog(tmp_path) as log:
        assert log.end_offset == good_end
        assert segment_path(tmp_path, 0).stat().st_size == good_end
        assert log.append([b"third"]) == (good_end, good_end + 13)
        log.sync()
    assert [payload for _, payload in read_all(tmp_path)] == [b"first", b"second", b"third"]


def test_torn_rolled_segment_drops_the_unacknowledged_segments_after_it(tmp_path: Path) -> None:
    # A crash after a roll but before sync(): the new segment reached the disk, the tail of the
    # old one did not. Nothing after the tear was acknowledged, so recovery cuts it all.
    with SegmentedLog(tmp_path, segment_bytes=40) as log:
        log.append([b"a" * 10])
        log.sync()
        log.append([b"b" * 10, b"c" * 30])
    assert list_segments(tmp_path) == [0, 36]
    os.truncate(segment_path(tmp_path, 0), 18 + 7)  # the second record is torn
    assert scan_end(tmp_path, 0) == 18
    with SegmentedLog(tmp_path, segment_bytes=40) as log:
        assert log.end_offset == 18
        assert list_segments(tmp_path) == [0]
        assert log.append([b"d" * 5]) == (18, 31)
        log.sync()
    assert read_all(tmp_path) == [(0, b"a" * 10), (18, b"d" * 5)]


def test_overlapping_segments_refuse_to_open(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append([b"a" * 20])
        log.sync()
    segment_path(tmp_path, 10).write_bytes(b"")
    with pytest.raises(LogCorruption, match="overlaps"):
        SegmentedLog(tmp_path)


def test_failed_write_is_cut_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append([b"kept"])
        real_pwrite = os.pwrite

        def short_write_then_fail(fd: int, data: bytes, offset: int) -> int:
            real_pwrite(fd, bytes(data[:3]), offset)  # a partial write reaches the file, then the disk fills
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "pwrite", short_write_then_fail)
        with pytest.raises(OSError):
            log.append([b"lost"])
        monkeypatch.undo()
        assert log.end_offset == 12
        assert log.append([b"next"]) == (12, 24)
        log.sync()
    assert [payload for _, payload in read_all(tmp_path)] == [b"kept", b"next"]


def test_one_writer_per_log(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path):
        with pytest.raises(OSError, match="already open"):
            SegmentedLog(tmp_path)
    SegmentedLog(tmp_path).close()  # the lock goes with close()


def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path)
    log.close()
    log.close()
    with pytest.raises(OSError, match="closed"):
        log.append([b"x"])


# -- preallocated tails -----------------------------------------------------------------------------


def test_tail_is_zero_filled_in_whole_chunks_and_grows_only_per_chunk(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path, preallocate_bytes=4096) as log:
        log.append([b"a" * 100])
        log.sync()
        path = segment_path(tmp_path, 0)
        assert path.stat().st_size == 4096
        for _ in range(30):  # 30 x 108 bytes: still inside the first chunk, so the size never changes
            log.append([b"b" * 100])
        assert path.stat().st_size == 4096
        log.append([b"c" * 1000])  # crosses the chunk: one growth, to the next whole chunk
        assert path.stat().st_size == 8192
        log.sync()
        end = log.end_offset
    assert scan_end(tmp_path, 0) == end
    assert [len(payload) for _, payload in read_all(tmp_path)] == [100] * 31 + [1000]
    assert valid_prefix_length(path) == end


def test_preallocation_never_goes_past_the_segment_size(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path, segment_bytes=1000, preallocate_bytes=4096) as log:
        log.append([b"x" * 10])
        assert segment_path(tmp_path, 0).stat().st_size == 1000
        log.append([b"y" * 5000])  # bigger than a segment: its own segment, no zeros after it
        log.sync()
    assert segment_path(tmp_path, 18).stat().st_size == 5008


def test_rolled_segments_are_cut_to_their_records(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path, segment_bytes=400, preallocate_bytes=128) as log:
        offsets = log.append_offsets([bytes([i]) * 90 for i in range(1, 10)])
        log.sync()
        end = log.end_offset
    bases = list_segments(tmp_path)
    assert len(bases) > 2
    sizes = [segment_path(tmp_path, base).stat().st_size for base in bases]
    assert sizes[:-1] == [later - base for base, later in zip(bases, bases[1:])]  # exact, no zeros
    assert sizes[-1] > end - bases[-1]  # the tail keeps its zeros
    assert [offset for offset, _ in read_all(tmp_path)] == offsets


def test_a_roll_whose_cut_was_lost_is_repaired(tmp_path: Path) -> None:
    # A crash after the roll but before its cut reached the disk: the rolled segment still ends in
    # preallocated zeros. Readers go past them to the next segment; recovery cuts them.
    with SegmentedLog(tmp_path, segment_bytes=40, preallocate_bytes=0) as log:
        offsets = log.append_offsets([b"a" * 10, b"b" * 10, b"c" * 10])
        log.sync()
    assert list_segments(tmp_path) == [0, 36]
    with open(segment_path(tmp_path, 0), "ab") as rolled:
        rolled.write(bytes(100))
    assert scan_end(tmp_path, 0) == 54
    assert [offset for offset, _ in read_all(tmp_path)] == offsets
    with SegmentedLog(tmp_path, segment_bytes=40) as log:
        assert log.end_offset == 54
        assert segment_path(tmp_path, 0).stat().st_size == 36
        log.append([b"d"])
        log.sync()
    assert [payload for _, payload in read_all(tmp_path)] == [b"a" * 10, b"b" * 10, b"c" * 10, b"d"]


@pytest.mark.parametrize(
    "damage",
    [
        b"\x00\x00\x00\x05",  # a header whose length arrived, but not its checksum nor payload
        struct.pack(">II", 100, 0) + b"short",  # a payload still partly zeros
        struct.pack(">II", 5, zlib.crc32(b"right")) + b"wrong",  # a checksum mismatch
        struct.pack(">II", 0, 12345),  # a zero length that is not zeros
        os.urandom(1000),  # garbage
    ],
    ids=["partial-header", "partial-payload", "bad-crc", "zero-length-garbage", "garbage"],
)
def test_torn_write_inside_the_preallocated_region_is_cut_off(tmp_path: Path, damage: bytes) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append([b"first", b"second"])
        log.sync()
        good_end = log.end_offset
    path = segment_path(tmp_path, 0)
    assert path.stat().st_size == DEFAULT_PREALLOCATE_BYTES
    with open(path, "r+b") as segment:  # a crash mid-write: the damage sits where the next record goes
        segment.seek(good_end)
        segment.write(damage)
    assert scan_end(tmp_path, 0) == good_end
    with SegmentedLog(tmp_path) as log:
        assert log.end_offset == good_end
        assert path.stat().st_size == good_end  # the damage is gone with the zeros
        assert log.append([b"third"]) == (good_end, good_end + 13)
        log.sync()
    assert [payload for _, payload in read_all(tmp_path)] == [b"first", b"second", b"third"]


def test_stale_records_past_a_hole_never_come_back(tmp_path: Path) -> None:
    # A torn write can reach the disk out of order: a later page of it landed, an earlier one did
    # not (still zeros). The later page holds well-formed frames that were never acknowledged; if
    # they stayed in the file, a new record could end exactly where one of them starts and make
    # it readable. Recovery truncates at the end of the valid records, so they are gone.
    with SegmentedLog(tmp_path) as log:
        log.append([b"acked"])
        log.sync()
        good_end = log.end_offset
    stale = struct.pack(">II", 5, zlib.crc32(b"stale")) + b"stale"
    with open(segment_path(tmp_path, 0), "r+b") as segment:
        segment.seek(good_end + 8 + 20)
        segment.write(stale)
    assert scan_end(tmp_path, 0) == good_end
    with SegmentedLog(tmp_path) as log:
        log.append([b"x" * 20])  # ends exactly where the stale frame started
        log.sync()
    assert [payload for _, payload in read_all(tmp_path)] == [b"acked", b"x" * 20]


def test_failed_preallocation_leaves_the_records_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_pwrite = os.pwrite

    def no_room_for_zeros(fd: int, data: bytes, offset: int) -> int:
        if not any(data):
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", no_room_for_zeros)
    with SegmentedLog(tmp_path) as log:
        assert log.append([b"one"]) == (0, 11)
        assert segment_path(tmp_path, 0).stat().st_size == 11
        assert log.append([b"two"]) == (11, 22)
        log.sync()
    monkeypatch.undo()
    assert [payload for _, payload in read_all(tmp_path)] == [b"one", b"two"]


@settings(max_examples=60, deadline=None)
@given(
    sessions=st.lists(st.lists(st.lists(st.binary(min_size=1, max_size=200), max_size=6), max_size=4),
                      min_size=1, max_size=4),
    segment_bytes=st.sampled_from([16, 100, 700, 64 << 20]),
    preallocate_bytes=st.sampled_from([0, 64, 256, 4096]),
)
def test_property_preallocated_logs_reopen_and_continue_exactly(
    tmp_path_factory: pytest.TempPathFactory, sessions: list[list[list[bytes]]], segment_bytes: int,
    preallocate_bytes: int,
) -> None:
    """Whatever the segment and preallocation sizes, closing and reopening between batches loses
    nothing, invents nothing, and keeps rolled segments exact."""
    directory = tmp_path_factory.mktemp("log")
    expected: list[tuple[int, bytes]] = []
    for batches in sessions:
        with SegmentedLog(directory, segment_bytes=segment_bytes, preallocate_bytes=preallocate_bytes) as log:
            assert log.end_offset == (expected[-1][0] + 8 + len(expected[-1][1]) if expected else 0)
            for batch in batches:
                expected += zip(log.append_offsets(batch), batch, strict=True)
                log.sync()
        assert read_all(directory) == expected
    bases = list_segments(directory)
    for base, later in zip(bases, bases[1:]):
        assert segment_path(directory, base).stat().st_size == later - base
