"""The REDIS sink driver against a real redis-server, driven by a real Runtime over the real connection loop."""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import redis

from headrace.materialize.drivers.redis import RedisConnector, RedisTransactor
from headrace.materialize.protocol import (
    INCOMPATIBLE, Binding, DriverError, FencedOff, MaterializationSpec, StoreColumns, ValidateBinding)
from headrace.materialize.recovery import RecoveryLog
from headrace.materialize.runtime import Runtime

from ...real_servers.redis import RedisServer, redis_db, redis_server  # noqa: F401  (fixtures)
from .conftest import HostedDriver, hosted_driver

TYPES = {"id": "BIGINT", "name": "VARCHAR", "amount": "DECIMAL(18,2)", "big": "HUGEINT", "ratio": "DOUBLE",
         "small": "FLOAT", "n": "INTEGER", "ok": "BOOLEAN", "body": "JSON", "at": "TIMESTAMPTZ",
         "local": "TIMESTAMP", "day": "DATE", "raw": "BLOB", "uid": "UUID"}
FULL_DOC = {"id": 7, "name": "a:b\\c é", "amount": "-12.50", "big": 2**100, "ratio": 0.1, "small": 0.25,
            "n": -3, "ok": True, "body": {"x": [1, 2.5, None, "s"], "y": {"z": False}},
            "at": 1_700_000_000_123_456, "local": -1, "day": "2024-02-29", "raw": "AAEC/w==",
            "uid": "0b9e7c5e-1b1a-4f3e-9d6b-3c2f1e0d9a8b"}
STORED_FIELDS = {b"id": b"7", b"name": "a:b\\c é".encode(), b"amount": b"-12.50", b"big": str(2**100).encode(),
                 b"ratio": b"0.1", b"small": b"0.25", b"n": b"-3", b"ok": b"true",
                 b"body": b'{"x":[1,2.5,null,"s"],"y":{"z":false}}', b"at": b"1700000000123456", b"local": b"-1",
                 b"day": b"2024-02-29", b"raw": b"\x00\x01\x02\xff", b"uid": b"0b9e7c5e-1b1a-4f3e-9d6b-3c2f1e0d9a8b"}


def spec(url: str, bindings: tuple[Binding, ...], name: str = "sink_r", **config: Any) -> MaterializationSpec:
    return MaterializationSpec(name, bindings, config={"url": url, **config})


def typed_binding(prefix: str = "t:") -> Binding:
    return Binding((prefix,), ("id",), tuple(c for c in TYPES if c != "id"), dict(TYPES))


def totals_binding(prefix: str = "tot:") -> Binding:
    return Binding((prefix,), ("region", "shop"), ("total",), {"region": "VARCHAR", "shop": "BIGINT", "total": "BIGINT"})


@pytest.fixture(scope="module")
def driver() -> Iterator[HostedDriver]:
    with hosted_driver(lambda _open: RedisTransactor(), RedisConnector()) as host:
        yield host


@pytest.fixture
def client(redis_server: RedisServer, redis_db: int) -> Iterator[redis.Redis]:  # noqa: F811
    connection = redis.Redis(host=redis_server.host, port=redis_server.port, db=redis_db)
    yield connection
    connection.close()


def url_of(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs['db']}"


def hashes(client: redis.Redis, pattern: bytes = b"*") -> dict[bytes, dict[bytes, bytes]]:
    return {key: client.hgetall(key) for key in client.scan_iter(match=pattern) if client.type(key) == b"hash"}


