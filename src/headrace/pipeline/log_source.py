"""A Spark streaming data source over one source's durable log (Python Data Source API).

Offsets are the log's byte offsets. The driver-side reader finds the end of the complete records
(`latestOffset`); executors read their offset range straight from the log files (`read`), so the
server process shares nothing with Spark but the files."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from headrace.log.reader import read_records, scan_end
from headrace.webhook.record import decode_fields

RECORD_FRAME_BYTES = 8  # u32 length + u32 crc32 before each payload
# prev_offset: the log offset of the row this one replaces (same idempotency key within the window).
# headers: a JSON object as text; body: the row's raw bytes.
SCHEMA = ("log_offset long, next_offset long, prev_offset long, received_at long, idempotency_key string, "
          "headers string, body binary")


class LogRange(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end


class LogStreamReader(DataSourceStreamReader):
    def __init__(self, path: str, start_offset: int) -> None:
        self.path = path
        self.start_offset = start_offset
        self._known_end = start_offset

    def initialOffset(self) -> dict[str, int]:
        return {"offset": self.start_offset}

    def latestOffset(self) -> dict[str, int]:
        directory = Path(self.path)
        if directory.exists():
            self._known_end = max(self._known_end, scan_end(directory, self._known_end))
        return {"offset": self._known_end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        if end["offset"] <= start["offset"]:
            return []
        return [LogRange(start["offset"], end["offset"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, LogRange)
        for offset, payload in read_records(Path(self.path), partition.start, partition.end):
            received_at_us, key, headers, body, prev_offset = decode_fields(payload)
            yield (offset, offset + RECORD_FRAME_BYTES + len(payload), prev_offset, received_at_us, key, headers, body)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release yet: log retention comes with the idempotency window."""


class HeadraceLogSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "headrace_log"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return LogStreamReader(self.options["path"], int(self.options.get("startOffset", "0")))
