"""The recovery log: RFC 7396 merge patches, atomic commits, and the idempotent-apply pattern end to end
(a real driver server running KvTransactor, a real runtime process killed with SIGKILL)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import InternalError
from headrace.materialize.recovery import (
    RecoveryLog,
    apply_merge_patch,
    create_merge_patch,
    is_replayed_batch,
)

from .conftest import DriverServer
from .kv_driver import KvStore, KvTransactor
from .recovery_worker import KEYS, batch, runtime_for

WORKER = Path(__file__).with_name("recovery_worker.py")

# ---------------------------------------------------------------------------------------------- merge patch

# RFC 7396 Appendix A, every example.
RFC_EXAMPLES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize("target, patch, result", RFC_EXAMPLES)
def test_rfc_7396_examples(target: Any, patch: Any, result: Any) -> None:
    snapshot = json.dumps(target)
    assert apply_merge_patch(target, patch) == result
    assert json.dumps(target) == snapshot  # the target is not mutated


scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=3)
json_values = st.recursive(scalars, lambda children: st.lists(children, max_size=3)
                           | st.dictionaries(st.text(max_size=2), children, max_size=3), max_leaves=12)
null_free_values = st.recursive(scalars.filter(lambda v: v is not None), lambda children: st.lists(
    children, max_size=3) | st.dictionaries(st.text(max_size=2), children, max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(json_values, json_values)
def test_applying_a_patch_twice_changes_nothing_more(target: Any, patch: Any) -> None:
    once = apply_merge_patch(target, patch)
    assert apply_merge_patch(once, patch) == once


@settings(max_examples=300, deadline=None)
@given(json_values, null_free_values)
def test_a_created_patch_turns_source_into_target(source: Any, target: Any) -> None:
    patch = create_merge_patch(source, target)
    assert json.dumps(apply_merge_patch(source, patch), sort_keys=True) == json.dumps(target, sort_keys=True)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=2), json_values, max_size=4), st.dictionaries(st.text(max_size=2),
                                                                                      json_values, max_size=4))
def test_patches_touch_only_their_members(target: dict[str, Any], patch: dict[str, Any]) -> None:
    result = apply_merge_patch(target, patch)
    for name, value in target.items():
        if name not in patch:
            assert result[name] == value
    for name, value in patch.items():
        assert (name not in result) if value is None else name in result


def test_create_merge_patch_tells_one_from_true() -> None:
    assert create_merge_patch({"a": 1, "b": 2}, {"a": True, "b": 2}) == {"a": True}
    assert create_merge_patch({"a": {"x": 1, "y": 2}}, {"a": {"x": 1}}) == {"a": {"y": None}}


# ---------------------------------------------------------------------------------------------- the log file


def test_the_log_commits_checkpoint_and_state_together(tmp_path: Path) -> None:
    path = tmp_path / "log" / "m.json"
    log = RecoveryLog(path)
    assert log.state.runtime_checkpoint is None and log.state.driver_state == {}
    log.commit({"epoch": "e", "batch_id": 3}, {"pending": {"t": "f"}})
    log.update_driver_state({})
    reopened = RecoveryLog(path)
    assert reopened.state.runtime_checkpoint == {"epoch": "e", "batch_id": 3}
    assert reopened.state.driver_state == {} and reopened.state.commits == 1
    path.with_name("m.json.tmp").write_text("{torn")  # a write that never reached its rename is ignored
    assert RecoveryLog(path).state.runtime_checkpoint == {"epoch": "e", "batch_id": 3}
    reopened.rebuild()
    assert RecoveryLog(path).state.runtime_checkpoint is None
    path.write_text("not json")
    with pytest.raises(InternalError, match="recovery log .* is unreadable"):
        RecoveryLog(path)


def test_replayed_spark_batches_are_recognised() -> None:
    checkpoint = {"epoch": "e1", "batch_id": 7, "log_end": 100}
    assert is_replayed_batch(checkpoint, "e1", 7) and is_replayed_batch(checkpoint, "e1", 2)
    assert not is_replayed_batch(checkpoint, "e1", 8)
    assert not is_replayed_batch(checkpoint, "e2", 7)  # a new Spark checkpoint numbers batches afresh
    assert not is_replayed_batch(None, "e1", 0) and not is_replayed_batch({}, "e1", 0)


# ---------------------------------------------------------------------------------------------- end to end


@pytest.fixture
def kv_server(driver_server: DriverServer, tmp_path: Path) -> Iterator[tuple[DriverServer, KvStore]]:
    kv = KvStore(tmp_path / "kv")
    driver_server.make_transactor = lambda _store: KvTransactor(kv)
    yield driver_server, kv


def replay(server: DriverServer, log: Path, epoch: str, batch_ids: range) -> list[int]:
    """What the pipeline does after a restart: open, skip the batches the log covers, run the others."""
    runtime = runtime_for(server.host, server.port, log)
    checkpoint = runtime.open()
    ran = []
    for batch_id in batch_ids:
        if is_replayed_batch(checkpoint, epoch, batch_id):
            continue
        runtime.transact(batch(batch_id), {"epoch": epoch, "batch_id": batch_id})
        ran.append(batch_id)
    runtime.wait_acknowledged()  # the last transaction is applied too
    runtime.close()
    return ran


def expected_counts(batches: int) -> dict[str, dict[str, Any]]:
    return {key: {"key": key, "count": sum(b + 1 for b in range(batches))} for key in KEYS}


def test_a_commit_applies_on_the_next_acknowledge(kv_server: tuple[DriverServer, KvStore], tmp_path: Path) -> None:
    server, kv = kv_server
    log = tmp_path / "recovery.json"
    runtime = runtime_for(server.host, server.port, log)
    assert runtime.open() is None
    runtime.transact(batch(0), {"epoch": "e", "batch_id": 0})
    assert kv.read() == {}  # staged, not applied: the runtime has not acknowledged yet
    assert list(RecoveryLog(log).state.driver_state["pending"]) != []
    runtime.wait_acknowledged()
    assert kv.read() == expected_counts(1)
    assert RecoveryLog(log).state.driver_state == {"pending": {}}  # Acknowledged's patch, recorded
    runtime.close()


def test_a_crash_between_started_commit_and_acknowledged_applies_once(
        kv_server: tuple[DriverServer, KvStore], tmp_path: Path) -> None:
    server, kv = kv_server
    log = tmp_path / "recovery.json"
    worker = subprocess.Popen([sys.executable, str(WORKER), server.host, str(server.port), str(log), "e1", "2"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "committed 0"
        assert worker.stdout.readline().strip() == "committed 1"
        worker.send_signal(signal.SIGKILL)  # after StartedCommit of batch 1, before its Acknowledge
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert kv.read() == expected_counts(1)  # batch 1 is staged, committed to the log, not applied
    assert RecoveryLog(log).state.runtime_checkpoint == {"epoch": "e1", "batch_id": 1}
    # Spark replays batch 1 (offsets written, commit lost with the process) and goes on with batch 2.
    assert replay(server, log, "e1", range(1, 3)) == [2]
    assert kv.read() == expected_counts(3)


def test_a_lost_acknowledged_reapplies_idempotently(kv_server: tuple[DriverServer, KvStore], tmp_path: Path) -> None:
    server, kv = kv_server
    log = tmp_path / "recovery.json"
    runtime = runtime_for(server.host, server.port, log)
    runtime.open()
    runtime.transact(batch(0), {"epoch": "e", "batch_id": 0})
    runtime.acknowledge()  # the driver applies; the runtime dies before it reads Acknowledged
    deadline = time.monotonic() + 10
    while kv.applies < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    runtime.close()
    assert kv.read() == expected_counts(1)
    assert RecoveryLog(log).state.driver_state["pending"] != {}  # the log still names the staged file
    assert replay(server, log, "e", range(0, 2)) == [1]  # the next runtime re-applies it: harmless
    assert kv.read() == expected_counts(2)


def test_an_explicit_zero_checkpoint_resets_the_log(tmp_path: Path, driver_server: DriverServer) -> None:
    class Rebuilding(KvTransactor):
        def open(self, open: Any) -> Any:
            from headrace.materialize.protocol import Opened
            super().open(open)
            return Opened(runtime_checkpoint={})

    kv = KvStore(tmp_path / "kv")
    driver_server.make_transactor = lambda _store: Rebuilding(kv)
    log = tmp_path / "recovery.json"
    RecoveryLog(log).commit({"epoch": "e", "batch_id": 9}, {"pending": {}})
    runtime = runtime_for(driver_server.host, driver_server.port, log)
    assert runtime.open() == {}
    assert RecoveryLog(log).state.runtime_checkpoint is None
    runtime.close()
