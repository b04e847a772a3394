"""Catalog items: what a user created, as data. The catalog persists each item's `create_sql`
and rebuilds items from it on start, so a definition has exactly one source of truth."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DATABASE = "headrace"
DEFAULT_SCHEMA = "public"


@dataclass(frozen=True, slots=True)
class WebhookSource:
    """CREATE SOURCE <name> FROM WEBHOOK ...

    `id` is stable for the life of the item ("u1", "u2", ...): it names the source's log directory,
    its Spark checkpoint and its serving-store table, so DROP + CREATE of the same name starts afresh."""

    id: str
    name: str
    body_format: str  # "json" for now; the webhook issue adds text, json array, bytes
    include_headers: bool
    idempotent_expr: str | None  # the IDEMPOTENT expression as PostgreSQL SQL text, or None
    create_sql: str
    schema: str = DEFAULT_SCHEMA
    database: str = DEFAULT_DATABASE

    @property
    def materialization(self) -> str:
        """The name under which the pipeline materializes this source into the serving store."""
        return f"source_{self.id}"

    def column_names(self) -> list[str]:
        """The user-visible columns, in order (see the walking-skeleton issue)."""
        cols = ["body"]
        if self.include_headers:
            cols.append("headers")
        cols.append("received_at")
        if self.idempotent_expr is not None:
            cols.append("idempotency_key")
        return cols
