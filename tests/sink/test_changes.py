"""ChangeReader (sink/changes.py) against a real serving store: what a sink sends equals what its input became.

Every test runs on both serving stores: DuckDB (a tmp file) and PostgreSQL (a fresh database of the shared test
cluster). A keyed relation is written through the store's own serving driver (ServingTransactor or
PostgresServingTransactor: rows, changelog and checkpoint in one transaction, as every materialization and table
commits), while the test keeps a model of the relation's state after each commit. The reader is then
checked against that model: applying its keyed batches to the state as of the position gives the state as of each
batch's `upto`; its delta batches are exactly the per-commit differences of the model; a snapshot is the state as
of its timestamp; batches cut at commit boundaries only, as near `max_changes` as whole commits allow.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.materialize.drivers.postgres_serving import PostgresServingTransactor
from headrace.materialize.drivers.serving import ServingTransactor
from headrace.materialize.protocol import Binding, MaterializationSpec, Open, Store
from headrace.sink.changes import ChangeBatch, ChangeReader, Lag, protocol_intervals
from headrace.sink.inputs import SinkInput, SinkStore
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import INTERNAL_SCHEMA, ChangelogCompacted, ServingStore

from ..real_servers.postgres import new_store_database

Key = int | str
Values = tuple[str | None, int]  # (v, n)
State = dict[Key, Values]
PUT, DELETE, REWRITE = "put", "delete", "rewrite"  # REWRITE: store the key's row again, unchanged
FULL_KEY_RANGE = (0, 0xFFFFFFFF)
SERVING_STORES = ("duckdb", "postgres")
_relation_names = itertools.count()


def new_store(kind: str, directory: Path) -> SinkStore:
    """An empty serving store: DuckDB in `directory`, or PostgreSQL in a fresh database of the shared cluster."""
    if kind == "duckdb":
        return ServingStore(directory / "serving.duckdb", threads=1)
    return PostgresServingStore(new_store_database("sink"))


def stored_rows(store: SinkStore, resource_path: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of a serving-store table as {column: value} (either store)."""
    snapshot = store.snapshot(resource_path, "")
    return [dict(zip(snapshot.columns, row)) for row in snapshot.rows]


@dataclass(frozen=True)
class Commit:
    timestamp: int
    state: State  # the relation after this commit


