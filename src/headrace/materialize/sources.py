"""How a webhook source is materialized into the serving store: its binding (table, key, columns).

Shared by the coordinator (which applies it when the source is created) and the pipeline (whose
runtime opens the materialization with it), so both agree on one definition."""

from __future__ import annotations

from headrace.catalog.items import WebhookSource
from headrace.materialize.protocol import Binding, MaterializationSpec

SOURCE_COLUMN_TYPES = {
    "idempotency_key": "VARCHAR",
    "log_offset": "BIGINT",
    "body": "JSON",
    "headers": "JSON",
    "received_at": "TIMESTAMPTZ",
}


def source_binding(source: WebhookSource) -> Binding:
    """Every source is keyed by the log offset of each row (unique and increasing). Idempotency is
    decided at ingest: a row that supersedes an earlier one of the same key (seed 002's upsert)
    reaches the pipeline as a replacement naming the earlier row's offset, which becomes a deletion
    of that key and a store of the new one. So no index on the idempotency key is needed."""
    key = ("log_offset",)
    values = tuple(source.column_names())
    column_types = {"log_offset": SOURCE_COLUMN_TYPES["log_offset"], **_value_types(source)}
    return Binding(
        resource_path=("headrace_internal", source.materialization),
        key=key,
        values=values,
        column_types=column_types,
    )


def _value_types(source: WebhookSource) -> dict[str, str]:
    try:  # the webhook issue's row builder knows the columns of every BODY FORMAT and INCLUDE clause
        from headrace.webhook.rows import source_columns
    except ImportError:
        return {column: SOURCE_COLUMN_TYPES[column] for column in source.column_names()}
    columns = source_columns(source)
    return dict(columns.items() if isinstance(columns, dict) else columns)


def source_materialization(source: WebhookSource) -> MaterializationSpec:
    return MaterializationSpec(name=source.materialization, bindings=(source_binding(source),))
