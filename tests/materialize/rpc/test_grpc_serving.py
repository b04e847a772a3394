"""The serving-store driver (ServingTransactor / ServingConnector over a real DuckDB file) served over gRPC by
serve_grpc_driver and driven by a real Runtime through GrpcDriverConnection: control requests, transactions (row
and columnar), fencing, driver errors, ordering violations and lost runtimes, all through driver.py's loop."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from headrace.materialize.columnar import ColumnarDocuments, ColumnarStores
from headrace.materialize.drivers.serving import ServingTransactor
from headrace.materialize.driver import STORE_BATCH, WRITE_BATCH
from headrace.materialize.protocol import (
    LOCATION_RECOMMENDED,
    LOCATION_REQUIRED,
    PROTOCOL_VERSION,
    Acknowledge,
    Acknowledged,
    Binding,
    DriverError,
    ErrorResponse,
    FencedOff,
    Flush,
    Flushed,
    MaterializationError,
    MaterializationSpec,
    Open,
    Opened,
    Store,
    StoreColumns,
)
from headrace.materialize.rpc.client import GrpcDriverConnection
from headrace.materialize.rpc.external import free_port
from headrace.store.serving import ServingStore

from ..conftest import WEBHOOK_COLUMNS, webhook_doc, webhook_spec
from .conftest import ServingOverGrpc

SOURCE = ("headrace_internal", "source_u1")
COUNTS = MaterializationSpec("counts", (Binding(("headrace_internal", "counts"), ("k",), ("v",),
                                                {"k": "VARCHAR", "v": "BIGINT"}),))


def rows(store: ServingStore, table: str = "source_u1") -> list[tuple[Any, ...]]:
    cursor = store.cursor()
    try:
        return cursor.execute(f"SELECT idempotency_key, body::VARCHAR, epoch_us(received_at) "
                              f"FROM headrace_internal.{table} ORDER BY ALL").fetchall()
    finally:
        cursor.close()


def counts(store: ServingStore) -> dict[str, int]:
    cursor = store.cursor()
    try:
        return dict(cursor.execute("SELECT k, v FROM headrace_internal.counts").fetchall())
    finally:
        cursor.close()


def add_bodies(older: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
    return {**newer, "body": {**newer["body"], "k": older["body"]["k"] + newer["body"]["k"]}}


def test_control_requests_and_transactions_over_grpc(serving_driver: ServingOverGrpc) -> None:
    runtime = serving_driver.runtime(webhook_spec(), reducers=[add_bodies])
    assert runtime.spec_of_driver().protocol == PROTOCOL_VERSION
    constraints = runtime.validate().bindings[0].constraints
    assert constraints["idempotency_key"].type == LOCATION_REQUIRED
    assert constraints["body"].type == LOCATION_RECOMMENDED
    assert "created table" in runtime.apply().action_description
    assert runtime.open() is None
    runtime.transact([(0, ["a"], webhook_doc("a", 1)), (0, ["b"], webhook_doc("b", 2))], {"batch_id": 1})
    # Loaded documents come back over the stream and are reduced with the new ones.
    runtime.transact([(0, ["a"], webhook_doc("a", 10)), (0, ["c"], webhook_doc("c", 3))], {"batch_id": 2})
    deleted = {**webhook_doc("b", 0), "_meta": {"op": "d"}}
    runtime.transact([(0, ["b"], deleted)], {"batch_id": 3})
    assert [(key, json.loads(body)["k"]) for key, body, _ in rows(serving_driver.store)] == [("a", 11), ("c", 3)]
    runtime.close()
    again = serving_driver.runtime(webhook_spec())
    assert again.apply().action_description == "no changes"
    assert again.open() == {"batch_id": 3}  # the store is authoritative: its checkpoint, read at Open
    again.close()


def test_many_documents_and_a_commit_in_flight(serving_driver: ServingOverGrpc) -> None:
    """More Loaded than one write batch of the driver loop, and commits in flight (pipelined)."""
    runtime = serving_driver.runtime(webhook_spec())
    runtime.open()
    documents = [(0, [f"k{i:05}"], webhook_doc(f"k{i:05}", i)) for i in range(WRITE_BATCH + 50)]
    runtime.transact(documents, {"batch_id": 1}, wait_for_commit=False)
    runtime.transact(documents, {"batch_id": 2}, wait_for_commit=False)  # every key Loaded, then updated
    runtime.finish_commit()
    stored = rows(serving_driver.store)
    assert len(stored) == WRITE_BATCH + 50 and json.loads(stored[-1][1])["k"] == WRITE_BATCH + 49
    assert serving_driver.store.latest_timestamp("source_u1") is not None
    runtime.close()


def test_columnar_stores_and_loads_over_grpc(serving_driver: ServingOverGrpc) -> None:
    runtime = serving_driver.runtime(webhook_spec())
    runtime.apply()
    runtime.open()
    received_at = pa.array([1_700_000_000_000_000] * 3, pa.timestamp("us", tz="UTC"))  # DuckDB's own Arrow type
    inserted = pa.table({"idempotency_key": ["a", "b", "c"], "body": ['{"k":1}', '{"k":2}', '{"k":3}'],
                         "received_at": received_at})
    runtime.transact([(0, ["j"], webhook_doc("j", 1))], {"batch_id": 1}, [StoreColumns(0, rows=inserted)])
    runtime.transact([], {"batch_id": 2}, [StoreColumns(
        0, deleted=pa.table({"idempotency_key": ["b", "never"]}),
        updated=inserted.slice(2).set_column(1, "body", pa.array(['{"k":30}'])))])
    assert [(key, json.loads(body)["k"]) for key, body, _ in rows(serving_driver.store)] == \
        [("a", 1), ("c", 30), ("j", 1)]
    runtime.close()

    # Columnar documents: LoadColumns over the stream, answered by LoadedColumns, reduced, StoreColumns back.
    summing = serving_driver.runtime(COUNTS)
    summing.apply()
    summing.open()
    seen: list[list[dict[str, Any]]] = []

    def add(partials: pa.Table, loaded: pa.Table | None) -> ColumnarStores:
        old = {row["k"]: row["v"] for row in (loaded.to_pylist() if loaded is not None else [])}
        seen.append(sorted(old))
        new = [{"k": k, "v": old.get(k, 0) + v} for k, v in zip(partials["k"].to_pylist(), partials["v"].to_pylist())]
        fresh = [row for row in new if row["k"] not in old]
        known = [row for row in new if row["k"] in old]
        return ColumnarStores(rows=pa.Table.from_pylist(fresh) if fresh else None,
                              updated=pa.Table.from_pylist(known) if known else None)

    for batch_id, batch in enumerate([{"x": 1, "y": 2}, {"y": 5, "z": 7}, {"x": 1, "z": 1}]):
        partials = pa.table({"k": list(batch), "v": pa.array(list(batch.values()), pa.int64())})
        summing.transact([], {"batch_id": batch_id}, columnar=[ColumnarDocuments(0, partials, add)])
    assert seen == [[], ["y"], ["x", "z"]]  # exactly the stored keys of each request came back
    assert counts(serving_driver.store) == {"x": 2, "y": 7, "z": 8}
    summing.close()


def test_a_zombie_is_fenced_off_over_grpc(serving_driver: ServingOverGrpc) -> None:
    first = serving_driver.runtime(webhook_spec(), reducers=[add_bodies])
    first.open()
    first.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 0})
    second = serving_driver.runtime(webhook_spec(), reducers=[add_bodies])
    assert second.open() == {"batch_id": 0}  # bumps the fence
    batch = [(0, ["a"], webhook_doc("a", 10)), (0, ["b"], webhook_doc("b", 5))]
    with pytest.raises(FencedOff, match="materialization source_u1 fenced off by another runtime"):
        first.transact(batch, {"batch_id": 1})
    with pytest.raises(MaterializationError, match="unusable after an earlier failure"):
        first.transact(batch, {"batch_id": 1})
    second.transact(batch, {"batch_id": 1})
    assert [(key, json.loads(body)["k"]) for key, body, _ in rows(serving_driver.store)] == [("a", 11), ("b", 5)]
    second.close()
    third = serving_driver.runtime(webhook_spec())
    assert third.open() == {"batch_id": 1}
    third.close()


def test_a_driver_error_reaches_the_runtime_and_the_driver_recovers(serving_driver: ServingOverGrpc) -> None:
    runtime = serving_driver.runtime(webhook_spec())
    runtime.open()
    bad = pa.table({"idempotency_key": ["a"], "body": ["{not json"], "received_at": pa.array([0], pa.int64())})
    with pytest.raises(DriverError, match="not JSON"):
        runtime.transact([], {"batch_id": 1}, [StoreColumns(0, rows=bad)])
    assert rows(serving_driver.store) == []
    runtime.close()
    retry = serving_driver.runtime(webhook_spec())  # a new stream on the same server
    retry.open()
    retry.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 1})
    assert [r[0] for r in rows(serving_driver.store)] == ["a"]
    retry.close()


def test_an_out_of_order_request_is_answered_with_error_and_the_stream_ends(serving_driver: ServingOverGrpc) -> None:
    connection = serving_driver.connection()
    connection.send([Open(webhook_spec(), 0, 0xFFFFFFFF)])
    assert isinstance(connection.recv(), Opened)
    connection.send([Flush()])  # before Acknowledge
    answer = connection.recv()
    assert isinstance(answer, ErrorResponse) and "Flush" in answer.message and not answer.fenced_off
    with pytest.raises(ConnectionError, match="ended the stream"):
        connection.recv()
    with pytest.raises(ConnectionError):
        connection.send([Flush()])
    connection.close()


class ObservedTransactor(ServingTransactor):
    """The real serving transactor, slow to take Stores, recording the order of calls."""

    def __init__(self, store: ServingStore) -> None:
        super().__init__(store)
        self.calls: list[str] = []
        self.storing = threading.Event()
        self.closed = threading.Event()

    def store(self, stores: list[Store]) -> None:
        self.storing.set()
        time.sleep(0.5)  # the stream goes away meanwhile
        super().store(stores)
        self.calls.append("store returned")

    def close(self) -> None:
        self.calls.append("close")
        super().close()
        self.closed.set()


def test_a_runtime_going_away_abandons_its_transaction(serving_driver: ServingOverGrpc) -> None:
    """The cancelled stream must neither cut the loop short nor close the transactor under a running call."""
    runtime = serving_driver.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 1})
    runtime.close()
    before = rows(serving_driver.store)

    serving_driver.make_transactor = ObservedTransactor
    connection = serving_driver.connection()
    connection.send([Open(webhook_spec(), 0, 0xFFFFFFFF), Acknowledge()])
    assert isinstance(connection.recv(), Opened) and isinstance(connection.recv(), Acknowledged)
    connection.send([Flush()])
    assert isinstance(connection.recv(), Flushed)
    # More than one hand-over batch: the transactor is busy with the first when the stream is cancelled.
    connection.send([Store(0, [f"k{i}"], [{"k": i}, 0], webhook_doc(f"k{i}", i), False)
                     for i in range(STORE_BATCH + 10)])
    transactor = serving_driver.transactors[-1]
    assert isinstance(transactor, ObservedTransactor) and transactor.storing.wait(10)
    connection.close()
    assert transactor.closed.wait(10)
    assert transactor.calls == ["store returned", "close"]  # closed (rolled back) only once its call returned
    assert rows(serving_driver.store) == before
    reopened = serving_driver.runtime(webhook_spec())
    assert reopened.open() == {"batch_id": 1}
    reopened.close()


def test_an_unreachable_driver_is_a_connection_error() -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="did not accept a connection"):
        GrpcDriverConnection(f"127.0.0.1:{free_port()}", timeout=0.5)
    assert time.monotonic() - started < 5


def test_a_stopped_driver_server_is_a_lost_driver(serving_driver: ServingOverGrpc) -> None:
    runtime = serving_driver.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 1})
    serving_driver.stop()
    with pytest.raises((ConnectionError, MaterializationError)):
        runtime.transact([(0, ["b"], webhook_doc("b", 1))], {"batch_id": 2})
    assert [r[0] for r in rows(serving_driver.store)] == ["a"]


def test_the_spec_is_the_tcp_one(serving_driver: ServingOverGrpc) -> None:
    """Column types, key and config reach the driver unchanged (the endpoint config is not logged)."""
    seen: list[Open] = []

    def recording(store: ServingStore) -> ServingTransactor:
        transactor = ServingTransactor(store)
        original = transactor.open

        def open_(open: Open) -> Opened:
            seen.append(open)
            return original(open)

        transactor.open = open_  # type: ignore[method-assign]
        return transactor

    serving_driver.make_transactor = recording
    spec = MaterializationSpec("source_u1", webhook_spec().bindings, config={"password": "s3cret", "n": 2**70})
    runtime = serving_driver.runtime(spec)
    runtime.open({"pending": {"t": "f"}})
    runtime.close()
    assert seen[0].spec == spec and seen[0].spec.config["n"] == 2**70
    assert seen[0].driver_state == {"pending": {"t": "f"}} and seen[0].key_end == 0xFFFFFFFF
    assert dict(seen[0].spec.bindings[0].column_types) == WEBHOOK_COLUMNS
