"""Readers in other processes: scan_end and read_records while the writer appends."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.log.reader import LogCorruption, read_records, scan_end
from headrace.log.segments import DEFAULT_PREALLOCATE_BYTES, SegmentedLog, list_segments, segment_path


def write(directory: Path, payloads: list[bytes], segment_bytes: int = 64 << 20,
          preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES) -> list[int]:
    with SegmentedLog(directory, segment_bytes=segment_bytes, preallocate_bytes=preallocate_bytes) as log:
        offsets = log.append_offsets(payloads)
        log.sync()
    return offsets


def test_empty_or_missing_log(tmp_path: Path) -> None:
    assert scan_end(tmp_path / "absent", 0) == 0
    assert list(read_records(tmp_path / "absent", 0, 0)) == []
    SegmentedLog(tmp_path).close()
    assert scan_end(tmp_path, 0) == 0


def test_reader_across_segment_rolls(tmp_path: Path) -> None:
    payloads = [bytes([65 + i % 26]) * (1 + i * 7 % 50) for i in range(200)]
    offsets = write(tmp_path, payloads, segment_bytes=256)
    assert len(list_segments(tmp_path)) > 10
    end = scan_end(tmp_path, 0)
    assert list(read_records(tmp_path, 0, end)) == list(zip(offsets, payloads, strict=True))
    # Resuming from any record boundary, including a segment base, sees exactly the rest.
    for index in (1, 57, 133, 199):
        assert scan_end(tmp_path, offsets[index]) == end
        assert [o for o, _ in read_records(tmp_path, offsets[index], end)] == offsets[index:]
    for base in list_segments(tmp_path)[1:]:
        index = offsets.index(base)
        assert [p for _, p in read_records(tmp_path, base, end)] == payloads[index:]


def test_read_range_is_half_open(tmp_path: Path) -> None:
    offsets = write(tmp_path, [b"a", b"b", b"c", b"d"])
    assert [p for _, p in read_records(tmp_path, offsets[1], offsets[3])] == [b"b", b"c"]
    assert list(read_records(tmp_path, offsets[2], offsets[2])) == []


@pytest.mark.parametrize("preallocate_bytes", [0, 4096], ids=["growing-file", "preallocated"])
def test_scan_end_stops_at_a_partial_record_and_resumes(tmp_path: Path, preallocate_bytes: int) -> None:
    offsets = write(tmp_path, [b"complete"], preallocate_bytes=preallocate_bytes)
    end = scan_end(tmp_path, 0)
    assert segment_path(tmp_path, 0).stat().st_size == (end if preallocate_bytes == 0 else 4096)
    frame = struct.pack(">II", 9, zlib.crc32(b"appending")) + b"appending"
    with open(segment_path(tmp_path, 0), "r+b", buffering=0) as segment:
        segment.seek(end)  # where the writer's pwrite goes: past the file's end, or over zeros
        # The writer is mid-way through the header, then mid-way through the payload.
        for piece in (frame[:3], frame[3:8], frame[8:12]):
            segment.write(piece)
            assert scan_end(tmp_path, 0) == end
            assert scan_end(tmp_path, end) == end
        segment.write(frame[12:])
    assert scan_end(tmp_path, end) == end + len(frame)
    assert list(read_records(tmp_path, end, end + len(frame))) == [(end, b"appending")]
    assert offsets == [0]


def test_scan_end_sees_a_segment_the_writer_rolled_to_later(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, segment_bytes=30)
    log.append([b"x" * 10])
    log.sync()
    first_end = scan_end(tmp_path, 0)
    log.append([b"y" * 10, b"z" * 10])
    log.sync()
    assert len(list_segments(tmp_path)) == 3
    assert scan_end(tmp_path, first_end) == log.end_offset
    assert [p for _, p in read_records(tmp_path, first_end, log.end_offset)] == [b"y" * 10, b"z" * 10]
    log.close()


def test_corrupt_record_inside_the_range_raises(tmp_path: Path) -> None:
    offsets = write(tmp_path, [b"good", b"flipped", b"after"])
    end = scan_end(tmp_path, 0)
    path = segment_path(tmp_path, 0)
    data = bytearray(path.read_bytes())
    data[offsets[1] + 8] ^= 0xFF
    path.write_bytes(bytes(data))
    records = read_records(tmp_path, 0, end)
    assert next(records) == (0, b"good")
    with pytest.raises(LogCorruption, match=f"offset {offsets[1]}.*checksum"):
        next(records)
    assert scan_end(tmp_path, 0) == offsets[1]


def test_range_past_the_data_raises(tmp_path: Path) -> None:
    write(tmp_path, [b"only"])
    with pytest.raises(LogCorruption, match="truncated|no segment"):
        list(read_records(tmp_path, 0, 100))


def test_missing_middle_segment_raises(tmp_path: Path) -> None:
    offsets = write(tmp_path, [b"a" * 20, b"b" * 20, b"c" * 20], segment_bytes=30)
    segment_path(tmp_path, offsets[1]).unlink()
    with pytest.raises(LogCorruption, match="gap"):
        list(read_records(tmp_path, 0, offsets[2] + 28))
    assert scan_end(tmp_path, 0) == offsets[1]  # scan_end never crosses a gap


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(st.binary(min_size=1, max_size=300), max_size=20), max_size=8),
    segment_bytes=st.sampled_from([16, 64, 500, 64 << 20]),
)
def test_property_records_come_back_exactly(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[bytes]], segment_bytes: int
) -> None:
    directory = tmp_path_factory.mktemp("log")
    expected: list[tuple[int, bytes]] = []
    with SegmentedLog(directory, segment_bytes=segment_bytes) as log:
        for batch in batches:
            expected += zip(log.append_offsets(batch), batch, strict=True)
        log.sync()
        end = log.end_offset
    assert scan_end(directory, 0) == end
    assert list(read_records(directory, 0, end)) == expected
    with SegmentedLog(directory, segment_bytes=segment_bytes) as reopened:
        assert reopened.end_offset == end  # recovery of a clean log changes nothing
