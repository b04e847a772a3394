"""PostgresServingStore and its driver (drivers/postgres_serving.py) against a real PostgreSQL 15: the layout, the
changelog written in each commit's transaction (stores, deletes, replacements, columnar Stores), snapshots and
changes_since as the DuckDB store returns them, compaction, fencing, and the driver conformance kit."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from headrace.errors import FeatureNotSupported, HeadraceError, InternalError
from headrace.materialize.conformance import run_conformance
from headrace.materialize.conformance.report import FAIL, PASS
from headrace.materialize.conformance.targets import DriverUnderTest
from headrace.materialize.drivers.postgres_serving import PostgresServingConnector, PostgresServingTransactor
from headrace.materialize.hosting import ThreadedDriverServer
from headrace.materialize.protocol import (Apply, Binding, FencedOff, MaterializationSpec, Open, Store, StoreColumns,
                                          Validate, Validated)
from headrace.materialize.runtime import DriverConnection
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ChangelogCompacted, changelog_name

from ..real_servers.postgres import shared_cluster

SOURCE = ("headrace_internal", "source_u1")
WEBHOOK_COLUMNS = {"idempotency_key": "VARCHAR", "body": "JSON", "received_at": "TIMESTAMPTZ"}
DELETED = {"_meta": {"op": "d"}}
_databases = itertools.count()


def webhook_spec(name: str = "source_u1", delta_updates: bool = False) -> MaterializationSpec:
    binding = Binding(("headrace_internal", name), ("idempotency_key",), ("body", "received_at"),
                      dict(WEBHOOK_COLUMNS), delta_updates=delta_updates)
    return MaterializationSpec(name=name, bindings=(binding,))


def webhook_doc(key: str, n: int, received_at: int = 1_700_000_000_000_000) -> dict[str, Any]:
    return {"idempotency_key": key, "body": {"k": n, "pad": "x"}, "received_at": received_at}


@pytest.fixture
def store() -> Iterator[PostgresServingStore]:
    conninfo = shared_cluster().create_database(f"serving_{next(_databases)}")
    serving = PostgresServingStore(conninfo)
    yield serving
    serving.close()


@pytest.fixture
def server(store: PostgresServingStore) -> Iterator[ThreadedDriverServer]:
    hosted = ThreadedDriverServer(lambda _open: PostgresServingTransactor(store), PostgresServingConnector(store))
    yield hosted
    hosted.stop()


def changes(store: PostgresServingStore, since: int = 0, path: tuple[str, ...] = SOURCE) -> list[tuple[Any, ...]]:
    """(timestamp, diff, key, body.k) of every change after `since`."""
    batch = store.changes_since(path, since)
    assert batch.columns == ("idempotency_key", "body", "received_at")
    assert [row[:2] for row in batch.rows] == sorted(row[:2] for row in batch.rows)  # by time, retractions first
    return sorted((ts, diff, key, None if body is None else json.loads(body)["k"])
                  for ts, diff, key, body, _ in batch.rows)


def test_the_layout_and_types_are_postgresql_s(store: PostgresServingStore) -> None:
    binding = Binding(("t",), ("id",), ("name", "doc", "at", "n", "i", "x", "ok", "raw", "price", "day", "local",
                                         "u", "span"),
                      {"id": "BIGINT", "name": "VARCHAR", "doc": "JSON", "at": "TIMESTAMPTZ", "n": "BIGINT",
                       "i": "INTEGER", "x": "DOUBLE", "ok": "BOOLEAN", "raw": "BLOB", "price": "DECIMAL(10,2)",
                       "day": "DATE", "local": "TIMESTAMP", "u": "UUID", "span": "INTERVAL"})
    assert store.apply(binding) == ['created table "public"."t" and its changelog']
    assert store.apply(binding) == []  # idempotent
    with psycopg.connect(store.conninfo) as conn:
        types = dict(conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                                  "WHERE attrelid = 'public.t'::regclass AND attnum > 0").fetchall())
        log = conn.execute("SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = "
                           "'headrace_internal.\"changes_public.t\"'::regclass AND attnum > 0").fetchone()
    assert types == {"id": "bigint", "name": "text", "doc": "jsonb", "at": "timestamp with time zone",
                     "n": "bigint", "i": "integer", "x": "double precision", "ok": "boolean", "raw": "bytea",
                     "price": "numeric(10,2)", "day": "date", "local": "timestamp without time zone", "u": "uuid",
                     "span": "interval"}
    assert log == ("hr_timestamp,hr_diff,id,name,doc,at,n,i,x,ok,raw,price,day,local,u,span",)
    columns = store.columns(("t",))
    assert columns is not None and columns["price"] == ("DECIMAL(10,2)", True) and columns["id"] == ("BIGINT", False)
    with pytest.raises(FeatureNotSupported):
        store.apply(Binding(("bad",), ("id",), ("h",), {"id": "BIGINT", "h": "MAP(VARCHAR, INTEGER)"}))
    with pytest.raises(InternalError, match="type"):
        store.apply(Binding(("t",), ("id",), ("name",), {"id": "BIGINT", "name": "INTEGER"}))
    with pytest.raises(InternalError, match="primary key"):
        store.apply(Binding(("t",), ("id", "n"), ("name",), {"id": "BIGINT", "n": "BIGINT", "name": "VARCHAR"}))


def test_apply_migrates_added_and_dropped_value_columns(store: PostgresServingStore) -> None:
    store.apply(webhook_spec().bindings[0])
    wider = Binding(SOURCE, ("idempotency_key",), ("body", "received_at", "n"), {**WEBHOOK_COLUMNS, "n": "BIGINT"})
    assert store.apply(wider) == [
        "added column 'n' bigint to \"headrace_internal\".\"source_u1\"",
        "added column 'n' to headrace_internal.\"changes_headrace_internal.source_u1\""]
    assert store.apply(wider) == []
    columns = store.columns(SOURCE)
    assert columns is not None and list(columns) == ["idempotency_key", "body", "received_at", "n"]


def test_stores_deletes_and_replacements_reach_the_changelog_at_their_commit(
        server: ThreadedDriverServer, store: PostgresServingStore) -> None:
    before = int(time.time() * 1000)
    runtime = server.runtime(webhook_spec())
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
    snapshot = store.snapshot(SOURCE, "source_u1")
    assert snapshot.timestamp == second and snapshot.columns == ("idempotency_key", "body", "received_at")
    assert snapshot.rows == [("a", '{"k": 2, "pad": "x"}',
                              datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc))]
    assert store.commit_count == 2
    runtime.close()
    # A new runtime resumes from the checkpoint the store holds, and sees the stored document.
    again = server.runtime(webhook_spec())
    assert again.open() == {"batch_id": 2}
    again.close()


def test_the_changelog_consolidates_to_the_table(server: ThreadedDriverServer, store: PostgresServingStore) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    for batch_id in range(6):
        documents = [(0, [f"k{i}"], webhook_doc(f"k{i}", batch_id * 10 + i)) for i in range(batch_id, batch_id + 5)]
        if batch_id % 2:
            documents.append((0, [f"k{batch_id - 1}"], {**webhook_doc("x", 0), **DELETED}))
        runtime.transact(documents, {"batch_id": batch_id})
    totals: dict[tuple[Any, ...], int] = {}
    for _, diff, *row in store.changes_since(SOURCE, 0).rows:
        totals[tuple(row)] = totals.get(tuple(row), 0) + diff
    assert all(count in (0, 1) for count in totals.values())
    consolidated = sorted(row for row, count in totals.items() if count != 0)
    assert consolidated == sorted(store.snapshot(SOURCE, "source_u1").rows)
    runtime.close()


def test_columnar_stores_keep_every_type_and_log_it(server: ThreadedDriverServer, store: PostgresServingStore) -> None:
    types = {"id": "BIGINT", "price": "DECIMAL(10,2)", "day": "DATE", "local": "TIMESTAMP", "u": "UUID",
             "span": "INTERVAL", "raw": "BLOB", "doc": "JSON", "at": "TIMESTAMPTZ"}
    spec = MaterializationSpec("tbl", (Binding(("headrace_internal", "table_t"), ("id",), tuple(types)[1:], types),))
    runtime = server.runtime(spec)
    runtime.open()
    rows = pa.table({"id": pa.array([1, 2], pa.int64()),
                     "price": pa.array([Decimal("12.50"), None], pa.decimal128(10, 2)),
                     "day": pa.array([19_000, None], pa.int32()).cast(pa.date32()),
                     "local": pa.array([1_000_000, None], pa.int64()).cast(pa.timestamp("us")),
                     "u": pa.array(["8c1d0e5e-6a43-4f2b-9d3e-3f0c9f6b1a2d", None]),
                     "span": pa.array([90_000_000, None], pa.int64()).cast(pa.duration("us")),
                     "raw": pa.array([b"\x00\xff", None], pa.binary()),
                     "doc": pa.array(['{"b":1,"a":[true,null]}', None]),
                     "at": pa.array([1_700_000_000_000_000, None], pa.int64())})
    runtime.transact([], {"n": 1}, [StoreColumns(0, rows=rows)])
    updated = rows.slice(0, 1).set_column(1, "price", pa.array([Decimal("13.00")], pa.decimal128(10, 2)))
    deleted = pa.table({"id": pa.array([2], pa.int64())})
    runtime.transact([], {"n": 2}, [StoreColumns(0, updated=updated, deleted=deleted)])
    second = store.latest_timestamp("tbl")
    stored = (1, Decimal("13.00"), datetime.date(2022, 1, 8), datetime.datetime(1970, 1, 1, 0, 0, 1),
              uuid.UUID("8c1d0e5e-6a43-4f2b-9d3e-3f0c9f6b1a2d"), datetime.timedelta(seconds=90), b"\x00\xff",
              '{"a": [true, null], "b": 1}', datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc))
    assert store.snapshot(("headrace_internal", "table_t"), "tbl").rows == [stored]
    logged = store.changes_since(("headrace_internal", "table_t"), 0).rows
    assert sorted((row[0] == second, row[1], row[2], row[3]) for row in logged[2:]) == [
        (True, -1, 1, Decimal("12.50")), (True, -1, 2, None), (True, 1, 1, Decimal("13.00"))]  # (by time and diff only)
    assert logged[-1][2:] == stored
    runtime.close()


def test_a_fenced_commit_writes_no_changes(server: ThreadedDriverServer, store: PostgresServingStore) -> None:
    zombie = server.runtime(webhook_spec())
    zombie.open()
    successor = server.runtime(webhook_spec())
    successor.open()
    with pytest.raises(FencedOff):
        zombie.transact([(0, ["z"], webhook_doc("z", 1))], {"n": 1})
    assert changes(store) == [] and store.latest_timestamp("source_u1") is None
    successor.close()


def test_delta_updates_append_to_the_changelog(server: ThreadedDriverServer, store: PostgresServingStore) -> None:
    runtime = server.runtime(webhook_spec("deltas", delta_updates=True))
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"n": 1})
    runtime.transact([(0, ["a"], webhook_doc("a", 2))], {"n": 2})
    assert [(diff, key, k) for _, diff, key, k in changes(store, path=("headrace_internal", "deltas"))] == [
        (1, "a", 1), (1, "a", 2)]
    runtime.close()


def test_compaction_drops_old_changes_and_raises_the_since_frontier(
        server: ThreadedDriverServer, store: PostgresServingStore) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"n": 1})
    first = store.latest_timestamp("source_u1")
    assert first is not None
    time.sleep(0.01)
    runtime.transact([(0, ["a"], webhook_doc("a", 2))], {"n": 2})
    second = store.latest_timestamp("source_u1")
    assert second is not None
    assert store.changelog_since(SOURCE) == 0
    name = changelog_name(SOURCE)
    assert store.compact_changelogs(retention_ms=1_000, now_ms=second + 1_000) == {name: 1}
    assert store.changelog_since(SOURCE) == second
    assert [(ts, diff) for ts, diff, *_ in store.changes_since(SOURCE, second - 1).rows] == [(second, -1),
                                                                                           (second, 1)]
    with pytest.raises(ChangelogCompacted, match="compacted"):
        store.changes_since(SOURCE, first - 1)
    assert store.compact_changelogs(retention_ms=60_000, now_ms=second) == {name: 0}
    assert store.changelog_since(SOURCE) == second  # the frontier never moves back
    store.drop(SOURCE)
    assert store.columns(("headrace_internal", name)) is None and store.compact_changelogs() == {}
    runtime.close()


def test_commit_timestamps_survive_a_restart(server: ThreadedDriverServer, store: PostgresServingStore) -> None:
    runtime = server.runtime(webhook_spec())
    runtime.open()
    store._last_timestamp = int(time.time() * 1000) + 60_000  # a clock that ran ahead before the restart
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"n": 1})
    committed = store.latest_timestamp("source_u1")
    runtime.close()
    reopened = PostgresServingStore(store.conninfo)
    assert committed is not None and reopened.next_commit_timestamp() > committed
    reopened.close()


_KIT_RENAMES = {"hr_timestamp": "kit_timestamp", "hr_diff": "kit_diff"}  # the kit's delta fields -> allowed names
_KIT_NAMES_BACK = {new: old for old, new in _KIT_RENAMES.items()}


def _renamed(names: dict[str, Any], renames: dict[str, str]) -> dict[str, Any]:
    return {renames.get(name, name): value for name, value in names.items()}


def _renamed_binding(binding: Binding) -> Binding:
    return dataclasses.replace(binding, values=tuple(_KIT_RENAMES.get(v, v) for v in binding.values),
                               column_types=_renamed(binding.column_types, _KIT_RENAMES))


def _renamed_spec(spec: MaterializationSpec | None) -> MaterializationSpec | None:
    return None if spec is None else dataclasses.replace(
        spec, bindings=tuple(_renamed_binding(b) for b in spec.bindings))


class _RenamingConnection:
    """The kit's connection with its delta binding's hr_timestamp / hr_diff fields named kit_timestamp / kit_diff
    both ways (as a user would name such columns for the serving store, which reserves those two names)."""

    def __init__(self, inner: DriverConnection) -> None:
        self._inner = inner

    def send(self, msgs: list[Any]) -> None:
        self._inner.send([self._outgoing(message) for message in msgs])

    @staticmethod
    def _outgoing(message: Any) -> Any:
        if isinstance(message, Validate):
            return dataclasses.replace(message, bindings=tuple(
                dataclasses.replace(b, fields=_renamed(b.fields, _KIT_RENAMES)) for b in message.bindings))
        if isinstance(message, Apply):
            return dataclasses.replace(message, materialization=_renamed_spec(message.materialization),
                                       last_materialization=_renamed_spec(message.last_materialization))
        if isinstance(message, Open):
            return dataclasses.replace(message, spec=_renamed_spec(message.spec))
        if isinstance(message, Store) and message.doc is not None:
            return dataclasses.replace(message, doc=_renamed(message.doc, _KIT_RENAMES))
        if isinstance(message, StoreColumns) and message.rows is not None:
            names = [_KIT_RENAMES.get(n, n) for n in message.rows.column_names]
            return dataclasses.replace(message, rows=message.rows.rename_columns(names))
        return message

    def recv(self) -> Any:
        response = self._inner.recv()
        if isinstance(response, Validated):
            return dataclasses.replace(response, bindings=tuple(
                dataclasses.replace(b, constraints=_renamed(b.constraints, _KIT_NAMES_BACK))
                for b in response.bindings))
        return response

    def close(self) -> None:
        self._inner.close()


class _StoreReader:
    """The kit's oracle for delta-updates bindings: the rows of the store's table, under the kit's names."""

    def __init__(self, store: PostgresServingStore) -> None:
        self._store = store

    def appended(self, materialization: str, resource_path: tuple[str, ...],
                 column_types: dict[str, str]) -> list[dict[str, Any]]:
        snapshot = self._store.snapshot(resource_path, materialization)
        columns = [_KIT_NAMES_BACK.get(name, name) for name in snapshot.columns]
        return [{name: value for name, value in zip(columns, row) if name in column_types} for row in snapshot.rows]


