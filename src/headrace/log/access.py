"""How the pipeline reaches a source's or table's durable log: the files themselves (local mode, the same host), or
the headrace server's log read service over the network (log/read_service.py, log/read_client.py).

Both answer the same four questions, in log offsets (record boundaries):
- `scan_end(start)`: the end of the complete records from `start` (what `latestOffset` offers);
- `scan_capped(start, max_records)`: the same, past at most `max_records` records, with record boundaries every
  BOUNDARY_EVERY records (where a large batch may be split);
- `records(start, end)`: (offset, payload) of each record starting in [start, end);
- `records_at(offsets)`: the record at each of these offsets (the rows a batch replaces, view_changes.read_replaced).

Pure stdlib: imported inside Spark Python workers."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from headrace.log.reader import read_records, scan_end
from headrace.log.segments import CLEAN_ENDS, HEADER_BYTES, FrameScanner, LogCorruption, list_segments, segment_path

BOUNDARY_EVERY = 2_048  # records between remembered record boundaries (where a batch may be split)


class LogAccess(Protocol):
    def scan_end(self, start: int) -> int: ...

    def scan_capped(self, start: int, max_records: int) -> tuple[int, list[int]]: ...

    def records(self, start: int, end: int) -> Iterator[tuple[int, bytes]]: ...

    def records_at(self, offsets: Sequence[int]) -> list[tuple[int, bytes]]: ...


def scan_capped(directory: Path, start: int, max_records: int,
                boundary_every: int = BOUNDARY_EVERY) -> tuple[int, list[int]]:
    """(end, boundaries): the offset past at most `max_records` complete, checksum-valid records from `start`
    (as `scan_end`, which this equals when fewer records exist), and record boundaries every `boundary_every`
    records in between."""
    bases = list_segments(directory)
    index = bisect.bisect_right(bases, start) - 1
    if index < 0:
        return start, []
    position, count, boundaries = start, 0, []
    while index < len(bases):
        base = bases[index]
        try:
            file = open(segment_path(directory, base), "rb")
        except FileNotFoundError:
            return position, boundaries
        with file:
            scanner = FrameScanner(file, position - base)
            for frame_position, payload in scanner.frames():
                position = base + frame_position + HEADER_BYTES + len(payload)
                count += 1
                if count >= max_records:
                    return position, boundaries
                if count % boundary_every == 0:
                    boundaries.append(position)
        position = base + scanner.position
        next_index = index + 1
        if scanner.stop_reason not in CLEAN_ENDS or next_index >= len(bases) or bases[next_index] != position:
            return position, boundaries
        index = next_index
    return position, boundaries


def record_at(directory: Path, offset: int) -> tuple[int, bytes]:
    """The record starting at `offset`; LookupError if none starts there (an offset inside a record reads as a bad
    checksum, one past the end as a missing segment: to the caller both are offsets that hold no record)."""
    try:
        found = next(read_records(directory, offset, offset + 1), None)
    except LogCorruption as error:
        raise LookupError(f"no record at offset {offset} in the log {directory}: {error}") from None
    if found is None or found[0] != offset:
        raise LookupError(f"no record at offset {offset} in the log {directory}")
    return found


class FileLogAccess:
    """The log's files, read directly: the pipeline shares the server's disk (local mode)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def scan_end(self, start: int) -> int:
        return scan_end(self.directory, start) if self.directory.exists() else start

    def scan_capped(self, start: int, max_records: int) -> tuple[int, list[int]]:
        return scan_capped(self.directory, start, max_records) if self.directory.exists() else (start, [])

    def records(self, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        return read_records(self.directory, start, end)

    def records_at(self, offsets: Sequence[int]) -> list[tuple[int, bytes]]:
        return [record_at(self.directory, offset) for offset in offsets]

    def __repr__(self) -> str:
        return f"the log {self.directory}"
