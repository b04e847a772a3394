"""A kill -9 during Spark's first offsets write leaves `offsets/.0.<uuid>.tmp`; the pipeline removes such torn
writes (and nothing else) before it starts the query again."""

from __future__ import annotations

from pathlib import Path

from headrace.pipeline.process import remove_torn_checkpoint_writes


def test_torn_temporary_writes_are_removed_and_complete_entries_kept(tmp_path: Path) -> None:
    offsets, commits = tmp_path / "offsets", tmp_path / "commits"
    offsets.mkdir()
    commits.mkdir()
    torn = [offsets / ".0.9e3d867a-83ee-4549-b5b8-1e3586d4ec7b.tmp", commits / ".3.abc.tmp"]
    kept = [offsets / "0", offsets / ".0.crc", commits / "2", tmp_path / "metadata", tmp_path / "headrace-epoch"]
    for path in torn + kept:
        path.write_bytes(b"")
    removed = remove_torn_checkpoint_writes(tmp_path)
    assert sorted(removed) == sorted(torn)
    assert all(not path.exists() for path in torn)
    assert all(path.exists() for path in kept)


def test_a_new_checkpoint_directory_is_left_alone(tmp_path: Path) -> None:
    assert remove_torn_checkpoint_writes(tmp_path) == []
