"""Quarantine (pipeline/quarantine.py, store/quarantine.py, pipeline/status.py) without Spark: which log records the
store refuses, their record in the serving store (idempotent by source and offset, inside the caller's transaction),
and the status report's states."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from headrace.catalog.items import WebhookSource
from headrace.pipeline.log_source import ARROW_SCHEMA
from headrace.pipeline.quarantine import refused_records, without_records
from headrace.pipeline.status import PipelineStatus, one_line_error, retry_delay_s, status_row
from headrace.sql.ddl import item_from_create_sql
from headrace.store.quarantine import QUARANTINE_FIELD, QUARANTINE_SOURCE_FIELD, ensure_quarantine_table, \
    quarantine_snapshot, record_quarantined
from headrace.store.serving import ServingStore


def source(fmt: str = "JSON", clauses: str = "") -> WebhookSource:
    return item_from_create_sql("u1", f"CREATE SOURCE s FROM WEBHOOK BODY FORMAT {fmt} {clauses}")


def batch(bodies: list[bytes], headers: list[str | None] | None = None,
          keys: list[str | None] | None = None) -> pa.Table:
    count = len(bodies)
    return pa.table({"log_offset": [i * 100 for i in range(count)], "next_offset": [i * 100 + 50 for i in range(count)],
                     "prev_offset": [None] * count, "received_at": [1_700_000_000_000_000 + i for i in range(count)],
                     "idempotency_key": keys or [None] * count, "headers": headers or [None] * count,
                     "body": bodies}, schema=ARROW_SCHEMA)


def test_json_records_the_store_refuses() -> None:
    table = batch([b'{"a": 1}', rb'"\ud800"', rb'{"s": "\\u0000"}', rb'{"n": "\u0000"}', rb'"\ud83d\ude00"'])
    refused = refused_records(source(), table)
    assert [(r.log_offset, r.refusal.sqlstate) for r in refused] == [(100, "22P02"), (300, "22P05")]
    assert refused[0].received_at_us == 1_700_000_000_000_001
    assert without_records(table, refused)["log_offset"].to_pylist() == [0, 200, 400]


def test_text_headers_and_keys() -> None:
    table = batch([b"ok", b"a\x00b", "caf\u00e9".encode(), b"\xed\xa0\x80", b"k", b"h"],
                  headers=[None, None, None, None, None, '{"x":"\\u0000"}'],
                  keys=[None, None, None, None, "a\x00", None])
    refused = refused_records(source("TEXT", "INCLUDE HEADERS IDEMPOTENT (body)"), table)
    assert [(r.log_offset, r.refusal.sqlstate) for r in refused] == [(100, "22021"), (300, "22021"), (400, "22021"),
                                                                      (500, "22P05")]
    assert "0xed 0xa0 0x80" in refused[1].refusal.message
    assert refused_records(source("BYTES"), batch([b"\x00\xff"])) == []
    assert refused_records(source(), batch([])) == []


def test_recorded_once_in_the_callers_transaction(tmp_path: Path) -> None:
    store = ServingStore(tmp_path / "store.duckdb")
    try:
        cursor = store.cursor()
        assert quarantine_snapshot(cursor).num_rows == 0  # never created yet: an empty relation
        ensure_quarantine_table(cursor)
        refused = refused_records(source(), batch([b"1", rb'"\udc00"']))
        checkpoint = {"batch_id": 3, QUARANTINE_FIELD: [r.as_checkpoint_entry() for r in refused],
                      QUARANTINE_SOURCE_FIELD: "public.s"}
        cursor.begin()
        record_quarantined(cursor, "source_u1", checkpoint)
        cursor.rollback()  # the batch did not commit: nothing recorded
        assert quarantine_snapshot(cursor).num_rows == 0
        for _ in range(2):  # a replay records it once
            cursor.begin()
            record_quarantined(cursor, "source_u1", checkpoint)
            cursor.commit()
        rows = quarantine_snapshot(cursor).to_pylist()
        assert [(r["source"], r["materialization"], r["log_offset"], r["sqlstate"]) for r in rows] == \
            [("public.s", "source_u1", 100, "22P02")]
        assert "Unicode low surrogate must follow a high surrogate." in rows[0]["reason"]
        assert record_quarantined(cursor, "source_u1", {"batch_id": 4}) == 0
        cursor.close()
    finally:
        store.close()


def test_status_states() -> None:
    assert status_row("public.s", "source_u1", 0, None, None, None, True)["state"] == "running"
    assert status_row("public.s", "source_u1", 0, None, None, None, False)["state"] == "starting"
    assert status_row("public.s", "source_u1", 1, "boom", 10.0, 5.0, True)["state"] == "failing"
    assert status_row("public.s", "source_u1", 1, "boom", 10.0, 12.0, True)["state"] == "running"
    assert status_row("public.s", "source_u1", 1, "boom", 10.0, None, False)["state"] == "failing"
    status = PipelineStatus()
    status.update([status_row("public.s", "source_u1", 1, "boom", 10.0, 12.0, True)])
    # then: next_retry_at (only while failing), and the micro-batch figures (tests/observe/test_observe_units.py)
    assert status.rows()[0][:8] == ("public.s", "source_u1", "running", 1, "boom", 10_000_000, 12_000_000, None)
    failing = status_row("public.s", "source_u1", 2, "boom", 10.0, 5.0, True)
    assert failing["next_retry_at"] == 10.0 + retry_delay_s(2) == 12.0


def test_one_line_error_of_a_spark_query() -> None:
    text = ("org.apache.spark.sql.streaming.StreamingQueryException: [FOREACH_BATCH_USER_FUNCTION_ERROR] ...\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            "headrace.materialize.runtime.DriverError: materialization driver failed: bad\n"
            "=== Streaming Query ===")
    assert one_line_error(text) == "DriverError: materialization driver failed: bad"
    assert one_line_error("x" * 2000 + "\nmore") == "x" * 500
    assert one_line_error(None) is None
