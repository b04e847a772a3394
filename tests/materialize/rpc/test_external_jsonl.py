"""The example driver (examples/drivers/jsonl/driver.py, plain grpcio + protobuf) started as an ExternalDriver
subprocess and driven by a real Runtime with a RecoveryLog: control requests, transactions applied at the next
Acknowledge, a kill -9 of the driver process between StartedCommit and Acknowledged (and one after it applied but
before Acknowledged reached the runtime), restarts, and every document applied exactly once."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.errors import InvalidParameterValue
from headrace.materialize.protocol import (
    LOCATION_RECOMMENDED,
    LOCATION_REQUIRED,
    Binding,
    InvalidFieldSelection,
    MaterializationError,
    MaterializationSpec,
)
from headrace.materialize.recovery import RecoveryLog, is_replayed_batch
from headrace.materialize.rpc.external import DriverStartError, ExternalDriver, RemoteDriver, driver_for
from headrace.materialize.runtime import Runtime

from .. import recovery_worker
from ..kv_driver import KvStore

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "drivers" / "jsonl" / "driver.py"
KEYS = [f"k{i}" for i in range(5)]


def spec(directory: Path, name: str = "counts") -> MaterializationSpec:
    return MaterializationSpec(name, (
        Binding(("counts",), ("key",), ("count", "note"), {"key": "VARCHAR", "count": "BIGINT", "note": "JSON"}),
        Binding(("events",), ("id",), ("key", "count", "hr_timestamp", "hr_diff"),
                {"id": "VARCHAR", "key": "VARCHAR", "count": "BIGINT", "hr_timestamp": "BIGINT",
                 "hr_diff": "BIGINT"}, delta_updates=True),
    ), config={"directory": str(directory)})


def add_counts(older: dict[str, Any] | None, newer: dict[str, Any]) -> dict[str, Any]:
    return {**newer, "count": newer["count"] + (older["count"] if older else 0)}


def batch(batch_id: int) -> list[tuple[int, list[Any], dict[str, Any]]]:
    """Batch n adds n+1 to every key's count and appends one event per key (ids unique across batches)."""
    documents: list[tuple[int, list[Any], dict[str, Any]]] = []
    for key in KEYS:
        documents.append((0, [key], {"key": key, "count": batch_id + 1, "note": {"batch": batch_id, "big": 2**70}}))
        event = f"{batch_id}-{key}"
        documents.append((1, [event], {"id": event, "key": key, "count": batch_id + 1,
                                       "hr_timestamp": 1_700_000_000_000 + batch_id, "hr_diff": 1}))
    return documents


def counts_file(directory: Path) -> dict[str, dict[str, Any]]:
    path = directory / "counts.jsonl"
    if not path.exists():
        return {}
    return {doc["key"]: doc for doc in map(json.loads, path.read_text().splitlines())}


def events(directory: Path) -> list[str]:
    return sorted(json.loads(line)["id"] for part in (directory / "events").glob("*.jsonl")
                  for line in part.read_text().splitlines())


def expected_counts(batches: int) -> dict[str, int]:
    return {key: sum(b + 1 for b in range(batches)) for key in KEYS}


def expected_events(batches: int) -> list[str]:
    return sorted(f"{b}-{key}" for b in range(batches) for key in KEYS)


@pytest.fixture(scope="module")
def driver() -> Iterator[ExternalDriver]:
    process = ExternalDriver(f"{sys.executable} {EXAMPLE}", name="jsonl-driver")
    process.start()
    yield process
    process.stop()


def runtime(driver: ExternalDriver, directory: Path, log: Path) -> Runtime:
    return Runtime(driver.connection(), spec(directory), reducers=[add_counts, add_counts],
                   recovery_log=RecoveryLog(log))


def replay(driver: ExternalDriver, directory: Path, log: Path, batch_ids: range) -> list[int]:
    """What a sink runner does after a failure: reopen, skip the batches the log covers, run the others."""
    rt = runtime(driver, directory, log)
    checkpoint = rt.open()
    ran = []
    for batch_id in batch_ids:
        if not is_replayed_batch(checkpoint, "e", batch_id):
            rt.transact(batch(batch_id), {"epoch": "e", "batch_id": batch_id})
            ran.append(batch_id)
    rt.wait_acknowledged()  # the last transaction is applied too
    rt.close()
    return ran


