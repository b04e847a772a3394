"""`headrace_internal.objects` and `headrace_internal.object_dependencies`: every catalog object and what it reads.

    objects                  one row per object
    id                text   catalog id (u<n>; indexes i<n>)
    schema, name      text
    kind              text   source | table | materialized view | sink | index | connection | secret
    owner             text
    materialization   text   source_<id>, table_<id>, view_<id>, sink_<id> (joins headrace_internal.materializations)
    definition        text   its CREATE statement; NULL for secrets, connections and sinks, whose statements may
                             hold a credential (a literal URL with a password, an Authorization header)

    object_dependencies      one row per (object, object it reads)
    id, schema, name, kind                          the object
    referenced_id, referenced_schema, referenced_name, referenced_kind   what it reads: a view its input relation,
                             a sink its relation, connection and secrets, an index its relation, a source the
                             secrets of its CHECK, a connection the secret of its URL"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

OBJECT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "VARCHAR"), ("schema", "VARCHAR"), ("name", "VARCHAR"), ("kind", "VARCHAR"), ("owner", "VARCHAR"),
    ("materialization", "VARCHAR"), ("definition", "VARCHAR"),
)
DEPENDENCY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "VARCHAR"), ("schema", "VARCHAR"), ("name", "VARCHAR"), ("kind", "VARCHAR"),
    ("referenced_id", "VARCHAR"), ("referenced_schema", "VARCHAR"), ("referenced_name", "VARCHAR"),
    ("referenced_kind", "VARCHAR"),
)
_SECRET_HOLDERS = ("sink", "connection", "secret")


class CatalogObjects:
    """`catalog`: catalog/catalog.py's Catalog; `indexes()`: the CREATE INDEX definitions (catalog/indexes.py)."""

    def __init__(self, catalog: Any, indexes: Callable[[], Sequence[Any]] = tuple) -> None:
        self._catalog = catalog
        self._indexes = indexes

    def _objects(self) -> Iterator[tuple[str, Any]]:
        catalog = self._catalog
        yield from (("source", item) for item in catalog.sources())
        yield from (("table", item) for item in catalog.tables())
        yield from (("materialized view", item) for item in catalog.views())
        yield from (("sink", item) for item in catalog.sinks())
        yield from (("connection", item) for item in catalog.connections())
        yield from (("secret", item) for item in catalog.secrets())

    def object_rows(self) -> list[tuple[Any, ...]]:
        rows = []
        for kind, item in self._objects():
            definition = None if kind in _SECRET_HOLDERS else getattr(item, "create_sql", None)
            rows.append((item.id, item.schema, item.name, kind, self._owner(item.id),
                         getattr(item, "materialization", None), definition))
        for index in self._indexes():
            rows.append((index.id, index.schema, index.name, "index", self._owner(index.on_id), None,
                         index.create_sql))
        return sorted(rows, key=lambda row: (row[1], row[2], row[3]))

    def dependency_rows(self) -> list[tuple[Any, ...]]:
        catalog = self._catalog
        relations: dict[tuple[str, str], tuple[str, Any]] = {}
        for kind, item in self._objects():
            if kind in ("source", "table", "materialized view"):
                relations[(item.schema, item.name)] = (kind, item)
        secrets = {secret.name: secret for secret in catalog.secrets()}
        rows: list[tuple[Any, ...]] = []

        def add(kind: str, item: Any, referenced_kind: str, referenced: Any) -> None:
            rows.append((item.id, item.schema, item.name, kind, referenced.id, referenced.schema, referenced.name,
                         referenced_kind))

        def add_secrets(kind: str, item: Any, names: Sequence[str]) -> None:
            for name in dict.fromkeys(names):
                if name in secrets:
                    add(kind, item, "secret", secrets[name])

        for kind, item in self._objects():
            if kind == "materialized view":
                found = relations.get((item.input_schema, item.input_name))
                if found is not None:
                    add(kind, item, *found)
            elif kind == "sink":
                found = relations.get((item.relation_schema, item.relation_name))
                if found is not None:
                    add(kind, item, *found)
                if item.connection is not None:
                    connection = next((c for c in catalog.connections() if c.name == item.connection), None)
                    if connection is not None:
                        add(kind, item, "connection", connection)
                add_secrets(kind, item, item.secret_names())
            elif kind == "source":
                add_secrets(kind, item, item.secret_names())
            elif kind == "connection":
                add_secrets(kind, item, [item.url.name] if hasattr(item.url, "name") else [])
        for index in self._indexes():
            found = relations.get((index.on_schema, index.on_name))
            if found is not None:
                rows.append((index.id, index.schema, index.name, "index", found[1].id, found[1].schema,
                             found[1].name, found[0]))
        return sorted(rows, key=lambda row: (row[1], row[2], row[5], row[6]))

    def _owner(self, item_id: str) -> str | None:
        try:
            return str(self._catalog.owner_of(item_id))
        except (KeyError, AttributeError):
            return None
