"""Columnar Stores (protocol.StoreColumns): binary frames on the wire, applied by the real serving driver in the
same commit as the JSON Stores, with their changelog rows; and the ordering rules they share with Store."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import ProtocolViolation
from headrace.materialize.protocol import StoreColumns, from_wire, to_wire
from headrace.materialize.transport import decode_payload, encode_frame

from .conftest import DriverServer, webhook_doc, webhook_spec

SOURCE = ("headrace_internal", "source_u1")


def rows(keys: list[str], n: int, spaced: bool = False) -> pa.Table:
    separator = ", " if spaced else ","
    bodies = [f'{{"k":{n}{separator}"pad": "x"}}' for _ in keys]
    return pa.table({"idempotency_key": pa.array(keys), "body": pa.array(bodies),
                     "received_at": pa.array([1_700_000_000_000_000] * len(keys), pa.int64())})


@given(st.lists(st.text(), max_size=20), st.binary(max_size=64))
def test_binary_frames_round_trip(keys: list[str], blob: bytes) -> None:
    message = StoreColumns(3, rows=pa.table({"k": pa.array(keys, pa.string())}),
                           deleted=pa.table({"b": pa.array([blob], pa.binary())}))
    frame = encode_frame(to_wire(message))
    decoded = from_wire(decode_payload(frame[4:]))
    assert isinstance(decoded, StoreColumns) and decoded.binding == 3 and decoded.updated is None
    assert decoded.rows is not None and decoded.rows.column("k").to_pylist() == keys
    assert decoded.deleted is not None and decoded.deleted.column("b").to_pylist() == [blob]


def test_a_truncated_binary_frame_is_a_protocol_violation() -> None:
    frame = encode_frame(to_wire(StoreColumns(0, rows=rows(["a"], 1))))
    with pytest.raises(ProtocolViolation):
        decode_payload(frame[4:-10])


def test_columnar_stores_commit_with_json_stores_and_their_changelog(driver_server: DriverServer) -> None:
    store = driver_server.store
    runtime = driver_server.runtime(webhook_spec())
    runtime.open()
    runtime.transact([(0, ["j"], webhook_doc("j", 1))], {"batch_id": 1},
                     [StoreColumns(0, rows=rows(["a", "b", "c"], 1, spaced=True))])
    first = store.latest_timestamp("source_u1")
    # deletions need no Load: an absent key ("never") is ignored; updated rows replace in place
    runtime.transact([], {"batch_id": 2},
                     [StoreColumns(0, deleted=pa.table({"idempotency_key": ["b", "never"]}),
                                   updated=rows(["c"], 2))])
    cursor = store.cursor()
    table: dict[str, Any] = dict(cursor.execute(
        "SELECT idempotency_key, CAST(body AS VARCHAR) FROM headrace_internal.source_u1").fetchall())
    assert table == {"j": '{"k":1,"pad":"' + "x" * 50 + '"}', "a": '{"k":1,"pad":"x"}', "c": '{"k":2,"pad":"x"}'}
    changes = store.changes_since(SOURCE, 0).rows
    summary = sorted((ts == first, diff, key, json.loads(body)["k"]) for ts, diff, key, body, _ in changes)
    assert summary == sorted([(True, 1, "j", 1), (True, 1, "a", 1), (True, 1, "b", 1), (True, 1, "c", 1),
                              (False, -1, "b", 1), (False, -1, "c", 1), (False, 1, "c", 2)])
    assert json.loads(cursor.execute("SELECT checkpoint FROM headrace_internal.checkpoints").fetchone()[0]) == \
        {"batch_id": 2}
    runtime.close()


def test_columnar_json_that_is_not_json_fails_the_transaction(driver_server: DriverServer) -> None:
    runtime = driver_server.runtime(webhook_spec())
    runtime.open()
    bad = rows(["a"], 1).set_column(1, "body", pa.array(["{not json"]))
    with pytest.raises(Exception, match="not JSON"):
        runtime.transact([], {"batch_id": 1}, [StoreColumns(0, rows=bad)])
    assert driver_server.store.latest_timestamp("source_u1") is None