class KeyedRelation:
    """A relation (k PRIMARY KEY, v VARCHAR, n BIGINT) written through the store's serving driver, with its
    history."""

    def __init__(self, store: SinkStore, key_type: str = "BIGINT", name: str = "rel") -> None:
        self.store = store
        self.name = name
        self.binding = Binding((INTERNAL_SCHEMA, name), ("k",), ("v", "n"),
                               {"k": key_type, "v": "VARCHAR", "n": "BIGINT"})
        self.resource_path = self.binding.resource_path
        store.apply(self.binding)
        self._transactor = ServingTransactor(store) if isinstance(store, ServingStore) \
            else PostgresServingTransactor(store)
        self._transactor.open(Open(MaterializationSpec(name, (self.binding,)), *FULL_KEY_RANGE))
        self.commits: list[Commit] = []
        # The columns in another order than the table's: SinkInput.columns must still put the key first.
        self.input = SinkInput("table", f"public.{name}", self.resource_path, name,
                               "SELECT hr_timestamp, hr_diff, v, n, k FROM __hr_input", ("k",))

    @property
    def state(self) -> State:
        return dict(self.commits[-1].state) if self.commits else {}

    def commit(self, operations: Mapping[Key, tuple[Any, ...]]) -> int:
        """One upstream commit: per key (PUT, v, n), (DELETE,) or (REWRITE,); a DELETE or REWRITE of a key the
        relation lacks is left out (a runtime only stores what it loaded). No operations: a quiet commit."""
        state = self.state
        stores: list[Store] = []
        for key, operation in operations.items():
            if operation[0] == PUT:
                values = (operation[1], operation[2])
                stores.append(Store(0, [key], list(values), None, exists=key in state))
                state[key] = values
            elif key in state and operation[0] == DELETE:
                stores.append(Store(0, [key], [], None, exists=True, delete=True))
                del state[key]
            elif key in state and operation[0] == REWRITE:
                stores.append(Store(0, [key], list(state[key]), None, exists=True))
        if stores:
            self._transactor.store(stores)
        self._transactor.start_commit({"commit": len(self.commits)})
        timestamp = self.store.latest_timestamp(self.name)
        assert timestamp is not None and (not self.commits or timestamp > self.commits[-1].timestamp)
        self.commits.append(Commit(timestamp, state))
        return timestamp

    def state_at(self, timestamp: int) -> State:
        """The relation as of `timestamp`: after its last commit at or before it."""
        state: State = {}
        for commit in self.commits:
            if commit.timestamp <= timestamp:
                state = commit.state
        return dict(state)

    def changes_per_commit(self, after: int, upto: int) -> list[tuple[int, int]]:
        """(commit timestamp, changelog rows) of the commits in (after, upto] that changed anything, in order."""
        counts = Counter(row[0] for row in self.store.changes_since(self.resource_path, after, upto).rows)
        return sorted(counts.items())

    def expected_deltas(self, after: int, upto: int) -> Counter[tuple[int, int, Key, str | None, int]]:
        """(hr_timestamp, hr_diff, k, v, n) of every row each commit in (after, upto] added or removed."""
        expected: Counter[tuple[int, int, Key, str | None, int]] = Counter()
        before = self.state_at(after)
        for commit in self.commits:
            if after < commit.timestamp <= upto:
                old_rows = {(k, *values) for k, values in before.items()}
                new_rows = {(k, *values) for k, values in commit.state.items()}
                expected.update((commit.timestamp, -1, *row) for row in old_rows - new_rows)
                expected.update((commit.timestamp, 1, *row) for row in new_rows - old_rows)
                before = commit.state
        return expected

    def reader(self, delta: bool = False, max_changes: int = 200_000) -> ChangeReader:
        return ChangeReader(self.store, self.input, self.input.columns(self.store), delta, max_changes)

    def close(self) -> None:
        self._transactor.close()


@pytest.fixture(params=SERVING_STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SinkStore]:
    serving = new_store(request.param, tmp_path)
    yield serving
    serving.close()


@pytest.fixture
def relation(store: SinkStore) -> Iterator[KeyedRelation]:
    keyed = KeyedRelation(store)
    yield keyed
    keyed.close()


# ------------------------------------------------------------------------------------------------ helpers


def keyed_rows(table: pa.Table | None) -> State:
    """A batch's rows/updated table as key -> (v, n), each key once."""
    if table is None:
        return {}
    assert table.column_names == ["k", "v", "n"]
    rows = table.to_pylist()
    assert len({row["k"] for row in rows}) == len(rows), "a key twice in one table"
    return {row["k"]: (row["v"], row["n"]) for row in rows}


def deleted_keys(table: pa.Table | None) -> list[Key]:
    if table is None:
        return []
    assert table.column_names == ["k"]
    return [row["k"] for row in table.to_pylist()]


def apply_keyed(target: State, batch: ChangeBatch) -> None:
    """Apply a keyed batch as a driver would, checking Store's `exists` for each key: rows are new to the target,
    updated and deleted keys are held by it; no key appears in two of them."""
    assert batch.delta is None
    rows, updated, deleted = keyed_rows(batch.rows), keyed_rows(batch.updated), deleted_keys(batch.deleted)
    assert all(table is None or table.num_rows for table in (batch.rows, batch.updated, batch.deleted))
    assert len(rows) + len(updated) + len(deleted) == len({*rows, *updated, *deleted}), "a key in two tables"
    for key, values in rows.items():
        assert key not in target, f"new row {key!r} is already in the target"
        target[key] = values
    for key, values in updated.items():
        assert key in target, f"updated {key!r} is not in the target"
        target[key] = values
    for key in deleted:
        assert key in target, f"deleted {key!r} is not in the target"
        del target[key]


