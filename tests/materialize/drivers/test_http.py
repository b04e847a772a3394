"""The HTTP sink driver against a real aiohttp server (in a thread) that records requests and fails on demand,
driven by a real Runtime over the real connection loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from headrace.materialize.drivers.http import HttpConnector, HttpTransactor
from headrace.materialize.protocol import Binding, DriverError, MaterializationSpec, StoreColumns
from headrace.materialize.runtime import Runtime

from .conftest import HostedDriver, hosted_driver

COLUMNS = {"id": "BIGINT", "hr_timestamp": "BIGINT", "hr_diff": "BIGINT", "name": "VARCHAR", "amount": "DECIMAL(10,2)"}
BINDING = Binding(("changes",), ("id", "hr_timestamp", "hr_diff"), ("name", "amount"), COLUMNS, delta_updates=True)


@dataclass
class Received:
    key: str
    body: Any
    headers: dict[str, str]
    outcome: str


@dataclass
class Receiver:
    """An aiohttp server in its own thread. `plan[key]` lists what successive attempts of a batch get: "ok",
    "503", "429" (Retry-After: retry_after), "drop" (the connection is cut, no response), "400"."""

    host: str = "127.0.0.1"
    port: int = 0
    retry_after: str = "0"
    plan: dict[str, list[str]] = field(default_factory=dict)
    always: str = "ok"
    received: list[Received] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hooks/in?token=secret-token"

    def accepted(self) -> list[tuple[str, Any]]:
        return [(r.key, r.body) for r in self.received if r.outcome == "ok"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        key = request.headers.get("Idempotency-Key", "")
        outcome = self.plan[key].pop(0) if self.plan.get(key) else self.always
        self.received.append(Received(key, await request.json(), dict(request.headers), outcome))
        if outcome == "drop":
            assert request.transport is not None
            request.transport.abort()  # no response at all: the client sees the connection cut
            raise asyncio.CancelledError
        if outcome == "503":
            return web.Response(status=503, text="busy")
        if outcome == "429":
            return web.Response(status=429, headers={"Retry-After": self.retry_after})
        if outcome == "400":
            return web.Response(status=400, text="document 3 lacks a name " + "x" * 500)
        return web.json_response({"ok": True})


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="http-receiver", daemon=True)
    thread.start()

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/hooks/in", state.handle)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, state.host, 0)
        await site.start()
        state.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner

    runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield state
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def driver() -> Iterator[HostedDriver]:
    with hosted_driver(lambda _open: HttpTransactor(), HttpConnector()) as host:
        yield host


def spec(receiver: Receiver, name: str = "sink_h", **config: Any) -> MaterializationSpec:
    return MaterializationSpec(name, (BINDING,), config={
        "url": receiver.url, "headers": {"Authorization": "Bearer secret-bearer", "X-Sink": "h"},
        "batch_size": 2, "initial_backoff_seconds": 0.01, **config})


def change(id_: int, timestamp: int, diff: int, name: str = "n") -> tuple[int, list[Any], dict[str, Any]]:
    return (0, [id_, timestamp, diff], {"id": id_, "hr_timestamp": timestamp, "hr_diff": diff, "name": name,
                                        "amount": f"{id_}.50"})


# Two upstream commits: 100 inserts ids 3, 1, 2 (arrival order is not the sent order); 200 updates id 1.
COMMIT_100 = [change(3, 100, 1), change(1, 100, 1), change(2, 100, 1)]
COMMIT_200 = [change(1, 200, 1, "new"), change(1, 200, -1)]


def doc(id_: int, timestamp: int, diff: int, name: str = "n") -> dict[str, Any]:
    return change(id_, timestamp, diff, name)[2]


EXPECTED = [("sink_h:0-4294967295:100:0", [doc(1, 100, 1), doc(2, 100, 1)]),
            ("sink_h:0-4294967295:100:1", [doc(3, 100, 1)]),
            ("sink_h:0-4294967295:200:0", [doc(1, 200, -1), doc(1, 200, 1, "new")])]


def run(driver: HostedDriver, the_spec: MaterializationSpec, *transactions: list[Any]) -> Runtime:
    runtime = driver.runtime(the_spec)
    runtime.validate()
    runtime.open()
    for number, documents in enumerate(transactions):
        runtime.transact(documents, {"batch": number})
    return runtime


def test_changes_are_posted_grouped_by_commit_sorted_and_keyed(driver: HostedDriver, receiver: Receiver) -> None:
    run(driver, spec(receiver), COMMIT_100 + COMMIT_200).close()
    assert receiver.accepted() == EXPECTED
    headers = receiver.received[0].headers
    assert headers["Content-Type"] == "application/json"
    assert headers["Authorization"] == "Bearer secret-bearer" and headers["X-Sink"] == "h"


def test_failed_attempts_are_retried_with_the_same_key(driver: HostedDriver, receiver: Receiver) -> None:
    first, second, third = (key for key, _ in EXPECTED)
    receiver.plan = {first: ["503", "drop", "503"], second: ["drop"], third: ["429", "503"]}
    run(driver, spec(receiver), COMMIT_100 + COMMIT_200).close()
    assert receiver.accepted() == EXPECTED  # every batch arrived, once accepted, in order
    assert [r.key for r in receiver.received] == [first] * 4 + [second] * 2 + [third] * 3
    assert all(r.body == dict(EXPECTED)[r.key] for r in receiver.received)  # each retry resends the same batch


def test_retry_after_is_honoured(driver: HostedDriver, receiver: Receiver) -> None:
    receiver.retry_after = "1"
    receiver.plan = {EXPECTED[2][0]: ["429"]}
    started = time.monotonic()
    run(driver, spec(receiver), COMMIT_200).close()
    assert time.monotonic() - started >= 1.0
    assert receiver.accepted() == [EXPECTED[2]]


def test_a_replay_sends_the_same_keys_whatever_the_transactions(driver: HostedDriver, receiver: Receiver) -> None:
    run(driver, spec(receiver), COMMIT_100 + COMMIT_200).close()
    first = receiver.accepted()
    receiver.received.clear()
    run(driver, spec(receiver), list(reversed(COMMIT_100)), list(reversed(COMMIT_200))).close()
    assert receiver.accepted() == first
    receiver.received.clear()
    run(driver, spec(receiver), [], COMMIT_200 + COMMIT_100).close()
    assert receiver.accepted() == first


def test_columnar_stores_are_posted_like_documents(driver: HostedDriver, receiver: Receiver) -> None:
    import pyarrow as pa
    from decimal import Decimal

    rows = pa.table({"id": [1, 2, 3], "hr_timestamp": [100, 100, 100], "hr_diff": [1, 1, 1],
                     "name": pa.array(["n"] * 3, pa.large_string()),
                     "amount": pa.array([Decimal("1.5"), Decimal("2.5"), Decimal("3.5")], pa.decimal128(10, 2))})
    runtime = driver.runtime(spec(receiver))
    runtime.open()
    runtime.transact([], {"batch": 0}, [StoreColumns(0, rows=rows)])
    runtime.close()
    assert receiver.accepted() == EXPECTED[:2]


def test_a_refusal_fails_the_commit_with_status_and_body(driver: HostedDriver, receiver: Receiver) -> None:
    receiver.plan = {EXPECTED[0][0]: ["400"]}
    runtime = driver.runtime(spec(receiver))
    runtime.open()
    with pytest.raises(DriverError) as failure:
        runtime.transact(COMMIT_100, {"batch": 0})
    runtime.close()
    message = str(failure.value)
    assert "refused batch sink_h:0-4294967295:100:0 with status 400: 'document 3 lacks a name xxx" in message
    assert f"http://127.0.0.1:{receiver.port}/hooks/in refused" in message
    assert "secret" not in message and len(message) < 400
    assert len(receiver.received) == 1  # not retried


def test_it_gives_up_after_max_attempts(driver: HostedDriver, receiver: Receiver) -> None:
    receiver.always = "503"
    runtime = driver.runtime(spec(receiver, max_attempts=3))
    runtime.open()
    with pytest.raises(DriverError, match="failed batch sink_h:0-4294967295:100:0 3 times, the last with status 503"):
        runtime.transact(COMMIT_100, {"batch": 0})
    runtime.close()
    assert len(receiver.received) == 3


def test_keyed_bindings_are_refused(driver: HostedDriver, receiver: Receiver) -> None:
    keyed = Binding(("t",), ("id",), ("name",), {"id": "BIGINT", "name": "VARCHAR"})
    runtime = driver.runtime(MaterializationSpec("k", (keyed,), config={"url": receiver.url}))
    with pytest.raises(DriverError, match=r"WITH \(DELTA UPDATES = true\)"):
        runtime.validate()
    runtime.close()
    with pytest.raises(DriverError, match="option URL"):
        driver.runtime(MaterializationSpec("k", (BINDING,), config={"url": "ftp://x"})).validate()
