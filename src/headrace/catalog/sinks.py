"""Connections and sinks as catalog items (CREATE CONNECTION, CREATE SINK), as data.

Like every item, both are persisted as their CREATE statement and rebuilt from it at start
(sql/sink_statements.py), so the statement text is the one source of truth. A secret is named, never
copied: its value is read when the sink starts (sink/configs.py), so ALTER SECRET takes effect at the
next start of each sink using it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headrace.catalog.items import DEFAULT_DATABASE, DEFAULT_SCHEMA


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A value given as SECRET <name>: resolved only when a sink starts."""

    name: str


# An option's value: a literal, a secret to resolve, or (HEADERS) a list of (name, value) pairs.
OptionValue = str | int | float | bool | SecretRef | tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Connection:
    """CREATE CONNECTION <name> TO POSTGRES | REDIS (URL = ...)."""

    id: str
    name: str
    driver: str  # "postgres" | "redis"
    url: str | SecretRef = field(repr=False)  # a literal URL may hold a password
    create_sql: str = field(repr=False)
    schema: str = DEFAULT_SCHEMA
    database: str = DEFAULT_DATABASE
    kind: str = "connection"

    def to_entry(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "create_sql": self.create_sql}


@dataclass(frozen=True, slots=True)
class Sink:
    """CREATE SINK <name> FROM <relation> INTO <driver> (...) [WITH (...)].

    `id` names the sink's materialization (`sink_<id>`) and its recovery log, so DROP + CREATE of the same name
    starts afresh. `options` holds the driver's options by lower-case snake name (table, key_prefix, path, url,
    headers, command, address, config, ...), checked against the driver when the statement was parsed."""

    id: str
    name: str
    relation_schema: str
    relation_name: str
    driver: str  # "postgres" | "redis" | "parquet" | "http" | "external"
    options: dict[str, OptionValue] = field(repr=False)  # a literal URL or header may hold a credential
    create_sql: str = field(repr=False)
    delta_updates: bool = False
    at_least_once: bool = False  # WITH (AT LEAST ONCE): the REDIS opt-in for appended delta updates
    schema: str = DEFAULT_SCHEMA
    database: str = DEFAULT_DATABASE
    kind: str = "sink"

    @property
    def materialization(self) -> str:
        return f"sink_{self.id}"

    @property
    def connection(self) -> str | None:
        value = self.options.get("connection")
        return value if isinstance(value, str) else None

    def secret_names(self) -> list[str]:
        names = [value.name for value in self.options.values() if isinstance(value, SecretRef)]
        for value in self.options.values():
            if isinstance(value, tuple):
                names += [item.name for _, item in value if isinstance(item, SecretRef)]
        return names

    def to_entry(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "create_sql": self.create_sql}