def test_the_driver_passes_the_conformance_kit(store: PostgresServingStore) -> None:
    """Every scenario, 3 being a crash at every phase boundary; the kit's delta binding renamed (_RenamingConnection)
    since the serving store reserves hr_timestamp / hr_diff for its changelogs, as the DuckDB serving driver does."""
    hosted = ThreadedDriverServer(lambda _open: PostgresServingTransactor(store), PostgresServingConnector(store),
                                  thread_name="kit-driver")
    target = DriverUnderTest("postgres-serving", lambda: _RenamingConnection(hosted.connect()), {},
                             "remote store authoritative, fenced", exactly_once=True, fences=True,
                             remote_authoritative=True, reader=_StoreReader(store))
    target._closers.append(hosted.stop)
    try:
        report = run_conformance(target)
    finally:
        target.close()
    assert {r.scenario.split()[0]: r.result for r in report.results} == {
        n: PASS for n in ("1", "2", "3", "4", "5", "6a", "6b")}, report.render()
    restarts = next(r for r in report.results if r.scenario.startswith("3"))
    assert "8 crashes" in restarts.detail and "after StartedCommit: committed" in restarts.detail


def test_the_kit_s_own_delta_fields_are_refused_at_validate(store: PostgresServingStore) -> None:
    hosted = ThreadedDriverServer(lambda _open: PostgresServingTransactor(store), PostgresServingConnector(store))
    target = DriverUnderTest("postgres-serving", hosted.connect, {}, "remote store authoritative, fenced",
                             exactly_once=True, fences=True, remote_authoritative=True, reader=_StoreReader(store))
    target._closers.append(hosted.stop)
    try:
        report = run_conformance(target, ["spec"])
    finally:
        target.close()
    assert [r.result for r in report.results] == [FAIL], report.render()
    assert "field 'hr_timestamp' is selected but FIELD_FORBIDDEN (the name is reserved for the changelog)" in \
        " ".join(report.results[0].detail.split())


