"""The columns of a webhook source in the serving store, and one log record turned into a row.

Materialize's columns plus headrace's own:
    body             jsonb (JSON, JSON ARRAY) | text (TEXT) | bytea (BYTES)
    headers          the included headers (INCLUDE HEADERS [filter]); stored as a JSON object, so
                     SQL reads `headers->>'name'`
    <column>         each INCLUDE HEADER '<h>' AS <column> [BYTES]: text or bytea, NULL when absent
    received_at      timestamptz: when the request arrived (the latest arrival for an idempotent key)
    idempotency_key  text, with IDEMPOTENT

The pipeline calls `row_builder(source)` once per source and the builder once per record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from headrace.catalog.items import WebhookSource

# DuckDB types of the serving-store columns
_BODY_TYPES = {"json": "JSON", "json_array": "JSON", "text": "VARCHAR", "bytes": "BLOB"}

RowBuilder = Callable[[int, "str | None", "dict[str, str] | None", bytes], dict[str, Any]]


def source_columns(source: WebhookSource) -> list[tuple[str, str]]:
    """The source's columns in the serving store, in order (the same as `column_names()`), with
    their DuckDB types."""
    columns = [("body", _BODY_TYPES[source.body_format])]
    if source.include_headers:
        columns.append(("headers", "JSON"))
    columns.extend((c.column, "BLOB" if c.as_bytes else "VARCHAR") for c in source.header_columns)
    columns.append(("received_at", "TIMESTAMPTZ"))
    if source.idempotent_expr is not None:
        columns.append(("idempotency_key", "VARCHAR"))
    return columns


def source_row(source: WebhookSource, received_at_us: int, idempotency_key: str | None,
               headers: dict[str, str] | None, body: bytes) -> dict[str, Any]:
    """One log record as a row: column name -> value (JSON columns as Python values, TIMESTAMPTZ
    as integer microseconds, BLOB as bytes). The per-source builder is made once and cached."""
    cache_key = (source.id, source.create_sql)
    build = _BUILDERS.get(cache_key)
    if build is None:
        if len(_BUILDERS) > 1024:
            _BUILDERS.clear()
        build = _BUILDERS[cache_key] = row_builder(source)
    return build(received_at_us, idempotency_key, headers, body)


_BUILDERS: dict[tuple[str, str], RowBuilder] = {}


def row_builder(source: WebhookSource) -> RowBuilder:
    """A function building rows of `source`, with its per-source decisions taken once."""
    decode_body: Callable[[bytes], Any] = {
        "json": json.loads, "json_array": json.loads, "text": _utf8, "bytes": bytes,
    }[source.body_format]
    include_headers = source.include_headers
    filtered = bool(source.headers_allowed or source.headers_excluded or source.header_columns)
    keeps = source.keeps_header
    header_columns = tuple((c.column, c.header, c.as_bytes) for c in source.header_columns)
    keyed = source.idempotent_expr is not None

    def build(received_at_us: int, idempotency_key: str | None, headers: dict[str, str] | None,
              body: bytes) -> dict[str, Any]:
        row: dict[str, Any] = {"body": decode_body(body)}
        if include_headers:
            present = headers or {}
            # the record may carry headers only an INCLUDE HEADER column wants
            row["headers"] = {k: v for k, v in present.items() if keeps(k)} if filtered else present
        for column, header, as_bytes in header_columns:
            value = headers.get(header) if headers else None
            row[column] = value.encode("utf-8") if as_bytes and value is not None else value
        row["received_at"] = received_at_us
        if keyed:
            row["idempotency_key"] = idempotency_key
        return row

    return build


def _utf8(body: bytes) -> str:
    return body.decode("utf-8")