def delta_rows(batch: ChangeBatch) -> list[tuple[int, int, Key, str | None, int]]:
    assert batch.delta is not None and batch.rows is None and batch.updated is None and batch.deleted is None
    assert batch.delta.column_names == ["hr_timestamp", "hr_diff", "k", "v", "n"]
    assert batch.delta.schema.field("hr_timestamp").type == pa.int64()
    assert batch.delta.schema.field("hr_diff").type == pa.int32()
    return [(row["hr_timestamp"], row["hr_diff"], row["k"], row["v"], row["n"]) for row in batch.delta.to_pylist()]


def expected_upto(relation: KeyedRelation, after: int, max_changes: int) -> tuple[int, int] | None:
    """Where a batch after `after` must end, and its changelog rows: whole commits, as many as keep the batch at
    most max_changes (the first one in any case); every change to the latest: the latest itself."""
    latest = relation.commits[-1].timestamp
    per_commit = relation.changes_per_commit(after, latest)
    if not per_commit:
        return None
    upto, total = per_commit[0]
    for timestamp, count in per_commit[1:]:
        if total + count > max_changes:
            return upto, total
        upto, total = timestamp, total + count
    return latest, total


def follow_keyed(relation: KeyedRelation, reader: ChangeReader, position: int, target: State,
                 max_changes: int) -> int:
    """next_batch from `position` until nothing is left, applying each batch to `target` (the relation as of
    `position`) and checking it against the model; returns the final position."""
    commit_timestamps = {commit.timestamp for commit in relation.commits}
    for _ in range(len(relation.commits) + 1):
        batch = reader.next_batch(position)
        expected = expected_upto(relation, position, max_changes)
        if batch is None:
            assert expected is None, f"changes after {position} but no batch"
            assert target == relation.state
            return position
        assert expected is not None and (batch.upto, batch.changes) == expected
        assert batch.after == position and not batch.snapshot
        assert batch.upto in commit_timestamps, "a batch must end at an upstream commit"
        apply_keyed(target, batch)
        assert target == relation.state_at(batch.upto)
        position = batch.upto
    raise AssertionError("the reader never caught up")


def follow_delta(relation: KeyedRelation, reader: ChangeReader, position: int,
                 max_changes: int) -> tuple[int, list[tuple[int, int, Key, str | None, int]]]:
    """next_batch from `position` until nothing is left; returns the final position and every change read."""
    read: list[tuple[int, int, Key, str | None, int]] = []
    for _ in range(len(relation.commits) + 1):
        batch = reader.next_batch(position)
        expected = expected_upto(relation, position, max_changes)
        if batch is None:
            assert expected is None
            return position, read
        assert expected is not None and (batch.after, batch.upto, batch.changes) == (position, *expected)
        rows = delta_rows(batch)
        assert all(position < row[0] <= batch.upto and row[1] in (-1, 1) for row in rows)
        assert [row[0] for row in rows] == sorted(row[0] for row in rows), "changes out of commit order"
        assert Counter(rows) == relation.expected_deltas(position, batch.upto)
        read += rows
        position = batch.upto
    raise AssertionError("the reader never caught up")


def summed(changes: list[tuple[int, int, Key, str | None, int]]) -> State:
    """The rows whose hr_diff sums to +1 (and none to anything but 0 or 1)."""
    totals: Counter[tuple[Key, str | None, int]] = Counter()
    for _, diff, *row in changes:
        totals[tuple(row)] += diff  # type: ignore[index]
    assert set(totals.values()) <= {0, 1}
    return {row[0]: (row[1], row[2]) for row, total in totals.items() if total == 1}


# ------------------------------------------------------------------------------------------------ the property

INT_KEYS = st.sampled_from([0, 1, 2, 3, -7, 2**62])
TEXT_KEYS = st.sampled_from(["a", "b", "c", "", "é'\""])
OPERATIONS = st.one_of(
    st.tuples(st.just(PUT), st.sampled_from([None, "x", "y"]), st.sampled_from([0, 1, -(2**63)])),
    st.tuples(st.just(DELETE)), st.tuples(st.just(REWRITE)))


Operations = dict[Key, tuple[Any, ...]]


def commits_of(keys: st.SearchStrategy[Key], min_size: int, max_size: int) -> st.SearchStrategy[list[Operations]]:
    """Upstream commits touching up to 4 of a few keys each (so keys collide across commits); {}: a quiet one."""
    return st.lists(st.dictionaries(keys, OPERATIONS, max_size=4), min_size=min_size, max_size=max_size)


