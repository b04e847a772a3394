"""The serving store's changelog (what SUBSCRIBE reads): written by the serving driver in each commit's transaction."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from headrace.materialize.protocol import FencedOff
from headrace.store.serving import ChangelogCompacted, ServingStore, changelog_table

from .conftest import DriverServer, webhook_doc, webhook_spec

SOURCE = ("headrace_internal", "source_u1")
DELETED = {"_meta": {"op": "d"}}


def changes(store: ServingStore, since: int = 0, path: tuple[str, ...] = SOURCE) -> list[tuple[Any, ...]]:
    """(timestamp, diff, key, body.k) of every change after `since`."""
    batch = store.changes_since(path, since)
    assert batch.columns == ("idempotency_key", "body", "received_at")
    assert [row[:2] for row in batch.rows] == sorted(row[:2] for row in batch.rows)  # by time, retractions first
    return sorted((ts, diff, key, None if body is None else json.loads(body)["k"])
                  for ts, diff, key, body, _ in batch.rows)


def test_inserts_updates_and_deletes_are_recorded_at_their_commit_timestamp(driver_server: DriverServer) -> None:
    store = driver_server.store
    before = int(time.time() * 1000)
    runtime = driver_server.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1)), (0, ["b"], webhook_doc("b", 1))], {"batch_id": 1})
    first = store.latest_timestamp("source_u1")
    assert first is not None and first >= before
    runtime.transact([(0, ["a"], webhook_doc("a", 2)), (0, ["b"], {**webhook_doc("b", 0), **DELETED}),
                      (0, ["never"], {**webhook_doc("never", 0), **DELETED})], {"batch_id": 2})
    second = store.latest_timestamp("source_u1")
    assert second is not None and second > first
    assert changes(store) == [(first, 1, "a", 1), (first, 1, "b", 1),
                              (second, -1, "a", 1), (second, -1, "b", 1), (second, 1, "a", 2)]
    assert changes(store, since=first) == changes(store)[2:]
    assert store.changes_since(SOURCE, 0, upto=first).rows == store.changes_since(SOURCE, 0).rows[:2]
    cursor = store.cursor()
    assert cursor.execute("SELECT idempotency_key FROM headrace_internal.source_u1").fetchall() == [("a",)]
    snapshot = store.snapshot(SOURCE, "source_u1")
    assert snapshot.timestamp == second and [row[0] for row in snapshot.rows] == ["a"]
    runtime.close()


def test_the_changelog_consolidates_to_the_table(driver_server: DriverServer) -> None:
    store = driver_server.store
    runtime = driver_server.runtime(webhook_spec())
    runtime.open()
    for batch_id in range(6):
        documents = [(0, [f"k{i}"], webhook_doc(f"k{i}", batch_id * 10 + i)) for i in range(batch_id, batch_id + 5)]
        if batch_id % 2:
            documents.append((0, [f"k{batch_id - 1}"], {**webhook_doc("x", 0), **DELETED}))
        runtime.transact(documents, {"batch_id": batch_id})
    totals: dict[tuple[Any, ...], int] = {}
    for _, diff, *row in store.changes_since(SOURCE, 0).rows:
        totals[tuple(row)] = totals.get(tuple(row), 0) + diff
    consolidated = sorted(row for row, count in totals.items() if count != 0)
    assert all(count in (0, 1) for count in totals.values())
    cursor = store.cursor()
    table = cursor.execute("SELECT idempotency_key, body::VARCHAR, received_at FROM headrace_internal.source_u1 "
                           "ORDER BY ALL").fetchall()
    assert [(k, json.loads(b), t) for k, b, t in consolidated] == [(k, json.loads(b), t) for k, b, t in table]
    runtime.close()


def test_commit_timestamps_strictly_increase_across_materializations(driver_server: DriverServer) -> None:
    store = driver_server.store
    stamps = []
    runtimes = [driver_server.runtime(webhook_spec(name)) for name in ("m1", "m2")]
    for runtime in runtimes:
        runtime.open()
    for n in range(5):
        for runtime in runtimes:
            runtime.transact([(0, ["k"], webhook_doc("k", n))], {"n": n})
            stamps.append(store.latest_timestamp(runtime.spec.name))
    assert stamps == sorted(set(stamps)) and len(stamps) == 10
    assert [store.next_commit_timestamp() > stamps[-1] for _ in range(3)] == [True] * 3


def test_delta_updates_append_to_the_changelog(driver_server: DriverServer) -> None:
    store = driver_server.store
    runtime = driver_server.runtime(webhook_spec("deltas", delta_updates=True))
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"n": 1})
    runtime.transact([(0, ["a"], webhook_doc("a", 2))], {"n": 2})
    assert [(diff, key, k) for _, diff, key, k in changes(store, path=("headrace_internal", "deltas"))] == [
        (1, "a", 1), (1, "a", 2)]
    runtime.close()


def test_a_fenced_commit_writes_no_changes(driver_server: DriverServer) -> None:
    store = driver_server.store
    zombie = driver_server.runtime(webhook_spec())
    zombie.open()
    successor = driver_server.runtime(webhook_spec())
    successor.open()
    with pytest.raises(FencedOff):
        zombie.transact([(0, ["z"], webhook_doc("z", 1))], {"n": 1})
    assert changes(store) == [] and store.latest_timestamp("source_u1") is None
    successor.close()


def test_compaction_drops_old_changes_and_raises_the_since_frontier(driver_server: DriverServer) -> None:
    store = driver_server.store
    runtime = driver_server.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"n": 1})
    first = store.latest_timestamp("source_u1")
    assert first is not None
    time.sleep(0.01)
    runtime.transact([(0, ["a"], webhook_doc("a", 2))], {"n": 2})
    second = store.latest_timestamp("source_u1")
    assert second is not None
    assert store.changelog_since(SOURCE) == 0
    name = changelog_table(SOURCE).split(".", 1)[1].strip('"')
    assert store.compact_changelogs(retention_ms=1_000, now_ms=second + 1_000) == {name: 1}
    assert store.changelog_since(SOURCE) == second
    assert [(ts, diff) for ts, diff, *_ in store.changes_since(SOURCE, second - 1).rows] == [(second, -1),
                                                                                           (second, 1)]
    with pytest.raises(ChangelogCompacted, match="compacted"):
        store.changes_since(SOURCE, first - 1)
    assert store.compact_changelogs(retention_ms=60_000, now_ms=second) == {name: 0}
    assert store.changelog_since(SOURCE) == second  # the frontier never moves back
    runtime.close()


def test_dropping_a_table_drops_its_changelog(driver_server: DriverServer) -> None:
    store = driver_server.store
    store.apply(webhook_spec().bindings[0])
    store.drop(SOURCE)
    assert store.columns(("headrace_internal", "changes_headrace_internal.source_u1")) is None
    assert store.compact_changelogs() == {}


def test_a_reopened_store_continues_the_clock(tmp_path: Any) -> None:
    store = ServingStore(tmp_path / "s.duckdb")
    cursor = store.cursor()
    future = int(time.time() * 1000) + 3_600_000
    cursor.execute("INSERT INTO headrace_internal.checkpoints VALUES ('m', 0, 1, 1, NULL, ?)", [future])
    cursor.close()
    store.close()
    reopened = ServingStore(tmp_path / "s.duckdb")
    assert reopened.next_commit_timestamp() == future + 1
    reopened.close()
