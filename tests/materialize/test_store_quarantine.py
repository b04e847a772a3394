"""The serving driver's last line of defence (materialize/drivers/serving.py, store/quarantine.py): a source's rows
that the store itself refuses, whatever the pipeline's rules predicted, are found by bisection, left out and
quarantined in the same transaction, instead of failing the batch at every retry. Rows of other bindings still fail
their transaction. Against the real serving driver, with rows the pipeline's rules would have caught first (a lone
surrogate escape), sent straight to the driver."""

from __future__ import annotations

import pyarrow as pa
import pytest

from headrace.materialize.protocol import Binding, MaterializationSpec, StoreColumns
from headrace.store.quarantine import QUARANTINE_SOURCE_FIELD, quarantine_snapshot, refused_rows

from .conftest import DriverServer

SOURCE = Binding(resource_path=("headrace_internal", "source_q1"), key=("log_offset",), values=("body", "received_at"),
                 column_types={"log_offset": "BIGINT", "body": "JSON", "received_at": "TIMESTAMPTZ"})


def source_rows(bodies: list[str], first_offset: int) -> pa.Table:
    return pa.table({"log_offset": pa.array(range(first_offset, first_offset + len(bodies)), pa.int64()),
                     "body": pa.array(bodies),
                     "received_at": pa.array([1_700_000_000_000_000] * len(bodies), pa.int64())})


def test_rows_the_store_refuses_are_bisected_out_and_quarantined(driver_server: DriverServer) -> None:
    runtime = driver_server.runtime(MaterializationSpec(name="source_q1", bindings=(SOURCE,)))
    runtime.open()
    bodies = [f'{{"n": {i}}}' for i in range(40)]
    bodies[7], bodies[30] = '"\\ud800"', '{"s": "x\\udc00"}'
    runtime.transact([], {"batch_id": 1, QUARANTINE_SOURCE_FIELD: "public.q"},
                     [StoreColumns(0, rows=source_rows(bodies, 0))])
    runtime.transact([], {"batch_id": 2}, [StoreColumns(0, rows=source_rows(['{"n": 40}'], 40))])
    cursor = driver_server.store.cursor()
    try:
        stored = [row[0] for row in cursor.execute("SELECT log_offset FROM headrace_internal.source_q1 ORDER BY 1")
                  .fetchall()]
        assert stored == [i for i in range(41) if i not in (7, 30)]
        listed = quarantine_snapshot(cursor).to_pylist()
    finally:
        cursor.close()
    assert [(r["source"], r["log_offset"], r["sqlstate"]) for r in listed] == [("public.q", 7, "22P02"),
                                                                               ("public.q", 30, "22P02")]
    assert all(r["reason"].startswith("invalid input syntax for type json: ") for r in listed)
    runtime.close()


def test_other_bindings_still_fail_on_what_the_store_refuses(driver_server: DriverServer) -> None:
    view = Binding(resource_path=("headrace_internal", "view_q2"), key=("log_offset",), values=("body",),
                   column_types={"log_offset": "BIGINT", "body": "JSON"})
    runtime = driver_server.runtime(MaterializationSpec(name="source_q2", bindings=(view,)))
    runtime.open()
    with pytest.raises(Exception, match="not JSON"):
        runtime.transact([], {"batch_id": 1}, [StoreColumns(0, rows=source_rows(['"\\ud800"'], 0).drop_columns(
            ["received_at"]))])


def test_bisection_finds_exactly_the_refused_rows() -> None:
    table = pa.table({"v": list(range(100))})
    bad = {3, 4, 63, 99}
    calls = []

    def convert(part: pa.Table) -> None:
        calls.append(part.num_rows)
        if any(v in bad for v in part["v"].to_pylist()):
            raise ValueError(f"refused {part['v'][0]}")

    assert sorted(refused_rows(convert, table, (ValueError,))) == sorted(bad)
    assert len(calls) < 60  # bisection, not one conversion per row
