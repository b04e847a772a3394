"""The PARQUET sink driver: real files read back by pyarrow and DuckDB, a real Runtime over the real connection
loop, and a runtime process killed with SIGKILL between StartedCommit and Acknowledged."""

from __future__ import annotations

import dataclasses
import datetime
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from headrace.materialize.columnar import ColumnarDocuments, ColumnarStores
from headrace.materialize.drivers.parquet import ParquetConnector, ParquetTransactor
from headrace.materialize.protocol import (
    INCOMPATIBLE, Binding, DriverError, FencedOff, InvalidFieldSelection, MaterializationSpec, Open, Opened,
    StoreColumns)
from headrace.materialize.recovery import RecoveryLog, is_replayed_batch

from ..recovery_worker import KEYS, batch, runtime_for
from .conftest import HostedDriver, hosted_driver

WORKER = Path(__file__).parents[1] / "recovery_worker.py"
TYPES = {"id": "BIGINT", "name": "VARCHAR", "amount": "DECIMAL(18,2)", "big": "HUGEINT", "ratio": "DOUBLE",
         "small": "FLOAT", "n": "INTEGER", "ok": "BOOLEAN", "body": "JSON", "at": "TIMESTAMPTZ",
         "local": "TIMESTAMP", "day": "DATE", "raw": "BLOB", "uid": "UUID"}
FULL_DOC = {"id": 7, "name": "é:x", "amount": "-12.50", "big": 2**100, "ratio": 0.1, "small": 0.25, "n": -3,
            "ok": True, "body": {"x": [1, 2.5, None, "s"]}, "at": 1_700_000_000_123_456, "local": -1,
            "day": "2024-02-29", "raw": "AAEC/w==", "uid": "0b9e7c5e-1b1a-4f3e-9d6b-3c2f1e0d9a8b"}
# The same row as pyarrow and DuckDB read it.
UTC = datetime.timezone.utc
FULL_ROW = {"id": 7, "name": "é:x", "amount": Decimal("-12.50"), "big": Decimal(2**100), "ratio": 0.1, "small": 0.25,
            "n": -3, "ok": True, "body": '{"x":[1,2.5,null,"s"]}',
            "at": datetime.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC),
            "local": datetime.datetime(1969, 12, 31, 23, 59, 59, 999999), "day": datetime.date(2024, 2, 29),
            "raw": b"\x00\x01\x02\xff", "uid": "0b9e7c5e-1b1a-4f3e-9d6b-3c2f1e0d9a8b"}


def typed_binding(path: tuple[str, ...] = ("typed",)) -> Binding:
    return Binding(path, ("id",), tuple(c for c in TYPES if c != "id"), dict(TYPES))


def totals_binding(path: tuple[str, ...] = ("totals",)) -> Binding:
    return Binding(path, ("region", "shop"), ("total",), {"region": "VARCHAR", "shop": "BIGINT", "total": "BIGINT"})


def spec(root: Path, *bindings: Binding, name: str = "sink_p", **config: Any) -> MaterializationSpec:
    return MaterializationSpec(name, bindings, config={"path": str(root), **config})


@pytest.fixture(scope="module")
def driver() -> Iterator[HostedDriver]:
    with hosted_driver(lambda _open: ParquetTransactor(), ParquetConnector()) as host:
        yield host


def read_pyarrow(directory: Path, key: str = "id") -> list[dict[str, Any]]:
    return sorted(pads.dataset(directory).to_table().to_pylist(), key=lambda row: row[key])


def read_duckdb(directory: Path, key: str = "id") -> list[dict[str, Any]]:
    with duckdb.connect() as connection:
        connection.execute("SET TimeZone = 'UTC'")
        cursor = connection.execute(f"SELECT * FROM read_parquet('{directory}/*.parquet') ORDER BY {key}")
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "_manifest.json").read_text())