def kill_9(driver: ExternalDriver) -> None:
    assert driver.pid is not None
    os.killpg(driver.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while driver.running() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not driver.running()


def test_spec_validate_apply(driver: ExternalDriver, tmp_path: Path) -> None:
    rt = runtime(driver, tmp_path, tmp_path / "log.json")
    assert rt.spec_of_driver().config_schema["required"] == ["directory"]
    constraints = rt.validate().bindings[0].constraints
    assert constraints["key"].type == LOCATION_REQUIRED and constraints["count"].type == LOCATION_RECOMMENDED
    assert rt.apply().action_description == "created counts; created events"
    rt.close()
    again = runtime(driver, tmp_path, tmp_path / "log.json")
    assert again.apply().action_description == "no changes"
    again.close()
    retyped = MaterializationSpec("counts", (Binding(("counts",), ("key",), ("count",),
                                                     {"key": "VARCHAR", "count": "DOUBLE"}),),
                                  config={"directory": str(tmp_path)})
    refused = Runtime(driver.connection(), retyped)
    with pytest.raises(InvalidFieldSelection,
                       match=r"'count' is selected but INCOMPATIBLE \(stored as BIGINT, not DOUBLE\)"):
        refused.validate()
    refused.close()


def test_a_commit_applies_at_the_next_acknowledge_exactly_once(driver: ExternalDriver, tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    rt = runtime(driver, tmp_path, log)
    rt.apply()
    assert rt.open() is None  # the driver holds no checkpoint: the recovery log does
    rt.transact(batch(0), {"epoch": "e", "batch_id": 0})
    assert counts_file(tmp_path) == {} and events(tmp_path) == []  # staged, not applied
    assert list(RecoveryLog(log).state.driver_state["pending"]) != []
    rt.transact(batch(1), {"epoch": "e", "batch_id": 1})  # its Acknowledge applies batch 0; Loads read it
    rt.wait_acknowledged()
    assert {key: doc["count"] for key, doc in counts_file(tmp_path).items()} == expected_counts(2)
    assert counts_file(tmp_path)["k0"]["note"] == {"batch": 1, "big": 2**70}  # big integers stay exact
    assert events(tmp_path) == expected_events(2)
    assert RecoveryLog(log).state.driver_state == {"pending": {}}
    assert RecoveryLog(log).state.runtime_checkpoint == {"epoch": "e", "batch_id": 1}
    rt.close()


def test_a_driver_killed_between_started_commit_and_acknowledged_applies_once(
        driver: ExternalDriver, tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    rt = runtime(driver, tmp_path, log)
    rt.apply()
    rt.open()
    rt.transact(batch(0), {"epoch": "e", "batch_id": 0})
    rt.transact(batch(1), {"epoch": "e", "batch_id": 1})  # StartedCommit received, log committed
    starts = driver.starts
    kill_9(driver)  # batch 1 is staged and in the log, not applied; nobody acknowledged it
    assert {key: doc["count"] for key, doc in counts_file(tmp_path).items()} == expected_counts(1)
    with pytest.raises((ConnectionError, MaterializationError)):
        rt.transact(batch(2), {"epoch": "e", "batch_id": 2})
    rt.close()
    # The runner reopens: connection() restarts the driver, Open hands it the log's pending batch 1.
    assert replay(driver, tmp_path, log, range(1, 4)) == [2, 3]
    assert driver.starts == starts + 1
    assert {key: doc["count"] for key, doc in counts_file(tmp_path).items()} == expected_counts(4)
    assert events(tmp_path) == expected_events(4)  # every delta row once: none lost, none doubled
    assert list((tmp_path / "_staged").iterdir()) == []


def test_a_driver_killed_after_applying_but_before_acknowledged_reapplies_idempotently(
        driver: ExternalDriver, tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    rt = runtime(driver, tmp_path, log)
    rt.apply()
    rt.open()
    rt.transact(batch(0), {"epoch": "e", "batch_id": 0})
    rt.acknowledge()  # the driver applies batch 0 ...
    deadline = time.monotonic() + 10
    while list((tmp_path / "_staged").iterdir()) and time.monotonic() < deadline:
        time.sleep(0.01)
    kill_9(driver)  # ... and dies before the runtime reads Acknowledged: the log still names batch 0 pending
    rt.close()
    assert RecoveryLog(log).state.driver_state["pending"] != {}
    assert replay(driver, tmp_path, log, range(0, 2)) == [1]  # Open re-applies batch 0: a no-op
    assert {key: doc["count"] for key, doc in counts_file(tmp_path).items()} == expected_counts(2)
    assert events(tmp_path) == expected_events(2)


def test_a_transaction_staged_but_never_committed_by_the_log_is_discarded(
        driver: ExternalDriver, tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    rt = runtime(driver, tmp_path, log)
    rt.apply()
    rt.open()
    rt.transact(batch(0), {"epoch": "e", "batch_id": 0})
    rt.close()
    RecoveryLog(log).rebuild()  # as if the runtime died after StartedCommit, before committing its log
    assert replay(driver, tmp_path, log, range(0, 2)) == [0, 1]
    assert {key: doc["count"] for key, doc in counts_file(tmp_path).items()} == expected_counts(2)
    assert events(tmp_path) == expected_events(2)


def test_the_address_form_connects_to_a_running_driver(driver: ExternalDriver, tmp_path: Path) -> None:
    driver.start()
    assert driver.address is not None
    remote = driver_for({"ADDRESS": driver.address})
    assert isinstance(remote, RemoteDriver)
    rt = Runtime(remote.connection(), spec(tmp_path), recovery_log=RecoveryLog(tmp_path / "log.json"))
    rt.open()
    rt.transact(batch(0), {"epoch": "e", "batch_id": 0})
    rt.wait_acknowledged()
    assert {key: doc["count"] for key, doc in counts_file(tmp_path).items()} == expected_counts(1)
    rt.close()
    remote.stop()  # not ours: the process keeps running
    assert driver.running()
    assert isinstance(driver_for({"command": "true"}), ExternalDriver)
    with pytest.raises(InvalidParameterValue, match="exactly one of COMMAND"):
        driver_for({"command": "x", "address": "h:1"})
    with pytest.raises(InvalidParameterValue, match="must be 'host:port'"):
        driver_for({"address": "nowhere"})


def test_a_command_that_exits_reports_its_stderr() -> None:
    failing = ExternalDriver("echo 'cannot read config: no such file' >&2; exit 3", start_timeout=10)
    with pytest.raises(DriverStartError, match=r"(?s)exited with status 3 .*cannot read config: no such file"):
        failing.connection()
    assert not failing.running()


def test_a_command_that_never_listens_times_out_and_is_stopped() -> None:
    silent = ExternalDriver("echo starting >&2; exec sleep 60", start_timeout=0.5, stop_timeout=1)
    with pytest.raises(DriverStartError, match=r"(?s)did not listen on 127\.0\.0\.1:\d+ within 0\.5 s.*starting"):
        silent.start()
    assert not silent.running()


def test_stop_terminates_the_whole_process_group(tmp_path: Path) -> None:
    marker = tmp_path / "children"
    # A shell that does not exec its command, whose child ignores nothing: both must go.
    process = ExternalDriver(f"sleep 60 & echo $! > {marker}; {sys.executable} {EXAMPLE}", stop_timeout=5)
    process.start()
    child = int(marker.read_text())
    process.stop()
    assert not process.running()
    assert not alive(child)


def alive(pid: int) -> bool:
    """Running, not a zombie (this container's init may be slow to reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_headrace_transactor_runs_as_an_external_driver(tmp_path: Path) -> None:
    """run_grpc_driver serves a Python Transactor on $HEADRACE_DRIVER_ADDRESS; SIGTERM stops it cleanly."""
    process = ExternalDriver(f"{sys.executable} -m tests.materialize.rpc.kv_process {tmp_path / 'kv'}",
                             cwd=str(Path(__file__).resolve().parents[3]), name="kv-driver")
    try:
        rt = Runtime(process.connection(), recovery_worker.SPEC, reducers=[recovery_worker.add_counts],
                     recovery_log=RecoveryLog(tmp_path / "log.json"))
        assert rt.open() is None
        for batch_id in range(3):
            rt.transact(recovery_worker.batch(batch_id), {"epoch": "e", "batch_id": batch_id})
        rt.wait_acknowledged()
        assert {key: doc["count"] for key, doc in KvStore(tmp_path / "kv").read().items()} == expected_counts(3)
        rt.close()
        started = time.monotonic()
        process.stop()
        assert time.monotonic() - started < 4  # it stopped on SIGTERM, not on SIGKILL after stop_timeout
    finally:
        process.stop()