@st.composite
def histories(draw: st.DrawFn) -> tuple[str, list[Operations], list[Operations]]:
    """A key type and two runs of commits: the sink starts reading between them."""
    key_type = draw(st.sampled_from(["BIGINT", "VARCHAR"]))
    keys = INT_KEYS if key_type == "BIGINT" else TEXT_KEYS
    return key_type, draw(commits_of(keys, 1, 7)), draw(commits_of(keys, 0, 4))


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(history=histories(), max_changes=st.sampled_from([1, 2, 3, 5, 200_000]), data=st.data())
def test_batches_applied_in_turn_reproduce_the_relation_at_every_step(
        store: SinkStore, history: tuple[str, list[Operations], list[Operations]], max_changes: int,
        data: st.DataObject) -> None:
    """From a position T (0 or any commit) to the latest commit U, then on as more commits come: keyed batches
    applied to the relation as of T give the relation as of each batch's `upto`, delta batches are exactly the
    changes of the commits they cover; batches end at commits, cut as max_changes says; then snapshots. (One
    store per test, a relation of its own per example.)"""
    key_type, first_run, second_run = history
    relation = KeyedRelation(store, key_type, name=f"rel_{next(_relation_names)}")
    try:
        for operations in first_run:
            relation.commit(operations)
        timestamps = [commit.timestamp for commit in relation.commits]
        latest = timestamps[-1]
        # T: before the first commit (0, the start of the changelog) or any commit; U = the latest commit.
        start = data.draw(st.sampled_from([0, *timestamps]), label="T")
        keyed, delta = relation.reader(max_changes=max_changes), relation.reader(True, max_changes)

        pending = [t for t, _ in relation.changes_per_commit(start, latest)]
        assert keyed.lag(start) == Lag(latest, len(pending), pending[0] if pending else None)
        target = relation.state_at(start)
        keyed_position = follow_keyed(relation, keyed, start, target, max_changes)
        delta_position, changes = follow_delta(relation, delta, start, max_changes)
        assert keyed_position == delta_position
        assert keyed.lag(keyed_position) == Lag(latest, 0, None)
        # The sink keeps following as the relation changes on.
        for operations in second_run:
            relation.commit(operations)
        follow_keyed(relation, keyed, keyed_position, target, max_changes)
        _, more = follow_delta(relation, delta, delta_position, max_changes)
        held_at_start = [(0, 1, k, *values) for k, values in relation.state_at(start).items()]
        assert summed(held_at_start + changes + more) == relation.state

        # A snapshot pinned at any commit is the relation as of that commit, whatever came after.
        pinned = data.draw(st.sampled_from([commit.timestamp for commit in relation.commits]), label="snapshot_at")
        latest = relation.commits[-1].timestamp
        snapshot = keyed.next_batch(None, snapshot_at=pinned)
        assert snapshot is not None and snapshot.snapshot and snapshot.upto == pinned
        assert keyed_rows(snapshot.rows) == relation.state_at(pinned) and snapshot.changes == len(snapshot.rows)
        assert snapshot.updated is None and snapshot.deleted is None
        delta_snapshot = delta.next_batch(None, snapshot_at=pinned)
        assert delta_snapshot is not None and delta_snapshot.upto == pinned
        assert summed(delta_rows(delta_snapshot)) == relation.state_at(pinned)
        assert {row[0] for row in delta_rows(delta_snapshot)} <= {pinned}
        current = keyed.next_batch(None)
        assert current is not None and (current.after, current.upto) == (None, latest)
        assert keyed_rows(current.rows) == relation.state
    finally:
        relation.close()


# ------------------------------------------------------------------------------------------------ examples


