"""A Spark streaming data source over one source's durable log (Python Data Source API).

Offsets are the log's byte offsets. The driver-side reader finds the end of the complete records
(`latestOffset`); executors read their offset range (`read`). Both go through a LogAccess (log/access.py): the log
files themselves in local mode (the same host), else the headrace server's log read service over the network
(log/read_service.py; options `service`, `token`, `log`), so Spark shares nothing with the server but the network.

Bounded micro-batches: `latestOffset` offers at most `maxRecordsPerBatch` records past the end it offered
last, so a backlog is eaten in bounded batches (freshness of what arrives meanwhile, bounded memory) instead
of one huge batch. Spark 4.1's Python sources have no admission control (it comes in 4.2), so the reader
counts from the end it offered last; after a restart Spark resumes from its checkpoint, which the pipeline
passes as `resumeOffset` (the log end its last committed batch reached) so the first cap counts from there.

A large batch is split at record boundaries into up to `partitions` offset ranges of at least
MIN_RECORDS_PER_PARTITION records (the boundaries were seen while scanning), read in parallel by Spark tasks in
Python workers; `toArrow` returns partitions in order, so rows stay in log order. A batch of one partition (every
batch of a source that keeps up) is read instead by the driver-side reader itself, which hands the rows to the JVM
with the partition (`getCache`, the path Spark has for its simple readers): the batch's task then reads them from
Spark's block manager and no Python worker task is launched. Measured at 5k events/s on local[2]: the micro-batch's
Spark job 0.3-0.45 s -> 0.1-0.15 s, freshness p50 ~0.9 s -> ~0.5 s. Both yield Arrow record batches: one
Python->JVM conversion per few thousand records instead of per row."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.datasource_internal import _SimpleStreamReaderWrapper

from headrace.log.access import BOUNDARY_EVERY, FileLogAccess, LogAccess
from headrace.log.access import scan_capped as access_scan_capped
from headrace.log.read_client import log_access_from_options
from headrace.webhook.record import decode_fields

RECORD_FRAME_BYTES = 8  # u32 length + u32 crc32 before each payload
# prev_offset: the log offset of the row this one replaces (same idempotency key within the window).
# headers: a JSON object as text; body: the row's raw bytes.
SCHEMA = ("log_offset long, next_offset long, prev_offset long, received_at long, idempotency_key string, "
          "headers string, body binary")
ARROW_SCHEMA = pa.schema([("log_offset", pa.int64()), ("next_offset", pa.int64()), ("prev_offset", pa.int64()),
                          ("received_at", pa.int64()), ("idempotency_key", pa.string()), ("headers", pa.string()),
                          ("body", pa.binary())])
DEFAULT_MAX_RECORDS_PER_BATCH = 100_000
DEFAULT_PARTITIONS = 2  # local[2]: both cores decode the batch
# A partition is a Spark task running `read` in a Python worker: ~0.1 CPU-s of fixed cost each on a loaded local[2]
# (measured: 6,000 records cost 0.67-0.73 CPU-s in one partition, 0.76-0.86 in two), so small batches stay whole.
MIN_RECORDS_PER_PARTITION = 16_384
ARROW_BATCH_ROWS = 8_192


class LogRange(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end


def scan_capped(directory: Path, start: int, max_records: int,
                boundary_every: int = BOUNDARY_EVERY) -> tuple[int, list[int]]:
    """log/access.scan_capped (kept here for its callers)."""
    return access_scan_capped(directory, start, max_records, boundary_every)


def arrow_batches(log: Path | LogAccess, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """The records in [start, end) as Arrow record batches of ARROW_SCHEMA, in log order."""
    access = FileLogAccess(log) if isinstance(log, Path) else log

    def rows() -> Iterator[tuple[Any, ...]]:
        for offset, payload in access.records(start, end):
            received_at_us, key, header_text, body, prev_offset = decode_fields(payload)
            yield offset, offset + RECORD_FRAME_BYTES + len(payload), prev_offset, received_at_us, key, header_text, body

    return record_batches(rows(), ARROW_SCHEMA)


def record_batches(rows: Iterator[tuple[Any, ...]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Rows as Arrow record batches of up to ARROW_BATCH_ROWS rows (transposed per chunk by zip: 4x faster than
    appending each value to its column)."""
    while chunk := list(islice(rows, ARROW_BATCH_ROWS)):
        yield pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(zip(*chunk), schema.types)], schema=schema)


class DriverSideReads(_SimpleStreamReaderWrapper):
    """A stream reader that may read a batch itself, in the driver-side Python process, and hand Spark its rows.

    Spark's Python streaming runner sends a batch's rows with its (single) partition to the JVM, which keeps them in
    its block manager so the batch's one task reads them from there, only for readers of this class (its wrapper of
    simple readers). Subclasses override every method of the wrapper, which is only what the runner recognises
    (pyspark is pinned: pyproject.toml). `getCache(start, end)` returns the rows, or None to have Spark's tasks
    `read` the partitions."""

    def getCache(self, start: dict[str, int], end: dict[str, int]) -> Iterator[pa.RecordBatch] | None:  # type: ignore[override]
        raise NotImplementedError


