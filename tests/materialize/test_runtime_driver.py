"""Runtime <-> driver end to end: a real TCP driver server over a real DuckDB file."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import pytest

from headrace.materialize.driver import STORE_BATCH
from headrace.materialize.drivers.serving import ServingTransactor
from headrace.materialize.protocol import (
    Binding,
    DriverError,
    FencedOff,
    Load,
    MaterializationError,
    MaterializationSpec,
    Open,
    Request,
    StartCommit,
    Store,
    to_wire,
)
from headrace.materialize.runtime import RpcDriverConnection, Runtime
from headrace.materialize.transport import FrameSocket
from headrace.store.serving import ServingStore

from .conftest import DriverServer, webhook_doc, webhook_spec


class ObservedTransactor(ServingTransactor):
    """The real serving transactor, recording what the connection loop hands it."""

    def __init__(self, store: ServingStore) -> None:
        super().__init__(store)
        self.calls: list[str] = []
        self.loads: list[Load] = []
        self.stores: list[Store] = []
        self.stored = threading.Event()
        self.closed = threading.Event()
        self.acknowledge_gate = threading.Event()
        self.acknowledge_gate.set()

    def load(self, loads: list[Load]) -> Any:
        self.calls.append("load")
        self.loads.extend(loads)
        return super().load(loads)

    def store(self, stores: list[Store]) -> None:
        super().store(stores)
        self.stores.extend(stores)
        self.stored.set()

    def acknowledge(self) -> Any:
        assert self.acknowledge_gate.wait(10)
        self.calls.append("acknowledge")
        return super().acknowledge()

    def close(self) -> None:
        super().close()
        self.closed.set()


@pytest.fixture
def server(driver_server: DriverServer) -> DriverServer:
    driver_server.make_transactor = ObservedTransactor
    return driver_server


def rows(store: ServingStore, table: str = "source_u1") -> list[tuple[Any, ...]]:
    cursor = store.cursor()
    try:
        return cursor.execute(f"SELECT idempotency_key, body::VARCHAR, epoch_us(received_at) "
                              f"FROM headrace_internal.{table} ORDER BY ALL").fetchall()
    finally:
        cursor.close()


def last_transactor(server: DriverServer) -> ObservedTransactor:
    transactor = server.transactors[-1]
    assert isinstance(transactor, ObservedTransactor)
    return transactor


def test_documents_land_in_the_serving_store(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec())
    assert runtime.open() is None  # a new materialization: resume from the runtime's own log
    runtime.transact([(0, ["a"], webhook_doc("a", 1, received_at=1_700_000_000_123_456)),
                      (0, ["b"], webhook_doc("b", 2)),
                      (0, ["a"], webhook_doc("a", 3, received_at=5))],  # same key again: last write wins
                     {"batch_id": 0})
    pad = "x" * 50
    assert rows(server.store) == [("a", f'{{"k":3,"pad":"{pad}"}}', 5),
                                  ("b", f'{{"k":2,"pad":"{pad}"}}', 1_700_000_000_000_000)]
    transactor = last_transactor(server)
    assert sorted(load.key[0] for load in transactor.loads) == ["a", "b"]  # each key loaded once
    assert [s.exists for s in transactor.stores] == [False, False]
    runtime.close()


def test_stored_keys_are_updated_with_exists(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1)), (0, ["b"], webhook_doc("b", 1))], {"batch_id": 0})
    runtime.transact([(0, ["a"], webhook_doc("a", 2)), (0, ["c"], webhook_doc("c", 2))], {"batch_id": 1})
    stores = last_transactor(server).stores
    assert [(s.key, s.exists) for s in stores[2:]] == [(["a"], True), (["c"], False)]
    assert [(key, body[:7]) for key, body, _ in rows(server.store)] == [("a", '{"k":2,'), ("b", '{"k":1,'),
                                                                        ("c", '{"k":2,')]
    assert runtime.committed_transactions == 2
    runtime.close()


def test_loaded_documents_are_reduced_with_new_ones(server: DriverServer) -> None:
    def add_bodies(older: dict[str, Any] | None, newer: dict[str, Any]) -> dict[str, Any]:
        total = newer["body"]["k"] + (older["body"]["k"] if older else 0)
        return {**newer, "body": {"k": total}}

    for batch_id in range(3):
        runtime = server.runtime(webhook_spec(), reducers=[add_bodies])  # a new runtime: loads from the store
        runtime.open()
        runtime.transact([(0, ["a"], webhook_doc("a", 1)), (0, ["a"], webhook_doc("a", 10))],
                         {"batch_id": batch_id})
        runtime.close()
    assert rows(server.store)[0][:2] == ("a", '{"k":33}')


def test_reopening_returns_the_last_committed_checkpoint(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 1, "offsets": [10, 20]})
    runtime.transact([], {"batch_id": 2, "offsets": [11, 20]})  # an empty transaction still commits
    runtime.close()
    reopened = server.runtime(webhook_spec())
    assert reopened.open() == {"batch_id": 2, "offsets": [11, 20]}
    reopened.close()


def test_a_zombie_runtime_is_fenced_off(server: DriverServer) -> None:
    zombie = server.runtime(webhook_spec())
    assert zombie.open() is None
    successor = server.runtime(webhook_spec())
    successor.open()  # bumps the fence
    with pytest.raises(FencedOff, match=r"materialization source_u1 fenced off by another runtime \(fence 1\)"):
        zombie.transact([(0, ["z"], webhook_doc("z", 1))], {"batch_id": "zombie"})
    assert rows(server.store) == []  # the zombie committed nothing
    with pytest.raises(MaterializationError, match="unusable after an earlier failure"):
        zombie.transact([], {"batch_id": "zombie"})
    successor.transact([(0, ["s"], webhook_doc("s", 1))], {"batch_id": "successor"})
    assert [r[0] for r in rows(server.store)] == ["s"]
    successor.close()
    assert server.runtime(webhook_spec()).open() == {"batch_id": "successor"}


def test_a_runtime_killed_mid_transaction_commits_nothing(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 1})
    runtime.close()
    before = rows(server.store)

    class DiesBeforeStartCommit(RpcDriverConnection):
        def send(self, msgs: list[Request]) -> None:
            if any(isinstance(m, StartCommit) for m in msgs):
                assert last_transactor(server).stored.wait(10)  # the driver holds the Stores
                self.close()
                raise ConnectionAbortedError("runtime process killed")
            super().send(msgs)

    doomed = Runtime(DiesBeforeStartCommit(server.host, server.port), webhook_spec())
    doomed.open()
    # More than one hand-over batch, so the transactor holds staged Stores when the connection dies.
    documents = [(0, [f"k{i}"], webhook_doc(f"k{i}", i)) for i in range(STORE_BATCH + 10)]
    with pytest.raises(ConnectionAbortedError):
        doomed.transact([(0, ["a"], webhook_doc("a", 2)), *documents], {"batch_id": 2})
    assert last_transactor(server).closed.wait(10)  # the driver saw the connection end
    assert rows(server.store) == before
    reopened = server.runtime(webhook_spec())
    assert reopened.open() == {"batch_id": 1}
    reopened.close()


def test_loads_wait_for_the_previous_commit_to_be_acknowledged(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    transactor = last_transactor(server)
    transactor.acknowledge_gate.clear()
    worker = threading.Thread(target=runtime.transact, args=([(0, ["a"], webhook_doc("a", 1))], {"n": 1}))
    worker.start()
    time.sleep(0.3)  # Acknowledge and the Load are on the wire by now
    assert transactor.calls == [] and rows(server.store) == []
    transactor.acknowledge_gate.set()
    worker.join(10)
    assert transactor.calls == ["acknowledge", "load"]
    assert [r[0] for r in rows(server.store)] == ["a"]
    runtime.close()


def test_delta_updates_append_without_loads(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec("deltas", delta_updates=True))
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"n": 1})
    runtime.transact([(0, ["a"], webhook_doc("a", 2))], {"n": 2})
    assert [(r[0], r[1][:7]) for r in rows(server.store, "deltas")] == [("a", '{"k":1,'), ("a", '{"k":2,')]
    assert last_transactor(server).calls == ["acknowledge", "acknowledge"]  # no load at all
    runtime.close()


def test_every_column_type_round_trips_through_load(server: DriverServer) -> None:
    spec = MaterializationSpec("typed", (Binding(
        ("typed",), ("id", "tag"), ("score", "ok", "n", "seen_at"),
        {"id": "BIGINT", "tag": "JSON", "score": "DOUBLE", "ok": "BOOLEAN", "n": "INTEGER", "seen_at": "TIMESTAMPTZ"}),))
    doc = {"id": 7, "tag": {"b": 1, "a": [1, None]}, "score": 0.5, "ok": True, "n": None, "seen_at": -1}
    runtime = server.runtime(spec)
    runtime.open()
    runtime.transact([(0, [7, {"b": 1, "a": [1, None]}], doc)], {"n": 1})
    # The same JSON key with members in another order is the same key: loaded, hence exists=True.
    runtime.transact([(0, [7, {"a": [1, None], "b": 1}], {**doc, "score": 1.5})], {"n": 2})
    transactor = last_transactor(server)
    assert [s.exists for s in transactor.stores] == [False, True]
    cursor = server.store.cursor()
    assert cursor.execute("SELECT id, tag::VARCHAR, score, ok, n, epoch_us(seen_at) FROM typed").fetchall() == [
        (7, '{"a":[1,null],"b":1}', 1.5, True, None, -1)]
    runtime.close()


def test_a_failing_store_is_a_driver_error_and_commits_nothing(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    bad = {**webhook_doc("a", 1), "received_at": "yesterday"}
    with pytest.raises(DriverError, match=r"column 'received_at' \(TIMESTAMPTZ\) cannot hold 'yesterday'") as info:
        runtime.transact([(0, ["a"], bad)], {"n": 1})
    assert not isinstance(info.value, FencedOff)
    assert rows(server.store) == []
    assert server.runtime(webhook_spec()).open() is None  # no checkpoint was written either


@pytest.mark.parametrize("script, problem", [
    ([{"type": "Flush"}], "Flush sent before Open"),
    ([{"type": "Open"}], "malformed Open message"),
    (["OPEN", {"type": "Flush"}], "Flush must follow Acknowledge or Load or LoadColumns, but follows Open"),
    (["OPEN", {"type": "Acknowledge"}, {"type": "Store", "binding": 0, "key": ["a"], "values": [1, 2],
                                        "doc": None, "exists": False}],
     "Store must follow Flush or Store or StoreColumns, but follows Acknowledge"),
    (["OPEN", {"type": "Acknowledge"}, {"type": "Load", "binding": 0, "key": ["a"]},
      {"type": "Load", "binding": 0, "key": ["a"]}], r"key \['a'\] sent twice"),
])
def test_the_driver_rejects_out_of_order_requests(server: DriverServer, script: list[Any], problem: str) -> None:
    open_wire = to_wire(Open(webhook_spec(), 0, 0xFFFFFFFF, {}))
    with FrameSocket.connect(server.host, server.port, timeout=5, io_timeout=10) as sock:
        sock.send_many([open_wire if step == "OPEN" else step for step in script])
        responses: list[dict[str, Any]] = []
        while not responses or responses[-1]["type"] != "Error":
            responses.append(sock.recv())
        with pytest.raises(ConnectionError):  # the driver closes after an Error
            sock.recv()
    assert responses[-1]["type"] == "Error"
    assert responses[-1]["fenced_off"] is False
    assert re.search(problem, responses[-1]["message"]), responses[-1]["message"]


def test_splitting_a_range_fences_off_the_parent_and_inherits_its_checkpoint(server: DriverServer) -> None:
    parent = server.runtime(webhook_spec())
    parent.open()
    parent.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 1})
    child = server.runtime(webhook_spec(), key_begin=0, key_end=0x7FFFFFFF)
    assert child.open() == {"batch_id": 1}  # the child starts where the parent left off
    with pytest.raises(FencedOff, match="fenced off"):
        parent.transact([(0, ["b"], webhook_doc("b", 1))], {"batch_id": 2})
    child.transact([(0, ["c"], webhook_doc("c", 1))], {"batch_id": "child 2"})
    sibling = server.runtime(webhook_spec(), key_begin=0x80000000, key_end=0xFFFFFFFF)
    assert sibling.open() == {"batch_id": 1}  # from the (fenced) parent row, not the other child's
    assert [r[0] for r in rows(server.store)] == ["a", "c"]
    cursor = server.store.cursor()
    assert cursor.execute("SELECT key_begin, key_end, fence FROM headrace_internal.checkpoints "
                          "ORDER BY key_begin, key_end").fetchall() == [
        (0, 0x7FFFFFFF, 2), (0, 0xFFFFFFFF, 3), (0x80000000, 0xFFFFFFFF, 3)]
    child.close()
    sibling.close()


def test_a_driver_failing_while_stores_stream_in_reports_its_error(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    documents = [(0, [f"k{i}"], webhook_doc(f"k{i}", i)) for i in range(STORE_BATCH * 4)]
    documents[0] = (0, ["k0"], {**webhook_doc("k0", 0), "received_at": "soon"})  # fails the first hand-over
    with pytest.raises(DriverError, match="column 'received_at' \\(TIMESTAMPTZ\\) cannot hold 'soon'"):
        runtime.transact(documents, {"n": 1})
    assert rows(server.store) == []


def test_materializations_commit_concurrently_into_one_store(server: DriverServer) -> None:
    errors: list[BaseException] = []

    def materialize(name: str) -> None:
        try:
            runtime = server.runtime(webhook_spec(name))
            runtime.open()
            for batch_id in range(5):
                keys = [f"{name}-{batch_id}-{i}" for i in range(500)]
                runtime.transact([(0, [key], webhook_doc(key, 1)) for key in keys], {"batch_id": batch_id})
            runtime.close()
        except BaseException as exc:  # collected: an assertion in a thread would be lost
            errors.append(exc)

    threads = [threading.Thread(target=materialize, args=(f"source_u{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    for n in range(3):
        assert len(rows(server.store, f"source_u{n}")) == 2500
        assert server.runtime(webhook_spec(f"source_u{n}")).open() == {"batch_id": 4}


def test_a_spec_the_driver_cannot_serve_fails_open(server: DriverServer) -> None:
    spec = MaterializationSpec("bad", (Binding(("bad",), ("k",), ("v",), {"k": "VARCHAR", "v": "HUGEINT"}),))
    runtime = server.runtime(spec)
    with pytest.raises(DriverError, match="column type HUGEINT of 'v' is not supported"):
        runtime.open()


def add_bodies(older: dict[str, Any] | None, newer: dict[str, Any]) -> dict[str, Any]:
    """A sum reduction of body.k: not idempotent, so any doubling shows."""
    return {**newer, "body": {"k": newer["body"]["k"] + (older["body"]["k"] if older else 0)}}


def test_delta_updates_store_the_combination_of_this_transaction_only(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec("deltas", delta_updates=True), reducers=[add_bodies])
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", -1)), (0, ["a"], webhook_doc("a", 3)),
                      (0, ["a"], webhook_doc("a", 2))], {"n": 1})
    runtime.transact([(0, ["a"], webhook_doc("a", 6)), (0, ["a"], webhook_doc("a", -7)),
                      (0, ["a"], webhook_doc("a", -1))], {"n": 2})
    assert [(r[0], r[1]) for r in rows(server.store, "deltas")] == [("a", '{"k":-2}'), ("a", '{"k":4}')]
    transactor = last_transactor(server)
    assert transactor.loads == [] and transactor.calls == ["acknowledge", "acknowledge"]
    runtime.close()


def test_a_deleted_document_deletes_its_key(server: DriverServer) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1)), (0, ["b"], webhook_doc("b", 1))], {"n": 1})
    deletion = {**webhook_doc("a", 0), "_meta": {"op": "d"}}
    runtime.transact([(0, ["a"], deletion), (0, ["c"], deletion)], {"n": 2})  # c was never stored
    stores = last_transactor(server).stores[2:]
    assert [(s.key, s.delete, s.exists) for s in stores] == [(["a"], True, True)]
    assert [r[0] for r in rows(server.store)] == ["b"]
    runtime.transact([(0, ["a"], webhook_doc("a", 2))], {"n": 3})  # a key comes back after its deletion
    assert [r[0] for r in rows(server.store)] == ["a", "b"]
    runtime.close()


def test_a_zombie_commits_nothing_and_nothing_is_doubled(server: DriverServer) -> None:
    """A second runtime opens the same materialization while the first holds a transaction; the first's commit
    fails fenced, the second replays from the store's checkpoint: every document counted once."""
    first = server.runtime(webhook_spec(), reducers=[add_bodies])
    first.open()
    first.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 0})
    second = server.runtime(webhook_spec(), reducers=[add_bodies])
    assert second.open() == {"batch_id": 0}
    batch_1 = [(0, ["a"], webhook_doc("a", 10)), (0, ["b"], webhook_doc("b", 5))]
    with pytest.raises(FencedOff, match="fenced off"):
        first.transact(batch_1, {"batch_id": 1})
    second.transact(batch_1, {"batch_id": 1})
    with pytest.raises(MaterializationError, match="unusable"):
        first.transact(batch_1, {"batch_id": 1})
    assert [(r[0], json.loads(r[1])["k"]) for r in rows(server.store)] == [("a", 11), ("b", 5)]
    second.close()