class Recorder:
    """A lastWriteWins reducer that records what the driver Loaded (the stored document before the new one)."""

    def __init__(self) -> None:
        self.loaded: list[dict[str, Any]] = []

    def __call__(self, older: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
        self.loaded.append(older)
        return newer


def test_every_type_round_trips_through_hash_fields_and_load(driver: HostedDriver, client: redis.Redis) -> None:
    the_spec = spec(url_of(client), (typed_binding(),))
    recorder = Recorder()
    runtime = driver.runtime(the_spec, reducers=[recorder])
    runtime.validate()
    assert runtime.apply().action_description == "no changes"
    assert runtime.open() is None
    nulls = {**dict.fromkeys(TYPES), "id": 8}
    runtime.transact([(0, [7], FULL_DOC), (0, [8], nulls)], {"batch": 1})
    assert client.hgetall(b"t:7") == STORED_FIELDS
    assert client.hgetall(b"t:8") == {b"id": b"8"}  # NULL fields are absent
    runtime.transact([(0, [7], {**FULL_DOC, "n": 4}), (0, [8], nulls)], {"batch": 2})
    assert sorted(recorder.loaded, key=lambda d: d["id"]) == [FULL_DOC, nulls]  # Load gives back what was stored
    assert client.hget(b"t:7", b"n") == b"4"
    runtime.close()


def test_keys_are_escaped_so_distinct_keys_never_collide(driver: HostedDriver, client: redis.Redis) -> None:
    binding = Binding(("k|",), ("a", "b"), ("v",), {"a": "VARCHAR", "b": "VARCHAR", "v": "BIGINT"})
    runtime = driver.runtime(spec(url_of(client), (binding,)))
    runtime.open()
    keys = [["a:b", "c"], ["a", "b:c"], ["a\\", ":c"], ["a\\:", "c"], ["", ""]]
    runtime.transact([(0, key, {"a": key[0], "b": key[1], "v": i}) for i, key in enumerate(keys)], {"batch": 1})
    runtime.close()
    assert sorted(hashes(client)) == sorted([b"k|a\\:b:c", b"k|a:b\\:c", b"k|a\\\\:\\:c", b"k|a\\\\\\::c", b"k|:"])
    assert {h[b"v"] for h in hashes(client).values()} == {b"0", b"1", b"2", b"3", b"4"}


def test_updates_replace_the_whole_hash_and_deletes_remove_it(driver: HostedDriver, client: redis.Redis) -> None:
    runtime = driver.runtime(spec(url_of(client), (typed_binding(),)))
    runtime.open()
    runtime.transact([(0, [1], {"id": 1, "name": "x", "n": 1}), (0, [2], {"id": 2, "name": "y"})], {"batch": 1})
    runtime.transact([(0, [1], {"id": 1, "ok": False}), (0, [2], {"_meta": {"op": "d"}})], {"batch": 2})
    runtime.close()
    assert hashes(client) == {b"t:1": {b"id": b"1", b"ok": b"false"}}  # name and n are gone, not merged


def test_delta_updates_append_to_a_stream(driver: HostedDriver, client: redis.Redis) -> None:
    columns = {"id": "BIGINT", "total": "DECIMAL(10,2)", "hr_timestamp": "BIGINT", "hr_diff": "BIGINT"}
    binding = Binding(("changes",), ("id", "hr_timestamp", "hr_diff"), ("total",), columns, delta_updates=True)
    runtime = driver.runtime(spec(url_of(client), (binding,), key_prefix="orders:changes"))
    runtime.validate()
    runtime.open()
    docs = [{"id": 1, "total": "5.00", "hr_timestamp": 100, "hr_diff": 1},
            {"id": 1, "total": "5.00", "hr_timestamp": 200, "hr_diff": -1},
            {"id": 1, "total": "7.5", "hr_timestamp": 200, "hr_diff": 1}]
    runtime.transact([(0, [d["id"], d["hr_timestamp"], d["hr_diff"]], d) for d in docs], {"batch": 1})
    runtime.close()
    entries = [fields for _, fields in client.xrange(b"orders:changes")]
    assert entries == [{b"id": b"1", b"hr_timestamp": b"100", b"hr_diff": b"1", b"total": b"5.00"},
                       {b"id": b"1", b"hr_timestamp": b"200", b"hr_diff": b"-1", b"total": b"5.00"},
                       {b"id": b"1", b"hr_timestamp": b"200", b"hr_diff": b"1", b"total": b"7.50"}]


def test_columnar_stores_write_the_same_text_forms(driver: HostedDriver, client: redis.Redis) -> None:
    """StoreColumns with DuckDB's own Arrow types (timestamp, decimal128, date32, binary) as well as int64 micros."""
    rows = pa.table({
        "id": pa.array([7], pa.int64()), "name": pa.array([FULL_DOC["name"]], pa.large_string()),
        "amount": pa.array([Decimal("-12.5")], pa.decimal128(18, 2)), "big": pa.array([Decimal(2**100)],
                                                                                       pa.decimal128(38, 0)),
        "ratio": [0.1], "small": pa.array([0.25], pa.float32()), "n": pa.array([-3], pa.int32()), "ok": [True],
        "body": ['{"x": [1, 2.5, null, "s"], "y": {"z": false}}'],
        "at": pa.array([1_700_000_000_123_456], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "local": pa.array([-1], pa.int64()), "day": pa.array([datetime.date(2024, 2, 29)], pa.date32()),
        "raw": pa.array([b"\x00\x01\x02\xff"], pa.binary()), "uid": [FULL_DOC["uid"]]})
    runtime = driver.runtime(spec(url_of(client), (typed_binding(),)))
    runtime.open()
    runtime.transact([], {"batch": 1}, [StoreColumns(0, rows=rows)])
    assert client.hgetall(b"t:7") == STORED_FIELDS
    runtime.transact([], {"batch": 2}, [StoreColumns(0, deleted=pa.table({"id": [7, 99]}))])
    runtime.close()
    assert hashes(client) == {}


class CrashingLog(RecoveryLog):
    """A real recovery log that "crashes" (raises) instead of committing one batch: the process died after the
    driver wrote and answered StartedCommit, before the runtime's log recorded the transaction."""

    def __init__(self, path: Path, crash_at: int) -> None:
        super().__init__(path)
        self.crash_at = crash_at

    def commit(self, runtime_checkpoint: dict[str, Any], driver_state: dict[str, Any]) -> None:
        if runtime_checkpoint["batch"] == self.crash_at:
            raise OSError("simulated crash before the recovery log commit")
        super().commit(runtime_checkpoint, driver_state)


def upstream_batch(batch: int) -> list[tuple[int, list[Any], dict[str, Any]]]:
    """Batch `batch` of an upstream view of running totals: full values (the upstream reduced them), a key
    deleted in batch 2 and re-created in batch 4."""
    docs: list[tuple[int, list[Any], dict[str, Any]]] = []
    for shop in range(6):
        if shop == 3 and batch == 2:
            docs.append((0, ["eu", shop], {"_meta": {"op": "d"}}))
        elif shop % 2 == batch % 2 or batch == 4:
            docs.append((0, ["eu", shop], {"region": "eu", "shop": shop, "total": 10 * batch + shop}))
    return docs


def run_batches(runtime: Runtime, batches: range, skip_through: int = -1) -> None:
    for batch in batches:
        if batch > skip_through:
            runtime.transact(upstream_batch(batch), {"batch": batch})


def test_a_replay_after_a_crash_converges_to_the_same_hashes(driver: HostedDriver, client: redis.Redis,
                                                             redis_server: RedisServer, tmp_path: Path) -> None:  # noqa: F811
    reference = redis.Redis(host=redis_server.host, port=redis_server.port, db=redis_server.fresh_db())
    clean = driver.runtime(spec(url_of(reference), (totals_binding(),)))
    clean.open()
    run_batches(clean, range(6))
    clean.close()
    expected = hashes(reference)
    reference.close()
    assert len(expected) == 6

    log = tmp_path / "recovery.json"
    the_spec = spec(url_of(client), (totals_binding(),))
    crashing = driver.runtime(the_spec, recovery_log=CrashingLog(log, crash_at=3))
    crashing.open()
    with pytest.raises(OSError, match="simulated crash"):
        run_batches(crashing, range(6))
    crashing.close()
    assert RecoveryLog(log).state.runtime_checkpoint == {"batch": 2}
    assert hashes(client) != expected  # batch 3 landed, batches 4 and 5 did not
    replay = driver.runtime(the_spec, recovery_log=RecoveryLog(log))
    checkpoint = replay.open()
    assert checkpoint == {"batch": 2}
    run_batches(replay, range(6), skip_through=checkpoint["batch"])  # batch 3 is written again
    replay.close()
    assert hashes(client) == expected


def test_a_replayed_stream_entry_may_appear_twice(driver: HostedDriver, client: redis.Redis, tmp_path: Path) -> None:
    columns = {"id": "BIGINT", "hr_timestamp": "BIGINT", "hr_diff": "BIGINT"}
    binding = Binding(("s",), ("id", "hr_timestamp"), ("hr_diff",), columns, delta_updates=True)
    the_spec = spec(url_of(client), (binding,))
    log = tmp_path / "recovery.json"

    def batch(n: int) -> list[tuple[int, list[Any], dict[str, Any]]]:
        return [(0, [1, n], {"id": 1, "hr_timestamp": n, "hr_diff": 1})]

    crashing = driver.runtime(the_spec, recovery_log=CrashingLog(log, crash_at=2))
    crashing.open()
    crashing.transact(batch(1), {"batch": 1})
    with pytest.raises(OSError):
        crashing.transact(batch(2), {"batch": 2})
    crashing.close()
    replay = driver.runtime(the_spec, recovery_log=RecoveryLog(log))
    assert replay.open() == {"batch": 1}
    replay.transact(batch(2), {"batch": 2})
    replay.close()
    timestamps = [fields[b"hr_timestamp"] for _, fields in client.xrange(b"s")]
    assert timestamps == [b"1", b"2", b"2"]  # at-least-once: dedupe on (key, hr_timestamp)


def test_a_zombie_runtime_is_fenced_off(driver: HostedDriver, client: redis.Redis) -> None:
    the_spec = spec(url_of(client), (totals_binding(),))
    zombie = driver.runtime(the_spec)
    zombie.open()
    zombie.transact(upstream_batch(0), {"batch": 0})
    newer = driver.runtime(the_spec)
    newer.open()
    with pytest.raises(FencedOff, match="fenced off"):
        zombie.transact(upstream_batch(1), {"batch": 1})
    zombie.close()
    newer.transact(upstream_batch(1), {"batch": 1})
    newer.close()
    assert client.hget(b"tot:eu:1", b"total") == b"11"


def test_validate_refuses_what_redis_cannot_hold(driver: HostedDriver, client: redis.Redis) -> None:
    binding = Binding(("p:",), ("id",), ("at",), {"id": "BIGINT", "at": "TIMESTAMPTZ"})
    proposal = ValidateBinding(("p:",), ("id",), {"id": "BIGINT", "tags": "VARCHAR[]", "at": "TIMESTAMPTZ"})
    runtime = driver.runtime(spec(url_of(client), (binding,)))
    constraints = runtime.validate([proposal]).bindings[0].constraints
    assert {name: c.type for name, c in constraints.items()} == {
        "id": "LOCATION_REQUIRED", "tags": INCOMPATIBLE, "at": "LOCATION_RECOMMENDED"}
    runtime.close()
    with pytest.raises(DriverError, match="option URL"):
        driver.runtime(MaterializationSpec("bad", (totals_binding(),), {"url": "http://x"})).validate()
    with pytest.raises(DriverError, match="same key prefix"):
        driver.runtime(spec(url_of(client), (totals_binding(), typed_binding()), key_prefix="x")).validate()
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    with pytest.raises(DriverError, match=f"REDIS sink: 127.0.0.1:{closed_port} failed") as failure:
        driver.runtime(spec(f"redis://:secret@127.0.0.1:{closed_port}/0", (totals_binding(),))).validate()
    assert "secret" not in str(failure.value)


def test_a_value_its_column_cannot_hold_fails_the_transaction(driver: HostedDriver, client: redis.Redis) -> None:
    runtime = driver.runtime(spec(url_of(client), (totals_binding(),)))
    runtime.open()
    with pytest.raises(DriverError, match="column 'total' \\(BIGINT\\) cannot hold '12': expected an integer"):
        runtime.transact([(0, ["eu", 1], {"region": "eu", "shop": 1, "total": "12"})], {"batch": 1})
    runtime.close()
    assert hashes(client) == {}