class LogStreamReader(DriverSideReads):
    def __init__(self, log: str | LogAccess, start_offset: int, resume_offset: int | None = None,
                 max_records: int = DEFAULT_MAX_RECORDS_PER_BATCH, partitions: int = DEFAULT_PARTITIONS) -> None:
        self.log: LogAccess = FileLogAccess(Path(log)) if isinstance(log, str) else log
        self.start_offset = start_offset
        self.max_records = max_records
        self.partition_count = max(1, partitions)
        # The end offered last: the next batch starts there (see module docstring).
        self._offered = max(start_offset, resume_offset or 0)
        self._boundaries: list[int] = []  # record boundaries seen past the last committed offset

    def initialOffset(self) -> dict[str, int]:
        return {"offset": self.start_offset}

    def latestOffset(self) -> dict[str, int]:
        if self.max_records > 0:
            end, boundaries = self.log.scan_capped(self._offered, self.max_records)
            if end > self._offered:
                self._boundaries = [b for b in self._boundaries if b <= self._offered] + boundaries
            self._offered = max(self._offered, end)
        else:
            self._offered = max(self._offered, self.log.scan_end(self._offered))
        return {"offset": self._offered}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        first, last = start["offset"], end["offset"]
        if last <= first:
            return []
        inside = [b for b in self._boundaries if first < b < last]
        at_least = (len(inside) + 1) * BOUNDARY_EVERY  # records in the range, about (a boundary every 2,048)
        count = max(1, min(self.partition_count, at_least // MIN_RECORDS_PER_PARTITION))
        cuts = []
        for i in range(1, count):  # the known boundary nearest each even split point
            if inside:
                cut = inside[min(len(inside) - 1, len(inside) * i // count)]
                if cut not in cuts:
                    cuts.append(cut)
        edges = [first, *sorted(cuts), last]
        return [LogRange(a, b) for a, b in zip(edges, edges[1:])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogRange)
        return arrow_batches(self.log, partition.start, partition.end)

    def getCache(self, start: dict[str, int], end: dict[str, int]) -> Iterator[pa.RecordBatch] | None:  # type: ignore[override]
        """A one-partition batch, read here in the driver-side Python process (see module docstring); None for a
        larger one, which Spark's tasks read in parallel (`read`)."""
        first, last = start["offset"], end["offset"]
        if last <= first or len(self.partitions(start, end)) != 1:
            return None
        return iter(list(arrow_batches(self.log, first, last)))

    def commit(self, end: dict[str, int]) -> None:
        """Boundaries before the committed end are no longer needed (log retention comes with the window)."""
        self._boundaries = [b for b in self._boundaries if b > end["offset"]]
        self._offered = max(self._offered, end["offset"])


class LogRangesReader(DataSourceReader):
    """A batch read of given offset ranges (option `ranges`: "start:end,start:end"), one Spark task each: how the
    batch loop (pipeline/batch_loop.py) has executors read a large batch in parallel, through the same LogAccess."""

    def __init__(self, log: LogAccess, ranges: str) -> None:
        self.log = log
        self.ranges = parse_ranges(ranges)

    def partitions(self) -> Sequence[InputPartition]:
        return [LogRange(start, end) for start, end in self.ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogRange)
        return arrow_batches(self.log, partition.start, partition.end)


def format_ranges(ranges: Sequence[LogRange]) -> str:
    return ",".join(f"{part.start}:{part.end}" for part in ranges)


def parse_ranges(text: str) -> list[tuple[int, int]]:
    pairs = [item.split(":") for item in text.split(",") if item]
    return [(int(start), int(end)) for start, end in pairs]


class HeadraceLogSource(DataSource):
    """Options: path (the log's directory, local mode) or service + token + log (the log read service's address,
    its token and the log's id); for a batch read, ranges (LogRangesReader); for a stream, startOffset (a fresh checkpoint starts here), resumeOffset (where the last
    committed batch ended; caps count from here after a restart), maxRecordsPerBatch (0: unbounded), partitions."""

    @classmethod
    def name(cls) -> str:
        return "headrace_log"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return LogRangesReader(log_access_from_options(self.options), self.options.get("ranges", ""))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        options = self.options
        resume = options.get("resumeOffset")
        return LogStreamReader(log_access_from_options(options), int(options.get("startOffset", "0")),
                               int(resume) if resume is not None else None,
                               int(options.get("maxRecordsPerBatch", str(DEFAULT_MAX_RECORDS_PER_BATCH))),
                               int(options.get("partitions", str(DEFAULT_PARTITIONS))))
