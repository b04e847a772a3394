"""Reading a source's log from other processes (the Spark data source) while the writer appends.

Readers never take a lock: a record becomes visible once its bytes are complete and its checksum
matches, and readers only ever go as far as `scan_end` said. Offsets passed in must be record
boundaries (0, or an offset this module or the writer returned).

Pure stdlib: imported inside Spark Python workers.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from pathlib import Path

from headrace.log.segments import (
    CLEAN_ENDS,
    STOP_CORRUPT,
    STOP_LIMIT,
    STOP_PARTIAL,
    FrameScanner,
    LogCorruption,
    list_segments,
    segment_path,
)

__all__ = ["LogCorruption", "read_records", "scan_end"]


def _segment_index(bases: list[int], offset: int) -> int:
    """Index of the segment holding `offset` (the last one starting at or before it), or -1."""
    return bisect.bisect_right(bases, offset) - 1


def scan_end(directory: Path, start: int) -> int:
    """The offset just past the last complete, checksum-valid record at or after `start`.

    Reads only the bytes after `start` and stops quietly at a partial record (the writer is still
    writing it), at one that does not check out (a torn tail the writer's recovery will cut), or at
    the zero-filled rest of a preallocated segment."""
    bases = list_segments(directory)
    index = _segment_index(bases, start)
    if index < 0:
        return start
    position = start
    while index < len(bases):
        base = bases[index]
        try:
            file = open(segment_path(directory, base), "rb")
        except FileNotFoundError:
            return position  # removed by a recovery that cut this tail: nothing past here
        with file:
            scanner = FrameScanner(file, position - base)
            for _ in scanner.frames():
                pass
        position = base + scanner.position
        next_index = index + 1
        # Go on only when this segment ended cleanly and the next one continues exactly here.
        if scanner.stop_reason not in CLEAN_ENDS or next_index >= len(bases) or bases[next_index] != position:
            return position
        index = next_index
    return position


def read_records(directory: Path, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, payload) for every record starting in [start, end).

    `end` should come from `scan_end` (or the writer): everything before it must be whole records,
    so a bad checksum, a truncated record or a missing segment raises LogCorruption."""
    if start >= end:
        return
    bases = list_segments(directory)
    index = _segment_index(bases, start)
    if index < 0:
        raise LogCorruption(f"no segment of the log in {directory} holds offset {start}")
    position = start
    while position < end:
        if index >= len(bases) or bases[index] > position:
            raise LogCorruption(f"the log in {directory} has no segment at offset {position} (reading up to {end})")
        base = bases[index]
        try:
            file = open(segment_path(directory, base), "rb")
        except FileNotFoundError as missing:
            raise LogCorruption(f"segment {base} of the log in {directory} is missing") from missing
        with file:
            scanner = FrameScanner(file, position - base, stop_position=end - base)
            for segment_position, payload in scanner.frames():
                yield base + segment_position, bytes(payload)
        position = base + scanner.position
        if scanner.stop_reason == STOP_LIMIT:
            return
        if scanner.stop_reason in (STOP_CORRUPT, STOP_PARTIAL):
            problem = "fails its checksum" if scanner.stop_reason == STOP_CORRUPT else "is truncated"
            raise LogCorruption(
                f"the record at offset {position} in the log in {directory} {problem} (reading up to {end})"
            )
        index += 1  # clean end of this segment (its file, or its preallocated zeros): the next one must start here
        if index < len(bases) and bases[index] != position:
            raise LogCorruption(f"the log in {directory} has a gap at offset {position} (next segment {bases[index]})")
