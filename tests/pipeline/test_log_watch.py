"""LogWatch (pipeline/batch_loop.py): an idle log is looked at with stat() alone, and no write is ever missed."""

from __future__ import annotations

import os
from pathlib import Path

from headrace.log.segments import SegmentedLog
from headrace.pipeline.batch_loop import LogWatch
from headrace.webhook.record import WebhookRecord, encode


def _age(paths: list[Path], seconds: float) -> None:
    """Set the mtimes back, as if the last write was `seconds` ago."""
    for path in paths:
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns - int(seconds * 1e9)))


def _files(directory: Path) -> list[Path]:
    return [directory, *sorted(directory.glob("*.log"))]


def test_a_missing_log_has_not_grown(tmp_path: Path) -> None:
    assert not LogWatch(tmp_path / "absent").may_have_grown()


def test_an_idle_log_is_skipped_and_a_write_is_seen(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    with SegmentedLog(directory, segment_bytes=4096) as log:
        log.append([encode(WebhookRecord(1, None, None, b"a"))])
        log.sync()
        watch = LogWatch(directory)
        assert watch.may_have_grown()  # the first look always scans
        assert watch.may_have_grown()  # written within RECENT_NS: scanned whatever the mtimes say
        _age(_files(directory), 5)
        assert watch.may_have_grown()  # the mtimes moved (back): a change
        assert not watch.may_have_grown()  # idle: stat() alone says so
        assert not watch.may_have_grown()
        log.append([encode(WebhookRecord(2, None, None, b"b"))])
        log.sync()
        assert watch.may_have_grown()


def test_a_new_segment_is_followed(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    with SegmentedLog(directory, segment_bytes=4096) as log:
        log.append([encode(WebhookRecord(1, None, None, b"x" * 100))])
        log.sync()
        watch = LogWatch(directory)
        _age(_files(directory), 5)
        assert watch.may_have_grown()
        assert not watch.may_have_grown()
        segments = len(list(directory.glob("*.log")))
        while len(list(directory.glob("*.log"))) == segments:  # until the log rolls to a new segment
            log.append([encode(WebhookRecord(2, None, None, b"y" * 1000))])
        log.sync()
        _age(_files(directory), 5)  # even with old mtimes, the directory's changed: the new tail is stat'ed
        assert watch.may_have_grown()
        assert not watch.may_have_grown()
        log.append([encode(WebhookRecord(3, None, None, b"z"))])
        log.sync()
        assert watch.may_have_grown()  # the write went to the new tail segment