def test_a_key_deleted_and_inserted_again_in_the_range_is_an_update_or_a_new_row(relation: KeyedRelation) -> None:
    first = relation.commit({1: (PUT, "a", 1), 2: (PUT, "b", 2), 3: (PUT, "c", 3)})
    second = relation.commit({1: (DELETE,), 4: (PUT, "d", 4)})
    third = relation.commit({1: (PUT, "a2", 10), 4: (DELETE,), 2: (REWRITE,)})
    reader = relation.reader()

    # Held at `first`: key 1 comes back as an update, key 2 (rewritten unchanged) too; key 4 came and went.
    batch = reader.next_batch(first)
    assert batch is not None and (batch.after, batch.upto, batch.changes) == (first, third, 6)
    assert batch.rows is None and batch.deleted is None
    assert keyed_rows(batch.updated) == {1: ("a2", 10), 2: ("b", 2)}
    # Not held at `second`: key 1 is new to the target; key 4 is deleted from it.
    batch = reader.next_batch(second)
    assert batch is not None and (batch.after, batch.upto) == (second, third)
    assert keyed_rows(batch.rows) == {1: ("a2", 10)} and keyed_rows(batch.updated) == {2: ("b", 2)}
    assert deleted_keys(batch.deleted) == [4]
    assert reader.next_batch(third) is None


def test_delta_batches_list_each_change_once_and_an_unchanged_rewrite_cancels(relation: KeyedRelation) -> None:
    first = relation.commit({1: (PUT, "a", 1), 2: (PUT, None, 2)})
    second = relation.commit({1: (PUT, "a", 5), 2: (REWRITE,)})  # key 2: -1/+1 of the same row
    third = relation.commit({1: (DELETE,), 2: (PUT, "b", 2)})
    batch = relation.reader(delta=True).next_batch(0)
    assert batch is not None and (batch.after, batch.upto, batch.changes) == (0, third, 9)
    assert delta_rows(batch) == [(first, 1, 1, "a", 1), (first, 1, 2, None, 2),
                                 (second, -1, 1, "a", 1), (second, 1, 1, "a", 5),
                                 (third, -1, 1, "a", 5), (third, -1, 2, None, 2), (third, 1, 2, "b", 2)]
    assert summed(delta_rows(batch)) == relation.state == {2: ("b", 2)}


def test_a_snapshot_is_the_relation_as_of_its_timestamp(store: SinkStore, relation: KeyedRelation) -> None:
    reader, deltas = relation.reader(), relation.reader(delta=True)
    assert reader.next_batch(None) is None and reader.next_batch(0) is None  # never committed: nothing yet
    first = relation.commit({1: (PUT, "a", 1), 2: (PUT, "b", 2), 3: (PUT, "c", 3)})
    second = relation.commit({1: (PUT, "a2", 1), 2: (DELETE,), 4: (PUT, "d", 4)})
    third = relation.commit({1: (DELETE,), 2: (PUT, "b", 2), 3: (REWRITE,)})

    for at in (first, second):
        snapshot = reader.next_batch(None, snapshot_at=at)
        assert snapshot is not None and (snapshot.after, snapshot.upto, snapshot.snapshot) == (None, at, True)
        assert keyed_rows(snapshot.rows) == relation.state_at(at)
        delta_snapshot = deltas.next_batch(None, snapshot_at=at)
        assert delta_snapshot is not None and delta_snapshot.upto == at
        assert sorted(delta_rows(delta_snapshot)) == sorted((at, 1, k, *v) for k, v in relation.state_at(at).items())
    table = stored_rows(store, relation.resource_path)
    for at in (third, None):
        snapshot = reader.next_batch(None, snapshot_at=at)
        assert snapshot is not None and snapshot.upto == third
        assert keyed_rows(snapshot.rows) == {row["k"]: (row["v"], row["n"]) for row in table} == relation.state


def test_batches_end_at_whole_commits_near_max_changes(relation: KeyedRelation) -> None:
    sizes = [3, 1, 4, 2, 1]  # changelog rows of each commit (inserts: one each)
    stamps = [relation.commit({n * 10 + i: (PUT, "x", i) for i in range(size)}) for n, size in enumerate(sizes)]
    quiet = relation.commit({})
    reader = relation.reader(max_changes=4)
    cuts = []
    position = 0
    while (batch := reader.next_batch(position)) is not None:
        cuts.append((batch.upto, batch.changes))
        position = batch.upto
    # 3+1 fit in 4; 4 alone; 2+1 and the quiet commit after them (every change to the latest).
    assert cuts == [(stamps[1], 4), (stamps[2], 4), (quiet, 3)]
    # A commit larger than max_changes is never split: it is a batch of its own.
    big = relation.commit({100 + i: (PUT, "y", i) for i in range(6)})
    batch = relation.reader(max_changes=4).next_batch(quiet)
    assert batch is not None and (batch.upto, batch.changes) == (big, 6)


