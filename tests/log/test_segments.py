"""SegmentedLog: framing, offsets, rolls and crash recovery of the writer side."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from headrace.log.reader import read_records, scan_end
from headrace.log.segments import LogCorruption, SegmentedLog, list_segments, segment_path


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
    assert raw == struct.pack(">II", 3, zlib.crc32(b"xyz")) + b"xyz"


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
        real_write = os.write

        def short_write_then_fail(fd: int, data: bytes) -> int:
            real_write(fd, bytes(data[:3]))  # a partial write reaches the file, then the disk fills
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "write", short_write_then_fail)
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
