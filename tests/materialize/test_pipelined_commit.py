"""Runtime.transact(wait_for_commit=False): the driver commits while the caller prepares the next transaction,
which awaits StartedCommit first; an error of that commit surfaces there; close() awaits a commit in flight."""

from __future__ import annotations

from typing import Any

import pytest

from headrace.materialize.protocol import FencedOff, MaterializationError

from .conftest import DriverServer, webhook_doc, webhook_spec


def _keys(driver_server: DriverServer) -> list[Any]:
    return [row[0] for row in driver_server.store.cursor().execute(
        "SELECT idempotency_key FROM headrace_internal.source_u1 ORDER BY 1").fetchall()]


def test_transactions_pipelined_on_the_commit_all_land(driver_server: DriverServer) -> None:
    runtime = driver_server.runtime(webhook_spec())
    runtime.open()
    for batch_id in range(5):
        runtime.transact([(0, [f"k{batch_id}"], webhook_doc(f"k{batch_id}", batch_id))], {"batch_id": batch_id},
                         wait_for_commit=False)
        assert runtime.committed_transactions == batch_id  # the previous one completed at this one's start
    runtime.finish_commit()
    assert runtime.committed_transactions == 5
    assert _keys(driver_server) == [f"k{i}" for i in range(5)]
    runtime.close()
    assert driver_server.runtime(webhook_spec()).open() == {"batch_id": 4}


def test_close_awaits_a_commit_in_flight(driver_server: DriverServer) -> None:
    runtime = driver_server.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 1}, wait_for_commit=False)
    runtime.close()
    assert driver_server.runtime(webhook_spec()).open() == {"batch_id": 1}
    assert _keys(driver_server) == ["a"]


def test_a_failed_commit_in_flight_fails_the_next_transaction(driver_server: DriverServer) -> None:
    zombie = driver_server.runtime(webhook_spec())
    zombie.open()
    zombie.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 1})
    successor = driver_server.runtime(webhook_spec())
    successor.open()  # fences the zombie off
    zombie.transact([(0, ["z"], webhook_doc("z", 1))], {"batch_id": 2}, wait_for_commit=False)  # fails at the driver
    with pytest.raises(FencedOff, match="fenced off"):
        zombie.transact([], {"batch_id": 3})
    with pytest.raises(MaterializationError, match="unusable"):
        zombie.finish_commit()
    assert _keys(driver_server) == ["a"]
