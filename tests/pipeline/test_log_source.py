"""pipeline/log_source.py on a real log: capped batches, and partitions cut at record boundaries (a small batch stays
one partition: each is a Spark task with a fixed cost), which together read every record once, in log order."""

from __future__ import annotations

from pathlib import Path

from headrace.log.segments import SegmentedLog
from headrace.pipeline.log_source import MIN_RECORDS_PER_PARTITION, LogRange, LogStreamReader
from headrace.webhook.record import WebhookRecord, encode


def _log(directory: Path, records: int) -> None:
    log = SegmentedLog(directory)
    log.append([encode(WebhookRecord(1_700_000_000_000_000, None, None, b'{"n":%d}' % n)) for n in range(records)])
    log.sync()
    log.close()


def _read_all(reader: LogStreamReader, ranges: list[LogRange]) -> list[int]:
    return [offset for r in ranges for batch in reader.read(r) for offset in batch.column("log_offset").to_pylist()]


def test_small_batches_are_one_partition_and_large_ones_split(tmp_path: Path) -> None:
    _log(tmp_path, 3 * MIN_RECORDS_PER_PARTITION)
    small = LogStreamReader(str(tmp_path), 0, max_records=MIN_RECORDS_PER_PARTITION // 2, partitions=2)
    end = small.latestOffset()
    assert len(small.partitions({"offset": 0}, end)) == 1
    large = LogStreamReader(str(tmp_path), 0, max_records=3 * MIN_RECORDS_PER_PARTITION, partitions=2)
    end = large.latestOffset()
    ranges = large.partitions({"offset": 0}, end)
    assert len(ranges) == 2 and ranges[0].end == ranges[1].start
    offsets = _read_all(large, list(ranges))  # type: ignore[arg-type]
    assert len(offsets) == 3 * MIN_RECORDS_PER_PARTITION and offsets == sorted(set(offsets))


def test_a_one_partition_batch_is_handed_over_by_the_driver_side_reader(tmp_path: Path) -> None:
    """getCache: Spark's runner sends these rows with the partition, so no Python worker task reads them."""
    _log(tmp_path, 3 * MIN_RECORDS_PER_PARTITION)
    small = LogStreamReader(str(tmp_path), 0, max_records=100)
    end = small.latestOffset()
    batches = small.getCache({"offset": 0}, end)
    assert batches is not None
    assert [o for b in batches for o in b.column("log_offset").to_pylist()] == \
        _read_all(small, list(small.partitions({"offset": 0}, end)))  # type: ignore[arg-type]
    assert small.getCache(end, end) is None
    large = LogStreamReader(str(tmp_path), 0, max_records=3 * MIN_RECORDS_PER_PARTITION, partitions=2)
    assert large.getCache({"offset": 0}, large.latestOffset()) is None  # read in parallel by Spark's tasks
