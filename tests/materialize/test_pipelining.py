"""PipelinedRuntime: the next transaction is read and combined while the driver's commit is in flight."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from headrace.materialize.drivers.serving import ServingTransactor
from headrace.materialize.protocol import (
    Acknowledged,
    FencedOff,
    Load,
    MaterializationError,
    Request,
    Response,
    StartedCommit,
)
from headrace.materialize.runtime import PipelinedRuntime, RpcDriverConnection, Runtime
from headrace.store.serving import ServingStore

from .conftest import DriverServer, webhook_doc, webhook_spec


class GatedTransactor(ServingTransactor):
    """The serving transactor with gates on commit and acknowledgement, to hold a transaction in flight."""

    def __init__(self, store: ServingStore) -> None:
        super().__init__(store)
        self.commit_gate = threading.Event()
        self.commit_gate.set()
        self.committing = threading.Event()
        self.acknowledge_gate = threading.Event()
        self.acknowledge_gate.set()

    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit:
        self.committing.set()
        assert self.commit_gate.wait(20)
        return super().start_commit(runtime_checkpoint)

    def acknowledge(self) -> Acknowledged:
        assert self.acknowledge_gate.wait(20)
        return super().acknowledge()


class RecordingConnection(RpcDriverConnection):
    """Records the order of messages sent and received (type names, Loads with their key)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []

    def send(self, msgs: list[Request]) -> None:
        self.events += [f"sent Load {m.key[0]}" if isinstance(m, Load) else f"sent {type(m).__name__}" for m in msgs]
        super().send(msgs)

    def recv(self) -> Response:
        response = super().recv()
        self.events.append(f"received {type(response).__name__}")
        return response


def docs(keys: list[str], n: int) -> list[tuple[int, list[Any], dict[str, Any]]]:
    return [(0, [key], webhook_doc(key, n)) for key in keys]


def stored(store: ServingStore) -> dict[str, int]:
    cursor = store.cursor()
    rows = cursor.execute("SELECT idempotency_key, body->>'k' FROM headrace_internal.source_u1").fetchall()
    return {key: int(k) for key, k in rows}


@pytest.fixture
def gated(driver_server: DriverServer) -> DriverServer:
    driver_server.make_transactor = GatedTransactor
    return driver_server


def gated_transactor(server: DriverServer) -> GatedTransactor:
    transactor = server.transactors[-1]
    assert isinstance(transactor, GatedTransactor)
    return transactor


def test_documents_fed_during_a_commit_join_the_next_transaction(gated: DriverServer) -> None:
    runtime = gated.runtime(webhook_spec())
    runtime.open()
    transactor = gated_transactor(gated)
    transactor.commit_gate.clear()
    pipeline = PipelinedRuntime(runtime)
    first = pipeline.feed(docs(["a", "b"], 1), {"batch": 1})
    assert transactor.committing.wait(10)  # transaction 1 is committing and held there
    tickets = [pipeline.feed(docs(["b", "c"], 2), {"batch": 2}), pipeline.feed(docs(["c", "d"], 3), {"batch": 3}),
               pipeline.feed(docs(["e"], 4), {"batch": 4})]
    with pytest.raises(TimeoutError):
        pipeline.wait(first, timeout=0.2)
    transactor.commit_gate.set()
    pipeline.wait(tickets[-1], timeout=10)
    assert pipeline.transaction_sizes == [2, 4]  # three feeds combined into one transaction of keys b, c, d, e
    assert stored(gated.store) == {"a": 1, "b": 2, "c": 3, "d": 3, "e": 4}
    pipeline.close()
    assert gated.runtime(webhook_spec()).open() == {"batch": 4}


def test_acknowledge_and_loads_go_out_before_acknowledged(gated: DriverServer) -> None:
    connection = RecordingConnection(gated.host, gated.port, io_timeout=30)
    runtime = Runtime(connection, webhook_spec())
    runtime.open()
    transactor = gated_transactor(gated)
    pipeline = PipelinedRuntime(runtime)
    pipeline.wait(pipeline.feed(docs(["a"], 1), {"batch": 1}), timeout=10)
    transactor.acknowledge_gate.clear()  # the driver's commit of transaction 1 stays unacknowledged
    ticket = pipeline.feed(docs(["b"], 2), {"batch": 2})
    deadline = time.monotonic() + 10
    while "sent Load b" not in connection.events and time.monotonic() < deadline:
        time.sleep(0.01)
    late = pipeline.feed(docs(["c"], 3), {"batch": 3})  # still before Acknowledged: same transaction
    transactor.acknowledge_gate.set()
    pipeline.wait(late, timeout=10)
    assert ticket < late and pipeline.transaction_sizes == [1, 2]
    second = connection.events[connection.events.index("received StartedCommit") + 1:]
    assert second[:3] == ["sent Acknowledge", "sent Load b", "received Acknowledged"]
    assert second[3:6] == ["sent Load c", "sent Flush", "received Flushed"]  # new keys: nothing to load
    pipeline.close()


def test_a_full_pending_transaction_holds_producers_back(gated: DriverServer) -> None:
    runtime = gated.runtime(webhook_spec())
    runtime.open()
    transactor = gated_transactor(gated)
    transactor.commit_gate.clear()
    pipeline = PipelinedRuntime(runtime, max_pending_keys=3)
    pipeline.feed(docs(["a"], 1), {"batch": 1})
    assert transactor.committing.wait(10)
    pipeline.feed(docs(["b", "c", "d"], 2), {"batch": 2})  # the pending transaction is full now
    fed = threading.Event()
    producer = threading.Thread(target=lambda: (pipeline.feed(docs(["e"], 3), {"batch": 3}), fed.set()))
    producer.start()
    assert not fed.wait(0.3)  # back-pressure: the producer waits for the commit
    transactor.commit_gate.set()
    assert fed.wait(10)
    producer.join(10)
    pipeline.close()
    assert stored(gated.store) == {"a": 1, "b": 2, "c": 2, "d": 2, "e": 3}


def test_a_failed_commit_fails_waiters_and_producers(gated: DriverServer) -> None:
    zombie = gated.runtime(webhook_spec())
    zombie.open()
    pipeline = PipelinedRuntime(zombie)
    pipeline.wait(pipeline.feed(docs(["a"], 1), {"batch": 1}), timeout=10)
    successor = gated.runtime(webhook_spec())
    successor.open()  # fences the pipelined runtime off
    ticket = pipeline.feed(docs(["z"], 2), {"batch": 2})
    with pytest.raises(MaterializationError, match="fenced off") as info:
        pipeline.wait(ticket, timeout=10)
    assert isinstance(info.value.__cause__, FencedOff)
    with pytest.raises(MaterializationError, match="failed"):
        pipeline.feed(docs(["y"], 3), {"batch": 3})
    assert stored(gated.store) == {"a": 1}
    successor.close()