def test_row_path_documents_of_the_exact_types(server: ThreadedDriverServer, store: PostgresServingStore) -> None:
    types = {"id": "BIGINT", "price": "DECIMAL(10,2)", "day": "DATE", "span": "INTERVAL", "raw": "BLOB"}
    spec = MaterializationSpec("tbl", (Binding(("t",), ("id",), tuple(types)[1:], types),))
    runtime = server.runtime(spec)
    runtime.open()
    document = {"id": 7, "price": "0.10", "day": "2024-02-29", "span": 86_400_000_001, "raw": "AP8="}
    runtime.transact([(0, [7], document)], {"n": 1})
    runtime.transact([(0, [7], {**document, "price": "0.20"})], {"n": 2})  # Loads the stored document first
    row = (7, Decimal("0.20"), datetime.date(2024, 2, 29), datetime.timedelta(days=1, microseconds=1), b"\x00\xff")
    assert store.snapshot(("t",), "tbl").rows == [row]
    assert [change[1:] for change in store.changes_since(("t",), 0).rows][-1] == (1, *row)
    runtime.close()


def test_source_rows_the_store_refuses_are_quarantined(server: ThreadedDriverServer,
                                                       store: PostgresServingStore) -> None:
    types = {"log_offset": "BIGINT", "body": "JSON", "received_at": "TIMESTAMPTZ"}
    path = ("headrace_internal", "source_q")
    spec = MaterializationSpec("source_q", (Binding(path, ("log_offset",), ("body", "received_at"), types),))
    runtime = server.runtime(spec)
    runtime.open()
    bodies = ['{"a":1}', '{"nul":"\\u0000"}', '{"a":2}', "not json", '{"a":3}']
    rows = pa.table({"log_offset": pa.array(range(5), pa.int64()), "body": pa.array(bodies),
                     "received_at": pa.array([1_700_000_000_000_000 + i for i in range(5)], pa.int64())})
    predicted = [[10, 1_700_000_000_000_010, "22021", "invalid byte sequence for encoding \"UTF8\""]]
    runtime.transact([], {"n": 1, "quarantined": predicted, "quarantined_from": "public.q"},
                     [StoreColumns(0, rows=rows)])
    assert [row[0] for row in store.snapshot(path, "source_q").rows] == [0, 2, 4]
    assert sorted(row[2] for row in store.changes_since(path, 0).rows) == [0, 2, 4]
    with psycopg.connect(store.conninfo) as conn:
        quarantined = conn.execute(
            "SELECT source, log_offset, received_at = timestamptz 'epoch' + (1700000000000000 + log_offset) * "
            "interval '1 microsecond', sqlstate, reason FROM headrace_internal.quarantine ORDER BY log_offset"
        ).fetchall()
    assert [row[:4] for row in quarantined] == [("public.q", 1, True, "22P05"), ("public.q", 3, True, "22P02"),
                                                ("public.q", 10, True, "22021")]
    assert "unsupported Unicode escape sequence" in quarantined[0][4]
    assert "invalid input syntax for type json" in quarantined[1][4]
    runtime.close()


def test_a_name_postgresql_would_truncate_is_refused(store: PostgresServingStore) -> None:
    """A changelog's name is 26 bytes longer than a headrace_internal table's: beyond 63 PostgreSQL truncates."""
    longest = ("headrace_internal", "v" * 37)
    store.apply(Binding(longest, ("id",), (), {"id": "BIGINT"}))
    assert store.columns(longest) is not None
    with pytest.raises(HeadraceError, match="too long") as refused:
        store.apply(Binding(("headrace_internal", "v" * 38), ("id",), (), {"id": "BIGINT"}))
    assert refused.value.sqlstate == "42622" and refused.value.hint == "use a name of at most 37 bytes"
    assert store.columns(("headrace_internal", "v" * 38)) is None
