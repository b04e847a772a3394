"""Serving-store columns of each source kind, and log records turned into rows."""

from __future__ import annotations

from headrace.sql.ddl import item_from_create_sql
from headrace.webhook.rows import source_columns, source_row


def make(clauses: str, fmt: str = "JSON"):  # type: ignore[no-untyped-def]
    return item_from_create_sql("u1", f"CREATE SOURCE s FROM WEBHOOK BODY FORMAT {fmt} {clauses}")


def test_columns_follow_the_clauses_in_column_name_order() -> None:
    full = make("INCLUDE HEADER 'x-sig' AS sig BYTES INCLUDE HEADER 'x-id' AS id INCLUDE HEADERS "
                "IDEMPOTENT (body->>'id')")
    assert source_columns(full) == [("body", "JSON"), ("headers", "JSON"), ("sig", "BLOB"), ("id", "VARCHAR"),
                                    ("received_at", "TIMESTAMPTZ"), ("idempotency_key", "VARCHAR")]
    assert [name for name, _ in source_columns(full)] == full.column_names()
    assert source_columns(make("", "TEXT")) == [("body", "VARCHAR"), ("received_at", "TIMESTAMPTZ")]
    assert source_columns(make("", "BYTES"))[0] == ("body", "BLOB")
    assert source_columns(make("", "JSON ARRAY"))[0] == ("body", "JSON")


def test_rows_per_format() -> None:
    assert source_row(make(""), 5, None, None, b'{"a": [1, "x"]}') == {"body": {"a": [1, "x"]}, "received_at": 5}
    assert source_row(make("", "TEXT"), 5, None, None, "é".encode()) == {"body": "é", "received_at": 5}
    assert source_row(make("", "BYTES"), 5, None, None, b"\x00\xff") == {"body": b"\x00\xff", "received_at": 5}
    keyed = source_row(make("IDEMPOTENT (body->>'id')"), 7, "k", None, b"1")
    assert keyed == {"body": 1, "received_at": 7, "idempotency_key": "k"}


def test_headers_column_is_filtered_and_header_columns_are_nullable() -> None:
    source = make("INCLUDE HEADER 'authorization' AS auth BYTES INCLUDE HEADER 'x-gone' AS gone "
                  "INCLUDE HEADERS (NOT 'authorization')")
    row = source_row(source, 1, None, {"authorization": "Bearer t", "x-a": "1"}, b"{}")
    assert row == {"body": {}, "headers": {"x-a": "1"}, "auth": b"Bearer t", "gone": None, "received_at": 1}
    assert source_row(make("INCLUDE HEADERS"), 1, None, None, b"{}")["headers"] == {}
