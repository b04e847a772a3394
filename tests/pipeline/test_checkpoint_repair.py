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


def _spark_checkpoint(directory: Path, committed: list[int]) -> None:
    (directory / "offsets").mkdir(parents=True)
    (directory / "commits").mkdir()
    (directory / "headrace-epoch").write_text("e1")
    for batch_id in committed:
        (directory / "offsets" / str(batch_id)).write_text("")
        (directory / "commits" / str(batch_id)).write_text("")
    (directory / "commits" / ".1.crc").write_text("")


def test_a_spark_checkpoint_ahead_of_the_store_is_emptied(tmp_path: Path) -> None:
    """Pipelined commits: Spark recorded batch 2, the store's commit of it never happened (crash or error)."""
    from headrace.pipeline.batches import discard_checkpoint_ahead_of_store, spark_committed_batch

    _spark_checkpoint(tmp_path, [0, 1, 2])
    assert spark_committed_batch(tmp_path) == 2
    assert discard_checkpoint_ahead_of_store(tmp_path, "e1", {"epoch": "e1", "batch_id": 1, "log_end": 80})
    assert list(tmp_path.iterdir()) == []  # the pipeline then takes a new epoch and resumes from log_end 80


def test_a_spark_checkpoint_the_store_covers_is_kept(tmp_path: Path) -> None:
    from headrace.pipeline.batches import discard_checkpoint_ahead_of_store

    _spark_checkpoint(tmp_path, [0, 1, 2])
    assert not discard_checkpoint_ahead_of_store(tmp_path, "e1", {"epoch": "e1", "batch_id": 2, "log_end": 90})
    assert not discard_checkpoint_ahead_of_store(tmp_path, "e1", {"epoch": "e1", "batch_id": 3, "log_end": 90})
    assert (tmp_path / "commits" / "2").exists()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert not discard_checkpoint_ahead_of_store(fresh, "e2", {})  # nothing recorded yet


def test_a_spark_checkpoint_of_another_epoch_or_an_empty_store_is_emptied(tmp_path: Path) -> None:
    from headrace.pipeline.batches import discard_checkpoint_ahead_of_store

    _spark_checkpoint(tmp_path / "a", [0])
    assert discard_checkpoint_ahead_of_store(tmp_path / "a", "e1", {"epoch": "e0", "batch_id": 7, "log_end": 50})
    _spark_checkpoint(tmp_path / "b", [0])
    assert discard_checkpoint_ahead_of_store(tmp_path / "b", "e1", {})  # the store holds nothing of it
