"""Crash-atomic multi-table COMMIT (coordinator/table_commits.py) against real segmented logs on disk: an intent left
by a crash at any point of the appends is completed at start, exactly once per table."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.coordinator import table_commits as commits
from headrace.log.reader import read_records, scan_end
from headrace.log.segments import SegmentedLog
from headrace.store.table_log import RowChange, decode_changes, encode_changes, record_transaction

TABLES = ["u1", "u2", "u3"]


def records(log_dir: Path) -> list[bytes]:
    if not log_dir.exists():
        return []
    return [payload for _, payload in read_records(log_dir, 0, scan_end(log_dir, 0))]


def append(log_dir: Path, payload: bytes) -> None:
    with SegmentedLog(log_dir) as log:
        log.append([payload])
        log.sync()


def end_of(log_dir: Path) -> int:
    with SegmentedLog(log_dir) as log:
        return log.end_offset


def test_record_codec_carries_the_transaction() -> None:
    change = RowChange("i", (1,), {"a": 1}, None)
    assert record_transaction(encode_changes([change])) is None
    tagged = encode_changes([change], "tx1")
    assert record_transaction(tagged) == "tx1"
    assert decode_changes(tagged) == [change]  # the pipeline's decoding ignores the id


def test_intent_round_trips() -> None:
    intent = commits.CommitIntent("tx", {"u1": (0, b'{"v":1}'), "u2": (48, b'{"v":1,"t":"tx"}')})
    assert commits.CommitIntent.decode(intent.encode()) == intent


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.integers(0, 3), appended=st.integers(0, 3), intent_removed=st.booleans(),
       redo_twice=st.booleans())
def test_a_crash_anywhere_in_the_appends_ends_with_the_transaction_in_every_table(
        tmp_path_factory: object, history: int, appended: int, intent_removed: bool, redo_twice: bool) -> None:
    root: Path = tmp_path_factory.mktemp("data")  # type: ignore[attr-defined]
    dirs = {table_id: root / "logs" / table_id for table_id in TABLES}
    for table_id, log_dir in dirs.items():  # earlier, unrelated records
        for n in range(history):
            append(log_dir, encode_changes([RowChange("i", (n,), {"k": n, "t": table_id}, None)]))
    transaction = commits.new_transaction_id()
    payloads = {t: encode_changes([RowChange("i", (99,), {"k": 99, "t": t}, None)], transaction) for t in TABLES}
    intent = commits.CommitIntent(transaction, {t: (end_of(dirs[t]), payloads[t]) for t in TABLES})
    path = commits.write_intent(commits.intents_directory(root), intent)
    for table_id in TABLES[:appended]:  # the crash came after `appended` of the appends
        append(dirs[table_id], payloads[table_id])
    if appended == len(TABLES) and intent_removed:
        commits.remove_intent(path)

    redone = commits.recover(commits.intents_directory(root), dirs.get)
    if redo_twice:
        assert commits.recover(commits.intents_directory(root), dirs.get) == []

    expected_redone = [] if appended == len(TABLES) else [(transaction, t) for t in TABLES[appended:]]
    assert sorted(redone) == sorted(expected_redone)
    assert not path.exists()
    for table_id, log_dir in dirs.items():
        found = records(log_dir)
        assert len(found) == history + 1
        assert found[-1] == payloads[table_id]


def test_a_dropped_table_is_skipped_and_a_torn_temporary_is_removed(tmp_path: Path) -> None:
    directory = commits.intents_directory(tmp_path)
    log_dir = tmp_path / "logs" / "u1"
    payload = encode_changes([RowChange("i", (1,), {"k": 1}, None)], "tx")
    commits.write_intent(directory, commits.CommitIntent("tx", {"u1": (0, payload), "gone": (0, payload)}))
    (directory / "other.tmp").write_bytes(b"{torn")  # an intent whose write never completed: not decided
    redone = commits.recover(directory, {"u1": log_dir}.get)
    assert redone == [("tx", "u1")]
    assert records(log_dir) == [payload]
    assert list(directory.iterdir()) == []
