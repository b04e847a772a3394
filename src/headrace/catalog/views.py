"""The MaterializedView catalog item: CREATE MATERIALIZED VIEW <name> AS SELECT ..., as data.

Like a source, a view is persisted as its CREATE statement; its plan (sql/views.py) is compiled from that
statement against the catalog when needed, since it depends on the input relation's columns. `id` names the
view's serving-store table and its materialization, so DROP + CREATE of the same name starts afresh."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.catalog.items import DEFAULT_DATABASE, DEFAULT_SCHEMA


@dataclass(frozen=True, slots=True)
class MaterializedView:
    id: str
    name: str
    create_sql: str
    input_schema: str  # the relation the view reads, by name (resolved again at each compile)
    input_name: str
    schema: str = DEFAULT_SCHEMA
    database: str = DEFAULT_DATABASE

    @property
    def materialization(self) -> str:
        """The materialization (and serving-store table) maintaining this view."""
        return f"view_{self.id}"

    def to_entry(self) -> dict[str, str]:
        """What the catalog file keeps (the statement is the definition; names are for loading in order)."""
        return {"id": self.id, "name": self.name, "create_sql": self.create_sql,
                "input_schema": self.input_schema, "input_name": self.input_name}

    @classmethod
    def from_entry(cls, entry: dict[str, str]) -> MaterializedView:
        return cls(id=entry["id"], name=entry["name"], create_sql=entry["create_sql"],
                   input_schema=entry["input_schema"], input_name=entry["input_name"])
