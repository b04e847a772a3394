"""Columnar Loads (LoadColumns / LoadedColumns) and columnar documents (materialize/columnar.py): binary frames on the
wire, their ordering rules, and a view binding maintained through the real driver and serving store as columns
storing exactly what the document path stores, changelog included."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from headrace.materialize.columnar import ColumnarDocuments, ColumnarStores
from headrace.materialize.lifecycle import TransactionLifecycle
from headrace.materialize.protocol import (
    Acknowledge,
    Acknowledged,
    Binding,
    Flush,
    Flushed,
    LoadColumns,
    LoadedColumns,
    MaterializationError,
    MaterializationSpec,
    Open,
    Opened,
    ProtocolOrderError,
    from_wire,
    to_wire,
)
from headrace.materialize.reduce import reducer_for_schema
from headrace.materialize.transport import decode_payload, encode_frame
from headrace.pipeline.view_columnar import ViewColumnarReducer, partials_table
from headrace.pipeline.views import _from_doc, _partial_state
from headrace.sql.view_serving import view_binding
from headrace.store.serving import changelog_table
from headrace.sql.views import KEY_FIELD, ROWS_FIELD, STATE_FIELD
from tests.pipeline.test_view_columnar import BENCH_VIEW

from .conftest import DriverServer, webhook_binding


def test_columnar_loads_round_trip_as_binary_frames() -> None:
    keys = pa.table({"hr_key": ['["a"]', '["é\\""]']})
    for message in (LoadColumns(2, keys), LoadedColumns(1, keys)):
        frame = encode_frame(to_wire(message))
        assert frame[4:5] == b"\x00"  # binary, not JSON
        decoded = from_wire(decode_payload(frame[4:]))
        assert type(decoded) is type(message) and decoded.binding == message.binding
        assert (decoded.keys if isinstance(decoded, LoadColumns) else decoded.docs).equals(keys)  # type: ignore[union-attr]


def _opened(delta: bool = False) -> TransactionLifecycle:
    machine = TransactionLifecycle()
    spec = MaterializationSpec("m", (webhook_binding("a"), webhook_binding("b", delta_updates=delta)))
    machine.on_request(Open(spec, 0, 1))
    machine.on_response(Opened(None))
    machine.on_request(Acknowledge())
    return machine


def test_columnar_loads_follow_the_rules_of_loads() -> None:
    keys = pa.table({"idempotency_key": ["k"]})
    machine = _opened()
    machine.on_request(LoadColumns(0, keys))
    with pytest.raises(ProtocolOrderError, match="LoadedColumns must follow Acknowledged or Loaded"):
        machine.on_response(LoadedColumns(0, keys))  # Acknowledged first
    machine.on_response(Acknowledged())
    with pytest.raises(ProtocolOrderError, match="LoadedColumns for binding 1 answers no outstanding"):
        machine.on_response(LoadedColumns(1, keys))
    machine.on_request(Flush())
    machine.on_response(LoadedColumns(0, keys))
    with pytest.raises(ProtocolOrderError, match="answers no outstanding"):
        machine.on_response(LoadedColumns(0, keys))  # one answer per LoadColumns
    machine.on_response(Flushed())
    with pytest.raises(ProtocolOrderError, match="LoadColumns sent for delta-updates binding 1"):
        _opened(delta=True).on_request(LoadColumns(1, keys))
    with pytest.raises(ProtocolOrderError, match="names binding 5"):
        _opened().on_request(LoadColumns(5, keys))


def _grouped(rng: random.Random, groups: int) -> pa.Table:
    """Grouped partials of the bench view (count, sum, min, max, avg, bool_or), some groups retracting."""
    keys = rng.sample([f"g{i}" for i in range(groups)], rng.randint(1, groups))
    rows = [rng.choice([-1, 1, 2, 3]) for _ in keys]
    values = [rng.randint(-50, 50) for _ in keys]
    return pa.table({
        "k0": pa.array(keys), ROWS_FIELD: pa.array(rows, pa.int64()), "a0_n": pa.array(rows, pa.int64()),
        "a1_s": pa.array([v * r for v, r in zip(values, rows)], pa.int64()), "a1_n": pa.array(rows, pa.int64()),
        "a2_v": pa.array(values, pa.int32()), "a3_v": pa.array(values, pa.int32()),
        "a4_s": pa.array([float(v * r) for v, r in zip(values, rows)]), "a4_n": pa.array(rows, pa.int64()),
        "a5_t": pa.array([r if v > 40 else 0 for v, r in zip(values, rows)], pa.int64()),
        "a5_f": pa.array([0 if v > 40 else r for v, r in zip(values, rows)], pa.int64())})


def _documents(grouped: pa.Table) -> list[tuple[int, list[Any], dict[str, Any]]]:
    documents = []
    for row in grouped.to_pylist():
        key = f'["{_from_doc(row["k0"], "text")}"]'
        state = {ROWS_FIELD: row[ROWS_FIELD]}
        for aggregate in BENCH_VIEW.aggregates:
            partial = _partial_state(aggregate, row)
            if partial is not None:
                state[aggregate.field] = partial
        documents.append((0, [key], {KEY_FIELD: key, "k0": row["k0"], STATE_FIELD: state}))
    return documents


def _contents(driver_server: DriverServer, table: str) -> tuple[list[Any], list[Any]]:
    cursor = driver_server.store.cursor()
    rows = cursor.execute(f'SELECT * EXCLUDE (hr_state), CAST(hr_state AS VARCHAR)::JSON::VARCHAR '
                          f'FROM headrace_internal."{table}" ORDER BY hr_key').fetchall()
    changelog = changelog_table(("headrace_internal", table))
    changes = cursor.execute(f"SELECT hr_diff, hr_key, a0, a1, a2, a3, a5 FROM {changelog} "
                             "ORDER BY hr_timestamp, hr_key, hr_diff").fetchall()
    return rows, [change for change in changes]


def test_a_view_reduced_as_columns_stores_what_documents_store(driver_server: DriverServer) -> None:
    by_documents = driver_server.runtime(MaterializationSpec("view_d", (view_binding(BENCH_VIEW, "d"),)),
                                         reducers=[reducer_for_schema(BENCH_VIEW.reduce_schema)],
                                         finalizers=[BENCH_VIEW.finalize])
    by_columns = driver_server.runtime(MaterializationSpec("view_c", (view_binding(BENCH_VIEW, "c"),)))
    by_documents.open()
    by_columns.open()
    reducer = ViewColumnarReducer(BENCH_VIEW)
    rng = random.Random(5)
    for batch_id in range(8):
        grouped = _grouped(rng, groups=12)
        by_documents.transact(_documents(grouped), {"batch_id": batch_id})
        by_columns.transact([], {"batch_id": batch_id},
                            columnar=[ColumnarDocuments(0, partials_table(BENCH_VIEW, grouped), reducer)])
        rows_c, changes_c = _contents(driver_server, "view_c")
        rows_d, changes_d = _contents(driver_server, "view_d")
        assert rows_c == rows_d
        assert len(changes_c) == len(changes_d) and sorted(changes_c, key=str) == sorted(changes_d, key=str)
    assert rows_c, "some groups are left"
    assert by_columns.phase_seconds["load"] >= 0 and "reduce_columns" in by_columns.phase_seconds


def test_columnar_documents_are_refused_for_delta_updates_bindings(driver_server: DriverServer) -> None:
    runtime = driver_server.runtime(MaterializationSpec("m", (webhook_binding("m", delta_updates=True),)))
    runtime.open()
    with pytest.raises(MaterializationError, match="cannot take columnar documents"):
        runtime.transact([], {"batch_id": 1}, columnar=[ColumnarDocuments(
            0, pa.table({"idempotency_key": ["k"]}), lambda partials, loaded: ColumnarStores())])


def test_a_binding_read_by_nobody_else_is_loaded_once_per_transaction(driver_server: DriverServer) -> None:
    """The reduce function sees exactly the stored rows of the requested keys that exist."""
    spec = MaterializationSpec("n", (Binding(("headrace_internal", "n"), ("k",), ("v",), {"k": "VARCHAR", "v": "BIGINT"}),))
    runtime = driver_server.runtime(spec)
    runtime.open()
    seen: list[Any] = []

    def add(partials: pa.Table, loaded: pa.Table | None) -> ColumnarStores:
        seen.append(None if loaded is None else sorted(loaded.to_pylist(), key=str))
        old = {row["k"]: row["v"] for row in (loaded.to_pylist() if loaded is not None else [])}
        new = [{"k": k, "v": old.get(k, 0) + v} for k, v in zip(partials["k"].to_pylist(), partials["v"].to_pylist())]
        return ColumnarStores(rows=pa.Table.from_pylist([r for r in new if r["k"] not in old]) or None,
                              updated=pa.Table.from_pylist([r for r in new if r["k"] in old]) or None)

    runtime.transact([], {"batch_id": 1}, columnar=[ColumnarDocuments(0, pa.table({"k": ["a", "b"], "v": [1, 2]}), add)])
    runtime.transact([], {"batch_id": 2}, columnar=[ColumnarDocuments(0, pa.table({"k": ["b", "c"], "v": [5, 7]}), add)])
    assert seen == [[], [{"k": "b", "v": 2}]]  # the driver answers every LoadColumns, maybe with no rows
    assert sorted(driver_server.store.cursor().execute("SELECT k, v FROM headrace_internal.n").fetchall()) == \
        [("a", 1), ("b", 7), ("c", 7)]
