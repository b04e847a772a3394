"""The durable catalog: the CREATE statement of every source and the name of every secret, in one
small file replaced atomically. Secret values live in the secret store beside it (secrets.json).

Sources are rebuilt by re-parsing their `create_sql` at start (like Materialize's catalog), so the
statement text is the single source of truth for a definition. Every source the catalog hands
out carries a `secret_lookup` reading the current value of a secret by name, so ALTER SECRET
takes effect at the next request without re-creating anything."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from headrace.catalog.items import DEFAULT_SCHEMA, Secret, WebhookSource
from headrace.catalog.secrets import SecretStore
from headrace.catalog.sinks import Connection, Sink
from headrace.catalog.tables import Table
from headrace.catalog.views import MaterializedView
from headrace.durable import replace_file_durably

CATALOG_FILE = "catalog.json"
FORMAT_VERSION = 1

# Builds an item from its stored statement (the SQL layer knows how): (id, create_sql) -> item.
ItemBuilder = Callable[[str, str], WebhookSource]


class Catalog:
    def __init__(self, data_dir: Path, build_item: ItemBuilder, *, secrets: SecretStore | None = None) -> None:
        self._path = data_dir / CATALOG_FILE
        self._lock = threading.Lock()
        # Bumped by every change: plan caches key on it instead of rebuilding a fingerprint of every item.
        self.generation = 0
        self._next_id = 1
        self._items: dict[str, WebhookSource] = {}
        self._secrets: dict[str, Secret] = {}
        self._views: dict[str, MaterializedView] = {}  # CREATE MATERIALIZED VIEW (coordinator/views.py)
        self._tables: dict[str, Table] = {}  # CREATE TABLE (coordinator/tables.py), rebuilt from create_sql
        self._connections: dict[str, Connection] = {}  # CREATE CONNECTION (coordinator/sinks.py)
        self._sinks: dict[str, Sink] = {}  # CREATE SINK (coordinator/sinks.py, sink/)
        self.secret_values = secrets if secrets is not None else SecretStore(data_dir)
        if self._path.exists():
            stored = json.loads(self._path.read_text())
            self._next_id = int(stored["next_id"])
            for entry in stored.get("secrets", ()):
                secret = Secret(id=entry["id"], name=entry["name"], schema=entry.get("schema", DEFAULT_SCHEMA))
                self._secrets[secret.id] = secret
            for entry in stored["items"]:
                item = self._with_lookup(build_item(entry["id"], entry["create_sql"]))
                self._items[item.id] = item
            for entry in stored.get("views", ()):
                view = MaterializedView.from_entry(entry)
                self._views[view.id] = view
            for entry in stored.get("tables", ()):
                from headrace.sql.table_statements import table_from_create_sql  # sql imports catalog

                table = table_from_create_sql(entry["id"], entry["create_sql"])
                self._tables[table.id] = table
            if stored.get("connections") or stored.get("sinks"):
                from headrace.sql.sink_statements import connection_from_create_sql, sink_from_create_sql

                for entry in stored.get("connections", ()):
                    connection = connection_from_create_sql(entry["id"], entry["create_sql"])
                    self._connections[connection.id] = connection
                for entry in stored.get("sinks", ()):
                    sink = sink_from_create_sql(entry["id"], entry["create_sql"])
                    self._sinks[sink.id] = sink
        self.secret_values.retain(set(self._secrets))

    def allocate_id(self) -> str:
        with self._lock:
            item_id = f"u{self._next_id}"
            self._next_id += 1
            return item_id

    # ---- sources --------------------------------------------------------------------------------
    def sources(self) -> list[WebhookSource]:
        return sorted(self._items.values(), key=lambda item: int(item.id[1:]))

    def find(self, schema: str, name: str) -> WebhookSource | None:
        for item in self._items.values():
            if item.schema == schema and item.name == name:
                return item
        return None

    def add(self, item: WebhookSource) -> WebhookSource:
        """Store (or replace, by id: ALTER SOURCE) a source; returns it as the catalog hands it out."""
        item = self._with_lookup(item)
        with self._lock:
            self._put(self._items, item.id, item)
        return item

    def remove(self, item_id: str) -> None:
        with self._lock:
            self._put(self._items, item_id, None)

    def _with_lookup(self, item: WebhookSource) -> WebhookSource:
        return item if item.secret_lookup is not None else replace(item, secret_lookup=self.secret_value)

    # ---- materialized views ---------------------------------------------------------------------
    def views(self) -> list[MaterializedView]:
        return sorted(self._views.values(), key=lambda item: int(item.id[1:]))

    def find_view(self, schema: str, name: str) -> MaterializedView | None:
        return next((v for v in self._views.values() if v.schema == schema and v.name == name), None)

    def add_view(self, view: MaterializedView) -> None:
        with self._lock:
            self._put(self._views, view.id, view)

    def root_materialization(self, view: MaterializedView) -> str:
        """The materialization whose transactions maintain `view`, and whose commit timestamps are its own: that
        of the source or table at the root of its chain of inputs (views are bindings of their root's)."""
        seen: set[str] = set()
        current = view
        while current.id not in seen:
            seen.add(current.id)
            source = self.find(current.input_schema, current.input_name)
            if source is not None:
                return source.materialization
            table = self.find_table(current.input_schema, current.input_name)
            if table is not None:
                return table.materialization
            upstream = self.find_view(current.input_schema, current.input_name)
            if upstream is None:
                break
            current = upstream
        return view.materialization

    def remove_view(self, view_id: str) -> None:
        with self._lock:
            self._put(self._views, view_id, None)

    # ---- tables ---------------------------------------------------------------------------------
    def tables(self) -> list[Table]:
        return sorted(self._tables.values(), key=lambda item: int(item.id[1:]))

    def find_table(self, schema: str, name: str) -> Table | None:
        return next((t for t in self._tables.values() if t.schema == schema and t.name == name), None)

    def add_table(self, table: Table) -> None:
        with self._lock:
            self._put(self._tables, table.id, table)

    def remove_table(self, table_id: str) -> None:
        with self._lock:
            self._put(self._tables, table_id, None)

    # ---- connections and sinks -------------------------------------------------------------------
    def connections(self) -> list[Connection]:
        return sorted(self._connections.values(), key=lambda item: int(item.id[1:]))

    def find_connection(self, schema: str, name: str) -> Connection | None:
        return next((c for c in self._connections.values() if c.schema == schema and c.name == name), None)

    def add_connection(self, connection: Connection) -> None:
        with self._lock:
            self._put(self._connections, connection.id, connection)

    def remove_connection(self, connection_id: str) -> None:
        with self._lock:
            self._put(self._connections, connection_id, None)

    def sinks(self) -> list[Sink]:
        return sorted(self._sinks.values(), key=lambda item: int(item.id[1:]))

    def find_sink(self, schema: str, name: str) -> Sink | None:
        return next((s for s in self._sinks.values() if s.schema == schema and s.name == name), None)

    def kind_of_name(self, schema: str, name: str) -> str | None:
        """What holds this name ("source", "table", "materialized view", "sink"), None if it is free: sources, tables,
        views and sinks share one namespace per schema, as in Materialize."""
        for kind, found in (("source", self.find), ("table", self.find_table), ("materialized view", self.find_view),
                            ("sink", self.find_sink)):
            if found(schema, name) is not None:
                return kind
        return None

    def add_sink(self, sink: Sink) -> None:
        with self._lock:
            self._put(self._sinks, sink.id, sink)

    def remove_sink(self, sink_id: str) -> None:
        with self._lock:
            self._put(self._sinks, sink_id, None)

    # ---- secrets --------------------------------------------------------------------------------
    def secrets(self) -> list[Secret]:
        return sorted(self._secrets.values(), key=lambda item: int(item.id[1:]))

    def find_secret(self, schema: str, name: str) -> Secret | None:
        for secret in self._secrets.values():
            if secret.schema == schema and secret.name == name:
                return secret
        return None

    def add_secret(self, secret: Secret, value: bytes) -> None:
        """The value first: a crash in between leaves an unnamed value, forgotten at the next start."""
        with self._lock:
            self.secret_values.put(secret.id, value)
            self._put(self._secrets, secret.id, secret)

    def set_secret_value(self, secret: Secret, value: bytes) -> None:
        self.secret_values.put(secret.id, value)

    def remove_secret(self, secret_id: str) -> None:
        """The name first: a crash in between leaves an unnamed value, forgotten at the next start."""
        with self._lock:
            self._put(self._secrets, secret_id, None)
            self.secret_values.delete(secret_id)

    def secret_value(self, name: str) -> bytes | None:
        """The value of secret `name` (optionally schema-qualified), or None."""
        schema, _, bare = name.rpartition(".")
        secret = self.find_secret(schema.rpartition(".")[2] or DEFAULT_SCHEMA, bare)
        return None if secret is None else self.secret_values.get(secret.id)

    def sources_using_secret(self, secret: Secret) -> list[WebhookSource]:
        return [source for source in self.sources()
                if any(name.rpartition(".")[2] == secret.name for name in source.secret_names())]

    # ---- durability -----------------------------------------------------------------------------
    def _put(self, items: dict[str, Any], key: str, item: Any | None) -> None:
        """Set (None: remove) one entry and persist; if the write fails (disk full), the in-memory catalog is
        put back as it was, so what clients see matches what is on disk and the statement can simply be retried."""
        had, previous = key in items, items.get(key)
        if item is None:
            items.pop(key, None)
        else:
            items[key] = item
        try:
            self._persist()
        except BaseException:
            if had:
                items[key] = previous
            else:
                items.pop(key, None)
            raise

    def _persist(self) -> None:
        """Write-fsync-rename-fsync: after a crash the catalog is either the old or the new one."""
        self.generation += 1  # first: a failed write still leaves the in-memory catalog changed
        document = {
            "format": FORMAT_VERSION,
            "next_id": self._next_id,
            "items": [{"id": item.id, "create_sql": item.create_sql} for item in self.sources()],
            "secrets": [{"id": secret.id, "name": secret.name, "schema": secret.schema} for secret in self.secrets()],
            "views": [view.to_entry() for view in self.views()],
            "tables": [table.to_entry() for table in self.tables()],
            "connections": [connection.to_entry() for connection in self.connections()],
            "sinks": [sink.to_entry() for sink in self.sinks()],
        }
        replace_file_durably(self._path, json.dumps(document, indent=1).encode())
