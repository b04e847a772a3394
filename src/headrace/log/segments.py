"""The durable, append-only, offset-addressed log of one source, split into segment files.

Pure stdlib on purpose: `headrace.log` is imported inside Spark Python workers.

On-disk format
--------------
A record is framed as ``[u32 payload_len][u32 crc32(payload)][payload]``, big-endian. Offsets are
logical byte positions across the whole log; a segment file is named ``{base_offset:020d}.log`` and
holds the records whose offsets start at ``base_offset``. A record never spans segments, so the
segments of a healthy log are contiguous: ``base[i] + size[i] == base[i + 1]``.

Empty payloads are refused: a zero-filled block parses as a run of empty records with a valid CRC
(crc32(b"") == 0), so "length 0" is reserved to mean "no record here": the end of the log.

Preallocation. The tail segment is kept zero-filled (real zeros written, not fallocate's unwritten
extents) a few MiB past its last record, and records are written with pwrite inside that region.
fdatasync of an overwrite inside a file's size flushes only data pages; an append changes the file
size, which costs a journal commit (about 20x slower here). So the file size changes once per
`preallocate_bytes`, not once per group commit. The end of the records is the first zero length
header (or the end of the file); rolled segments are cut back to their exact size at the roll.

Durability contract: `append` only writes to the page cache; a record is durable once a later
`sync()` returned. `sync()` flushes segments in order (older rolled segments first), so if any
record is durable, every record before it is too. Recovery relies on that: everything after the
first torn or corrupt record was never acknowledged and is cut off (the file is truncated there, so
no stale bytes of an unacknowledged write can later line up with a new record boundary).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

HEADER = struct.Struct(">II")  # payload length, crc32(payload)
HEADER_BYTES = HEADER.size
MAX_PAYLOAD_BYTES = 256 << 20  # a header claiming more is garbage, not a record
SEGMENT_SUFFIX = ".log"
DEFAULT_PREALLOCATE_BYTES = 1 << 20  # one journal commit (and one ~1 MiB writeback) per MiB of records
_READ_CHUNK_BYTES = 1 << 20
_FIRST_READ_BYTES = 64 << 10  # a poll near the end reads little of the zeros past it; reads then grow
_ZEROS = bytes(1 << 20)

# Why a frame scan stopped.
STOP_LIMIT = "limit"  # reached the requested stop position
STOP_EOF = "eof"  # clean end of file on a record boundary
STOP_ZEROS = "zeros"  # a zero length header: the unwritten, zero-filled rest of a preallocated segment
STOP_PARTIAL = "partial"  # the file ends inside a record (being written, or torn by a crash)
STOP_CORRUPT = "corrupt"  # a header or checksum that cannot be a record (or a record still being written)
CLEAN_ENDS = (STOP_EOF, STOP_ZEROS)  # the segment's records end on a record boundary here


class LogCorruption(Exception):
    """The log holds bytes that are not the records it should hold (a checksum mismatch, a hole)."""


def segment_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}{SEGMENT_SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    """Base offsets of the segment files in `directory`, ascending (other files are ignored)."""
    bases: list[int] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return bases
    for name in names:
        stem, dot, suffix = name.partition(".")
        if dot and "." + suffix == SEGMENT_SUFFIX and len(stem) == 20 and stem.isdigit():
            bases.append(int(stem))
    bases.sort()
    return bases


class FrameScanner:
    """Reads the records of one segment file from a position, in large buffered chunks.

    `frames()` yields (position, payload view) for each valid record; the view is only valid until
    the next iteration. When the generator ends, `position` is just past the last record yielded
    and `stop_reason` says why it stopped.
    """

    def __init__(self, file: BinaryIO, position: int, stop_position: int | None = None) -> None:
        self.position = position
        self.stop_reason = STOP_EOF
        self._file = file
        self._stop_position = stop_position

    def frames(self) -> Iterator[tuple[int, memoryview]]:
        self._file.seek(self.position)
        buffer = b""
        view = memoryview(buffer)
        cursor = 0  # index in `buffer` of the byte at self.position
        chunk_bytes = _FIRST_READ_BYTES
        while self._stop_position is None or self.position < self._stop_position:
            available = len(buffer) - cursor
            needed = HEADER_BYTES
            if available >= HEADER_BYTES:
                length, checksum = HEADER.unpack_from(buffer, cursor)
                if length == 0:
                    self.stop_reason = STOP_ZEROS if checksum == 0 else STOP_CORRUPT
                    return
                if length > MAX_PAYLOAD_BYTES:
                    self.stop_reason = STOP_CORRUPT
                    return
                needed = HEADER_BYTES + length
                if available >= needed:
                    payload = view[cursor + HEADER_BYTES:cursor + needed]
                    if zlib.crc32(payload) != checksum:
                        self.stop_reason = STOP_CORRUPT
                        return
                    yield self.position, payload
                    self.position += needed
                    cursor += needed
                    continue
            # Not enough buffered for the next header or payload: read at least what is missing.
            chunk = self._file.read(max(chunk_bytes, needed - available))
            chunk_bytes = min(chunk_bytes * 2, _READ_CHUNK_BYTES)
            if not chunk:
                self.stop_reason = STOP_EOF if available == 0 else STOP_PARTIAL
                return
            buffer = buffer[cursor:] + chunk
            view = memoryview(buffer)
            cursor = 0
        self.stop_reason = STOP_LIMIT


def valid_prefix_length(path: Path) -> int:
    """Length of the longest prefix of a segment file made of whole, checksum-valid records (up to
    the first zero length header, the end of a preallocated segment's records)."""
    with open(path, "rb") as file:
        scanner = FrameScanner(file, 0)
        for _ in scanner.frames():
            pass
        return scanner.position


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentedLog:
    """The writer side. Not thread-safe: the caller serializes append/sync (GroupCommitter does).

    `preallocate_bytes` (0: off) is how far past its last record the tail segment is kept zero-filled."""

    def __init__(self, directory: Path, segment_bytes: int = 64 << 20,
                 preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES) -> None:
        if segment_bytes <= HEADER_BYTES:
            raise ValueError(f"segment_bytes must exceed the {HEADER_BYTES}-byte record header")
        if preallocate_bytes < 0:
            raise ValueError("preallocate_bytes must not be negative")
        self.directory = directory
        self._segment_bytes = segment_bytes
        self._preallocate_bytes = preallocate_bytes
        if not directory.is_dir():
            directory.mkdir(parents=True)
            _fsync_directory(directory.parent)  # else a crash could lose the whole new log
        self._directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:  # two writers would interleave records and break offsets: one writer per log
            fcntl.flock(self._directory_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._directory_fd)
            raise OSError(errno.EBUSY, f"the log in {directory} is already open for writing") from None
        self._rolled_unsynced: list[int] = []  # fds of rolled segments whose tail is not yet fsync'd
        self._directory_dirty = False  # a segment file was created since the directory was fsync'd
        self._broken: str | None = None
        self._closed = False
        try:
            base, size = self._recover()
            self._segment_fd = os.open(segment_path(directory, base), os.O_WRONLY | os.O_CREAT, 0o644)
        except BaseException:
            os.close(self._directory_fd)
            raise
        self._segment_base = base
        self._segment_size = size  # bytes of records in the tail segment
        self._allocated = size  # the tail segment's file size (recovery cut it to its records)
        if self._directory_dirty:
            self._sync_directory()

    @property
    def end_offset(self) -> int:
        """The offset the next record will get (one past the last byte written)."""
        return self._segment_base + self._segment_size

    def append(self, payloads: Sequence[bytes]) -> tuple[int, int]:
        """Write records to the page cache (no fsync). Returns (first_offset, end_offset).

        Records are contiguous, across segment rolls too (a new segment's base is the old one's
        end), so a record's successor starts at offset + 8 + len(payload)."""
        offsets = self.append_offsets(payloads)
        return (offsets[0] if offsets else self.end_offset), self.end_offset

    def append_offsets(self, payloads: Sequence[bytes]) -> list[int]:
        """Like `append`, returning the offset of every record.

        If the write fails, the current segment is cut back to its previous end so the in-memory
        offsets stay true, and the OSError propagates."""
        self._check_usable()
        for payload in payloads:
            if not 0 < len(payload) <= MAX_PAYLOAD_BYTES:
                raise ValueError(f"a record payload must be 1..{MAX_PAYLOAD_BYTES} bytes, got {len(payload)}")
        offsets: list[int] = []
        pending: list[bytes] = []
        pending_bytes = 0
        for payload in payloads:
            record_bytes = HEADER_BYTES + len(payload)
            used = self._segment_size + pending_bytes
            if used > 0 and used + record_bytes > self._segment_bytes:
                self._write(pending, pending_bytes)
                pending, pending_bytes = [], 0
                self._roll()
            offsets.append(self.end_offset + pending_bytes)
            pending.append(HEADER.pack(len(payload), zlib.crc32(payload)))
            pending.append(payload)
            pending_bytes += record_bytes
        self._write(pending, pending_bytes)
        return offsets

    def sync(self) -> None:
        """Make every appended record durable (fdatasync; fsync the directory after a roll)."""
        self._check_usable()
        while self._rolled_unsynced:
            fd = self._rolled_unsynced[0]
            os.fdatasync(fd)
            os.close(fd)
            self._rolled_unsynced.pop(0)
        os.fdatasync(self._segment_fd)
        if self._directory_dirty:
            self._sync_directory()

    def close(self) -> None:
        """Close the files. Does not sync: call sync() first for records to be durable."""
        if self._closed:
            return  # closing twice could close an fd number the process has since reused
        self._closed = True
        for fd in [*self._rolled_unsynced, self._segment_fd, self._directory_fd]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._rolled_unsynced = []
        self._broken = self._broken or "it was closed"

    def __enter__(self) -> SegmentedLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise OSError(f"the log in {self.directory} is unusable: {self._broken}")

    def _write(self, parts: list[bytes], total: int) -> None:
        if total == 0:
            return
        data = memoryview(b"".join(parts))
        fd, start = self._segment_fd, self._segment_size
        written = 0
        try:
            while written < total:
                written += os.pwrite(fd, data[written:], start + written)
        except OSError:
            # Cut a partial write back (with the preallocated zeros: they are written again later),
            # so the file holds nothing past where our offsets say the records end.
            try:
                os.ftruncate(fd, start)
                self._allocated = start
            except OSError as truncate_error:
                self._broken = f"a failed write could not be cut back: {truncate_error}"
            raise
        end = start + total
        self._segment_size = end
        if end > self._allocated:
            self._allocated = end
            self._preallocate()

    def _preallocate(self) -> None:
        """Zero-fill the tail segment past its records. The file grew anyway (the next fsync commits
        its new size), so growing it further now costs nothing more, and saves that journal commit
        on the fsyncs of the next few MiB of records."""
        if self._preallocate_bytes == 0:
            return
        start, chunk = self._allocated, self._preallocate_bytes
        target = max(start, min((start // chunk + 1) * chunk, self._segment_bytes))  # whole chunks
        position = start
        try:
            while position < target:
                position += os.pwrite(self._segment_fd, _ZEROS[:target - position], position)
        except OSError:  # e.g. a full disk: records still fit as they come, so only log less ahead
            position = self._segment_size
            try:
                os.ftruncate(self._segment_fd, position)
            except OSError as truncate_error:
                self._broken = f"a failed preallocation could not be cut back: {truncate_error}"
        self._allocated = position

    def _roll(self) -> None:
        new_base = self.end_offset
        if self._allocated > self._segment_size:
            # A rolled segment ends exactly at its last record, as readers and recovery expect. If
            # the cut fails, or a crash loses it, the zeros still read as the end of its records.
            try:
                os.ftruncate(self._segment_fd, self._segment_size)
            except OSError:
                pass
        new_fd = os.open(segment_path(self.directory, new_base), os.O_WRONLY | os.O_CREAT, 0o644)
        self._rolled_unsynced.append(self._segment_fd)
        self._segment_fd = new_fd
        self._segment_base = new_base
        self._segment_size = 0
        self._allocated = 0
        self._directory_dirty = True

    def _sync_directory(self) -> None:
        os.fsync(self._directory_fd)
        self._directory_dirty = False

    def _recover(self) -> tuple[int, int]:
        """Find where appends continue; cut off a torn or corrupt tail. Returns (base, size)."""
        bases = list_segments(self.directory)
        if not bases:
            self._directory_dirty = True  # the first segment is about to be created
            return 0, 0
        sizes = [os.stat(segment_path(self.directory, base)).st_size for base in bases]
        # Only the tail can be torn; a segment shorter than its successor's base says the tail
        # started there (a crash before the rolled segment was synced).
        suspect = len(bases) - 1
        for index in range(len(bases) - 1):
            expected = bases[index + 1] - bases[index]
            if sizes[index] > expected:
                # Preallocated zeros whose cut at the roll did not reach the disk, or an overlap.
                path = segment_path(self.directory, bases[index])
                valid = valid_prefix_length(path)
                if valid > expected:
                    raise LogCorruption(f"segment {bases[index]} in {self.directory} overlaps the next segment")
                if valid == expected:
                    self._truncate(path, expected)
                    continue
                suspect = index  # torn before its end: the tail started here
                break
            if sizes[index] < expected:
                suspect = index
                break
        base = bases[suspect]
        path = segment_path(self.directory, base)
        valid = valid_prefix_length(path)
        if valid < sizes[suspect]:  # preallocated zeros, or a torn tail: both go
            self._truncate(path, valid)
        for later_base in bases[suspect + 1:]:
            os.unlink(segment_path(self.directory, later_base))
            self._directory_dirty = True
        return base, valid

    @staticmethod
    def _truncate(path: Path, size: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)