class Recorder:
    """A lastWriteWins reducer that records what the driver Loaded."""

    def __init__(self) -> None:
        self.loaded: list[dict[str, Any]] = []

    def __call__(self, older: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
        self.loaded.append(older)
        return newer


def test_every_type_round_trips_through_pyarrow_duckdb_and_load(driver: HostedDriver, tmp_path: Path) -> None:
    the_spec = spec(tmp_path, typed_binding())
    recorder = Recorder()
    runtime = driver.runtime(the_spec, reducers=[recorder], recovery_log=RecoveryLog(tmp_path / "log.json"))
    runtime.validate()
    assert runtime.apply().action_description == f"created dataset {tmp_path / 'typed'}"
    assert runtime.apply().action_description == "no changes"
    assert runtime.open() is None
    nulls = {**dict.fromkeys(TYPES), "id": 8}
    runtime.transact([(0, [7], FULL_DOC), (0, [8], nulls)], {"batch": 1})
    runtime.wait_acknowledged()
    expected = [FULL_ROW, {**dict.fromkeys(TYPES), "id": 8}]
    directory = tmp_path / "typed"
    assert read_pyarrow(directory) == expected
    duck = read_duckdb(directory)
    assert duck[1] == expected[1] and {**duck[0], "body": json.loads(duck[0]["body"])} == {
        **FULL_ROW, "body": FULL_DOC["body"], "at": FULL_ROW["at"]}
    assert pads.dataset(directory).schema.field("at").type == pa.timestamp("us", tz="UTC")
    runtime.transact([(0, [7], {**FULL_DOC, "n": 4}), (0, [8], nulls)], {"batch": 2})
    assert sorted(recorder.loaded, key=lambda d: d["id"]) == [FULL_DOC, nulls]  # Load gives back what was stored
    runtime.close()


def test_updates_and_deletes_rewrite_only_the_buckets_they_touch(driver: HostedDriver, tmp_path: Path) -> None:
    the_spec = spec(tmp_path, totals_binding(), buckets=8)
    runtime = driver.runtime(the_spec, recovery_log=RecoveryLog(tmp_path / "log.json"))
    runtime.open()
    expected = {("eu", shop): shop for shop in range(200)}
    runtime.transact([(0, ["eu", s], {"region": "eu", "shop": s, "total": t}) for (_, s), t in expected.items()],
                     {"batch": 1})
    runtime.wait_acknowledged()
    directory = tmp_path / "totals"
    assert sorted(p.name for p in directory.glob("part-*.parquet")) == sorted(f"part-{b}.parquet" for b in range(8))
    before = {p.name: p.stat().st_ino for p in directory.glob("part-*.parquet")}
    changes = [(0, ["eu", 5], {"region": "eu", "shop": 5, "total": 500}), (0, ["eu", 6], {"_meta": {"op": "d"}}),
               (0, ["us", 1], {"region": "us", "shop": 1, "total": 1})]
    runtime.transact(changes, {"batch": 2})
    runtime.wait_acknowledged()
    expected[("eu", 5)] = 500
    del expected[("eu", 6)]
    expected[("us", 1)] = 1
    rows = pads.dataset(directory).to_table().to_pylist()
    assert {(r["region"], r["shop"]): r["total"] for r in rows} == expected and len(rows) == len(expected)
    after = {p.name: p.stat().st_ino for p in directory.glob("part-*.parquet")}
    rewritten = {name for name in before if before[name] != after[name]}
    assert 1 <= len(rewritten) <= 3  # copy-on-write: the buckets of the three keys, nothing else
    assert read_duckdb(directory, "region, shop") == sorted(rows, key=lambda r: (r["region"], r["shop"]))
    runtime.transact([(0, ["eu", 6], {"_meta": {"op": "d"}})], {"batch": 3})  # never stored: nothing to do
    runtime.wait_acknowledged()
    assert {p.name: p.stat().st_ino for p in directory.glob("part-*.parquet")} == after
    runtime.close()
    assert len(manifest(directory)["applied"]) == 2 and not any((directory / "_staging").iterdir())


def test_columnar_stores_and_loads(driver: HostedDriver, tmp_path: Path) -> None:
    """StoreColumns with DuckDB's Arrow types, then a columnar Load whose rows go back as they are."""
    rows = pa.table({
        "id": pa.array([7], pa.int64()), "name": pa.array(["é:x"], pa.large_string()),
        "amount": pa.array([Decimal("-12.5")], pa.decimal128(18, 2)),
        "big": pa.array([Decimal(2**100)], pa.decimal128(38, 0)), "ratio": [0.1], "small": pa.array([0.25], pa.float32()),
        "n": pa.array([-3], pa.int32()), "ok": [True], "body": ['{"x":[1,2.5,null,"s"]}'],
        "at": pa.array([1_700_000_000_123_456], pa.int64()), "local": pa.array([-1], pa.int64()).cast(pa.timestamp("us")),
        "day": pa.array([datetime.date(2024, 2, 29)], pa.date32()), "raw": pa.array([b"\x00\x01\x02\xff"]),
        "uid": [FULL_DOC["uid"]]})
    runtime = driver.runtime(spec(tmp_path, typed_binding()), recovery_log=RecoveryLog(tmp_path / "log.json"))
    runtime.open()
    runtime.transact([], {"batch": 1}, [StoreColumns(0, rows=rows)])
    runtime.wait_acknowledged()
    assert read_pyarrow(tmp_path / "typed") == [FULL_ROW]
    seen: list[pa.Table | None] = []

    def reduce(partials: pa.Table, loaded: pa.Table | None) -> ColumnarStores:
        seen.append(loaded)
        return ColumnarStores(updated=loaded.set_column(loaded.schema.get_field_index("n"), "n",
                                                        pa.array([4], pa.int32())) if loaded else None)

    runtime.transact([], {"batch": 2}, columnar=[ColumnarDocuments(0, pa.table({"id": [7, 9]}), reduce)])
    runtime.wait_acknowledged()
    loaded = seen[0]
    assert loaded is not None and loaded.num_rows == 1
    assert loaded["at"].to_pylist() == [1_700_000_000_123_456]  # TIMESTAMPTZ as int64 microseconds
    assert read_pyarrow(tmp_path / "typed") == [{**FULL_ROW, "n": 4}]
    runtime.transact([], {"batch": 3}, [StoreColumns(0, deleted=pa.table({"id": [7, 99]}))])
    runtime.wait_acknowledged()
    runtime.close()
    assert read_pyarrow(tmp_path / "typed") == []


def test_delta_updates_append_files(driver: HostedDriver, tmp_path: Path) -> None:
    columns = {"id": "BIGINT", "total": "DECIMAL(10,2)", "hr_timestamp": "BIGINT", "hr_diff": "BIGINT"}
    binding = Binding(("changes",), ("id", "hr_timestamp", "hr_diff"), ("total",), columns, delta_updates=True)
    runtime = driver.runtime(spec(tmp_path, binding), recovery_log=RecoveryLog(tmp_path / "log.json"))
    runtime.validate()
    runtime.apply()
    directory = tmp_path / "changes"
    assert read_duckdb(directory, "hr_timestamp") == []  # an empty dataset, with its schema, is readable already
    runtime.open()
    for timestamp in (100, 200):
        runtime.transact([(0, [1, timestamp, d], {"id": 1, "total": f"{timestamp + d}", "hr_timestamp": timestamp,
                                                  "hr_diff": d}) for d in (-1, 1)], {"batch": timestamp})
    runtime.wait_acknowledged()
    runtime.close()
    files = sorted(p.name for p in directory.glob("part-*.parquet"))
    assert len(files) == 3 and files[-1] == "part-init.parquet"
    assert all(name.endswith("-0.parquet") for name in files[:2])
    rows = read_duckdb(directory, "hr_timestamp, hr_diff")
    assert [(r["hr_timestamp"], r["hr_diff"], r["total"]) for r in rows] == [
        (100, -1, Decimal("99.00")), (100, 1, Decimal("101.00")), (200, -1, Decimal("199.00")),
        (200, 1, Decimal("201.00"))]
    assert len(read_pyarrow(directory, "hr_timestamp")) == 4


# ---------------------------------------------------------------------------------------------- recovery


class Configured(ParquetTransactor):
    """recovery_worker.py's spec carries no endpoint config: the driver side supplies its path."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def open(self, open: Open) -> Opened:
        configured = dataclasses.replace(open.spec, config={"path": str(self.root), "buckets": 2})
        return super().open(dataclasses.replace(open, spec=configured))


@pytest.fixture
def worker_driver(tmp_path: Path) -> Iterator[HostedDriver]:
    with hosted_driver(lambda _open: Configured(tmp_path / "out")) as host:
        yield host


def counts(directory: Path) -> dict[str, int]:
    rows = pads.dataset(directory).to_table().to_pylist()
    assert len(rows) == len({r["key"] for r in rows})
    return {r["key"]: r["count"] for r in rows}


def expected_counts(batches: int) -> dict[str, int]:
    return {key: sum(b + 1 for b in range(batches)) for key in KEYS}


def replay(host: HostedDriver, log: Path, epoch: str, batch_ids: range) -> list[int]:
    """What the sink runner does after a restart: open, skip the batches the log covers, run the others."""
    runtime = runtime_for(host.host, host.port, log)
    checkpoint = runtime.open()
    ran = []
    for batch_id in batch_ids:
        if not is_replayed_batch(checkpoint, epoch, batch_id):
            runtime.transact(batch(batch_id), {"epoch": epoch, "batch_id": batch_id})
            ran.append(batch_id)
    runtime.wait_acknowledged()
    runtime.close()
    return ran


def test_a_kill_9_between_started_commit_and_acknowledged_applies_once(worker_driver: HostedDriver,
                                                                      tmp_path: Path) -> None:
    log = tmp_path / "recovery.json"
    directory = tmp_path / "out" / "counts"
    worker = subprocess.Popen([sys.executable, str(WORKER), worker_driver.host, str(worker_driver.port), str(log),
                               "e1", "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "committed 0"
        assert worker.stdout.readline().strip() == "committed 1"
        worker.send_signal(signal.SIGKILL)  # after StartedCommit of batch 1, before its Acknowledge
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    recovered = RecoveryLog(log).state
    assert recovered.runtime_checkpoint == {"epoch": "e1", "batch_id": 1}
    (pending,) = recovered.driver_state["pending"]  # batch 1: committed to the log, staged, not applied
    assert counts(directory) == expected_counts(1)
    assert (directory / "_staging" / pending).is_dir() and len(manifest(directory)["applied"]) == 1
    assert replay(worker_driver, log, "e1", range(1, 3)) == [2]
    assert counts(directory) == expected_counts(3)
    applied = manifest(directory)["applied"]
    assert len(applied) == 3 and applied.count(pending) == 1
    assert not any((directory / "_staging").iterdir())
    assert RecoveryLog(log).state.driver_state == {"pending": {}}


def test_a_lost_acknowledged_reapplies_nothing_twice(worker_driver: HostedDriver, tmp_path: Path) -> None:
    log = tmp_path / "recovery.json"
    directory = tmp_path / "out" / "counts"
    runtime = runtime_for(worker_driver.host, worker_driver.port, log)
    runtime.open()
    runtime.transact(batch(0), {"epoch": "e", "batch_id": 0})
    runtime.acknowledge()  # the driver applies; the runtime dies before it reads Acknowledged
    for _ in range(1000):
        if manifest(directory)["applied"]:
            break
        import time
        time.sleep(0.01)
    runtime.close()
    (pending,) = RecoveryLog(log).state.driver_state["pending"]  # the log still names the applied transaction
    assert manifest(directory)["applied"] == [pending]
    assert replay(worker_driver, log, "e", range(0, 2)) == [1]
    assert counts(directory) == expected_counts(2)
    assert manifest(directory)["applied"].count(pending) == 1


def test_staged_files_of_a_transaction_the_log_never_committed_are_discarded(worker_driver: HostedDriver,
                                                                            tmp_path: Path) -> None:
    log = tmp_path / "recovery.json"
    directory = tmp_path / "out" / "counts"
    assert replay(worker_driver, log, "e", range(0, 1)) == [0]
    # A runtime whose log never records its transaction (as if it died right after StartedCommit, before the log
    # commit): its files are staged, and the driver state naming them is lost with it.
    lost = runtime_for(worker_driver.host, worker_driver.port, tmp_path / "lost.json")
    lost.open()
    lost.transact(batch(5), {"epoch": "e", "batch_id": 1})
    (staged,) = lost.driver_state["pending"]
    lost.close()
    assert (directory / "_staging" / staged).is_dir()
    assert replay(worker_driver, log, "e", range(0, 2)) == [1]
    assert not (directory / "_staging" / staged).exists()
    assert counts(directory) == expected_counts(2)  # batch 5's counts never appeared
    assert staged not in manifest(directory)["applied"]


def test_a_zombie_runtime_is_fenced_off(driver: HostedDriver, tmp_path: Path) -> None:
    the_spec = spec(tmp_path, totals_binding())
    zombie = driver.runtime(the_spec, recovery_log=RecoveryLog(tmp_path / "zombie.json"))
    zombie.open()
    zombie.transact([(0, ["eu", 1], {"region": "eu", "shop": 1, "total": 1})], {"batch": 1})
    newer = driver.runtime(the_spec, recovery_log=RecoveryLog(tmp_path / "newer.json"))
    newer.open()
    with pytest.raises(FencedOff, match="fenced off"):
        zombie.wait_acknowledged()  # its apply is refused: a newer runtime opened the dataset
    zombie.close()
    newer.transact([(0, ["eu", 2], {"region": "eu", "shop": 2, "total": 2})], {"batch": 1})
    newer.wait_acknowledged()
    newer.close()
    assert {r["shop"] for r in pads.dataset(tmp_path / "totals").to_table().to_pylist()} == {2}


def test_apply_migrates_and_refuses_what_it_cannot(driver: HostedDriver, tmp_path: Path) -> None:
    narrow = Binding(("t",), ("id",), ("a",), {"id": "BIGINT", "a": "VARCHAR"})
    runtime = driver.runtime(spec(tmp_path, narrow), recovery_log=RecoveryLog(tmp_path / "log.json"))
    runtime.apply()
    runtime.open()
    runtime.transact([(0, [1], {"id": 1, "a": "x"})], {"batch": 1})
    runtime.wait_acknowledged()
    runtime.close()
    wide = Binding(("t",), ("id",), ("a", "b"), {"id": "BIGINT", "a": "VARCHAR", "b": "DOUBLE"})
    runtime = driver.runtime(spec(tmp_path, wide), recovery_log=RecoveryLog(tmp_path / "log.json"))
    runtime.validate()
    assert runtime.apply(spec(tmp_path, narrow)).action_description == \
        f"added column b (DOUBLE) to dataset {tmp_path / 't'}"
    runtime.close()
    assert read_duckdb(tmp_path / "t") == [{"id": 1, "a": "x", "b": None}]  # every file has the new column
    retyped = Binding(("t",), ("id",), ("a",), {"id": "BIGINT", "a": "BIGINT"})
    runtime = driver.runtime(spec(tmp_path, retyped))
    with pytest.raises(InvalidFieldSelection, match="INCOMPATIBLE .the dataset's column has type VARCHAR"):
        runtime.validate()
    runtime.close()
    with pytest.raises(DriverError, match="belongs to materialization sink_p"):
        driver.runtime(spec(tmp_path, narrow, name="other")).apply()
    with pytest.raises(DriverError, match="it has 16 buckets, not 4"):
        driver.runtime(spec(tmp_path, narrow, buckets=4)).apply()
    with pytest.raises(DriverError, match="leading '.' or '_'"):
        driver.runtime(spec(tmp_path, Binding(("_hidden",), ("id",), (), {"id": "BIGINT"}))).apply()
    runtime = driver.runtime(spec(tmp_path, Binding(("u",), ("id",), ("iv",), {"id": "BIGINT", "iv": "INTERVAL"})))
    with pytest.raises(InvalidFieldSelection, match=f"{INCOMPATIBLE}.*cannot be written to Parquet"):
        runtime.validate()
    runtime.close()


def test_a_transaction_staged_before_a_migration_is_applied_in_the_new_schema(driver: HostedDriver,
                                                                              tmp_path: Path) -> None:
    narrow = Binding(("t",), ("id",), ("a",), {"id": "BIGINT", "a": "VARCHAR"})
    wide = Binding(("t",), ("id",), ("a", "b"), {"id": "BIGINT", "a": "VARCHAR", "b": "DOUBLE"})
    log = tmp_path / "log.json"
    runtime = driver.runtime(spec(tmp_path, narrow), recovery_log=RecoveryLog(log))
    runtime.open()
    runtime.transact([(0, [1], {"id": 1, "a": "x"})], {"batch": 1})
    runtime.close()  # committed to the log, staged, never acknowledged
    migrating = driver.runtime(spec(tmp_path, wide))
    migrating.apply(spec(tmp_path, narrow))
    migrating.close()
    runtime = driver.runtime(spec(tmp_path, wide), recovery_log=RecoveryLog(log))
    runtime.open()
    runtime.transact([(0, [2], {"id": 2, "a": "y", "b": 2.5})], {"batch": 2})
    runtime.wait_acknowledged()
    runtime.close()
    assert read_duckdb(tmp_path / "t") == [{"id": 1, "a": "x", "b": None}, {"id": 2, "a": "y", "b": 2.5}]
    assert {pads.dataset(p).schema.names == ["id", "a", "b"] for p in (tmp_path / "t").glob("part-*")} == {True}


def test_composite_keys_of_many_types(driver: HostedDriver, tmp_path: Path) -> None:
    types = {"s": "VARCHAR", "at": "TIMESTAMPTZ", "amount": "DECIMAL(10,3)", "flag": "BOOLEAN", "raw": "BLOB",
             "day": "DATE", "v": "BIGINT"}
    binding = Binding(("composite",), ("s", "at", "amount", "flag", "raw", "day"), ("v",), types)
    recorder = Recorder()
    runtime = driver.runtime(spec(tmp_path, binding, buckets=3), reducers=[recorder],
                             recovery_log=RecoveryLog(tmp_path / "log.json"))
    runtime.open()

    def key(i: int) -> list[Any]:
        return [f"s{i % 3}", 1_000_000 * (i % 2), f"{i % 4}.5", i % 2 == 0, "AAE=" if i % 5 else "", "2024-01-0" + str(
            1 + i % 7)]

    def document(i: int, v: int) -> dict[str, Any]:
        return {**dict(zip(binding.key, key(i))), "v": v}

    runtime.transact([(0, key(i), document(i, i)) for i in range(40)], {"batch": 1})
    runtime.wait_acknowledged()
    distinct = {json.dumps(key(i)): i for i in range(40)}  # later documents of a key replaced earlier ones
    runtime.transact([(0, key(i), document(i, -1)) for i in distinct.values() if i % 2]
                     + [(0, key(i), {"_meta": {"op": "d"}}) for i in distinct.values() if not i % 2],
                     {"batch": 2})
    runtime.wait_acknowledged()
    runtime.close()
    # Every key was loaded (to update or delete it), DECIMAL text at the column's scale.
    assert sorted(recorder.loaded, key=lambda d: d["v"]) == [
        {**document(i, i), "amount": f"{i % 4}.500"} for i in sorted(distinct.values())]
    rows = pads.dataset(tmp_path / "composite").to_table().to_pylist()
    assert len(rows) == len([i for i in distinct.values() if i % 2]) and {r["v"] for r in rows} == {-1}
