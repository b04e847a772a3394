"""Turning parsed DDL into catalog items."""

from __future__ import annotations

from sqlglot import exp

from headrace.catalog.items import DEFAULT_DATABASE, DEFAULT_SCHEMA, WebhookSource
from headrace.errors import FeatureNotSupported, InternalError
from headrace.sql.ast import CreateWebhookSource
from headrace.sql.parser import parse_statement


def qualified_name(table: exp.Table) -> tuple[str, str, str]:
    """(database, schema, name) of a possibly qualified object name."""
    return (table.catalog or DEFAULT_DATABASE, table.db or DEFAULT_SCHEMA, table.name)


def webhook_source_from_statement(item_id: str, statement: CreateWebhookSource, create_sql: str) -> WebhookSource:
    database, schema, name = qualified_name(statement.this)
    if database != DEFAULT_DATABASE or schema != DEFAULT_SCHEMA:
        raise FeatureNotSupported(f"sources live in {DEFAULT_DATABASE}.{DEFAULT_SCHEMA} for now, not {database}.{schema}")
    idempotent = statement.args.get("idempotent")
    return WebhookSource(
        id=item_id,
        name=name,
        body_format=statement.args["body_format"],
        include_headers=bool(statement.args.get("include_headers")),
        idempotent_expr=idempotent.sql(dialect="postgres") if idempotent is not None else None,
        create_sql=create_sql,
    )


def item_from_create_sql(item_id: str, create_sql: str) -> WebhookSource:
    """Rebuild a catalog item from its stored CREATE statement (catalog load at start)."""
    statement = parse_statement(create_sql)
    if isinstance(statement, CreateWebhookSource):
        return webhook_source_from_statement(item_id, statement, create_sql)
    raise InternalError(f"catalog item {item_id} holds an unknown statement: {create_sql!r}")
