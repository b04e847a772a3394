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
    """Idempotent sources are keyed by their idempotency key (the upsert envelope of seed 002);
    the others by the log offset, which is unique per accepted request."""
    key = ("idempotency_key",) if source.idempotent_expr is not None else ("log_offset",)
    values = tuple(column for column in (*source.column_names(), "log_offset") if column not in key)
    columns = (*key, *values)
    return Binding(
        resource_path=("headrace_internal", source.materialization),
        key=key,
        values=values,
        column_types={column: SOURCE_COLUMN_TYPES[column] for column in columns},
    )


def source_materialization(source: WebhookSource) -> MaterializationSpec:
    return MaterializationSpec(name=source.materialization, bindings=(source_binding(source),))