def test_lag_counts_the_upstream_commits_not_in_the_target(relation: KeyedRelation) -> None:
    reader = relation.reader()
    assert reader.lag(None) == Lag(None, 0, None) and reader.lag(0) == Lag(None, 0, None)
    first = relation.commit({1: (PUT, "a", 1)})
    second = relation.commit({1: (PUT, "a", 2), 2: (PUT, "b", 2)})
    third = relation.commit({2: (DELETE,)})
    assert reader.lag(None) == Lag(third, 1, third)  # no snapshot yet: one transaction, as old as the latest
    assert reader.lag(0) == Lag(third, 3, first)
    assert reader.lag(first) == Lag(third, 2, second)
    assert reader.lag(third) == Lag(third, 0, None)
    quiet = relation.commit({})  # a commit that changed nothing here is nothing to send
    assert reader.lag(third) == Lag(quiet, 0, None)
    assert reader.next_batch(third) is None


def test_compacted_changes_are_refused(store: SinkStore, relation: KeyedRelation) -> None:
    first = relation.commit({1: (PUT, "a", 1)})
    second = relation.commit({1: (PUT, "a", 2)})
    third = relation.commit({2: (PUT, "b", 1)})
    store.compact_changelogs(retention_ms=0, now_ms=third + 1, holds={})  # keep nothing before `third`'s + 1
    reader = relation.reader()
    with pytest.raises(ChangelogCompacted):
        reader.next_batch(first)
    with pytest.raises(ChangelogCompacted):
        reader.next_batch(None, snapshot_at=second)
    snapshot = reader.next_batch(None)  # the latest rows need no history; its position is the frontier's
    assert snapshot is not None and snapshot.upto == third and keyed_rows(snapshot.rows) == relation.state
    assert reader.next_batch(snapshot.upto) is None


def test_intervals_are_read_as_the_protocols_microseconds_from_either_store(store: SinkStore) -> None:
    """DuckDB's Arrow gives INTERVAL as month_day_nano_interval, which no driver takes: the reader gives int64
    microseconds (1 month = 30 days) from both stores."""
    binding = Binding((INTERNAL_SCHEMA, "spans"), ("k",), ("span",), {"k": "BIGINT", "span": "INTERVAL"})
    store.apply(binding)
    transactor = ServingTransactor(store) if isinstance(store, ServingStore) else PostgresServingTransactor(store)
    transactor.open(Open(MaterializationSpec("spans", (binding,)), *FULL_KEY_RANGE))
    try:
        transactor.store([Store(0, [1], [90_061_000_001], None, exists=False),
                          Store(0, [2], [None], None, exists=False)])
        transactor.start_commit({})
        sink_input = SinkInput("table", "public.spans", binding.resource_path, "spans",
                               "SELECT hr_timestamp, hr_diff, k, span FROM __hr_input", ("k",))
        for delta in (False, True):
            batch = ChangeReader(store, sink_input, sink_input.columns(store), delta).next_batch(None)
            assert batch is not None
            rows = batch.delta if delta else batch.rows
            assert rows is not None and rows.schema.field("span").type == pa.int64()
            assert sorted(zip(rows.column("k").to_pylist(), rows.column("span").to_pylist())) == [
                (1, 90_061_000_001), (2, None)]
    finally:
        transactor.close()
    if isinstance(store, ServingStore):  # months and days as DuckDB holds them, 30 days a month
        with store.cursor() as cursor:
            table = cursor.execute("SELECT INTERVAL '1 month 2 days 3 microseconds' AS s").fetch_arrow_table()
        assert protocol_intervals(table).column("s").to_pylist() == [32 * 86_400_000_000 + 3]
