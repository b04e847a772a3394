"""How a webhook source is materialized into the serving store: its binding (table, key, columns), and
how a materialized view reading it sees it (`source_relation`).

Shared by the coordinator (which applies it when the source is created) and the pipeline (whose
runtime opens the materialization with it), so both agree on one definition."""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.catalog.items import WebhookSource
from headrace.materialize.protocol import Binding, MaterializationSpec

if TYPE_CHECKING:
    from headrace.sql.views import InputRelation

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


# DuckDB type of a source column -> its PostgreSQL type, for the view compiler.
_PG_TYPES = {"JSON": "jsonb", "VARCHAR": "text", "TIMESTAMPTZ": "timestamptz", "BIGINT": "int8",
             "INTEGER": "int4", "DOUBLE": "float8", "BOOLEAN": "bool", "BLOB": "bytea"}


def source_relation(source: WebhookSource) -> InputRelation:
    """The source as a view's input: its columns with PostgreSQL types, keyed by log offset; append-only
    without IDEMPOTENT (no row is ever replaced). Used by the coordinator (CREATE) and the pipeline (which
    compiles the same plans from the same statements)."""
    from headrace.sql.views import InputRelation

    types = source_binding(source).column_types
    columns = {name: _PG_TYPES.get(types[name].upper(), types[name].lower()) for name in source.column_names()}
    return InputRelation(kind="source", item_id=source.id, name=source.name, columns=columns, key=("log_offset",),
                         append_only=source.idempotent_expr is None)
