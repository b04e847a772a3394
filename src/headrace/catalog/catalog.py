"""The durable catalog: the CREATE statement of every source and the name of every secret, in one
small file replaced atomically. Secret values live in the secret store beside it (secrets.json).

Sources are rebuilt by re-parsing their `create_sql` at start (like Materialize's catalog), so the
statement text is the single source of truth for a definition. Every source the catalog hands
out carries a `secret_lookup` reading the current value of a secret by name, so ALTER SECRET
takes effect at the next request without re-creating anything.

Each item's owner and ACL (catalog/privileges.py) are kept beside it by item id, and the ACLs of schema public
and of the database: an item without a recorded owner (a catalog written before privileges existed) is owned by
the bootstrap superuser, and an ACL never changed is the default (None)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path
from typing import Any

from headrace.catalog.items import DEFAULT_SCHEMA, Secret, WebhookSource
from headrace.catalog.privileges import Acl, acl_from_entry, acl_text
from headrace.catalog.roles import BOOTSTRAP_SUPERUSER
from headrace.catalog.secrets import SecretStore
from headrace.catalog.sinks import Connection, Sink
from headrace.catalog.tables import Table
from headrace.catalog.views import MaterializedView
from headrace.durable import replace_file_durably

CATALOG_FILE = "catalog.json"
FORMAT_VERSION = 1

# The role executing the current statement (set by the coordinator): it owns the items the statement creates.
CREATING_ROLE: ContextVar[str | None] = ContextVar("headrace_creating_role", default=None)

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
        self._owners: dict[str, str] = {}  # item id -> owning role (absent: the bootstrap superuser)
        self._acls: dict[str, Acl] = {}  # item id -> ACL (absent: the default, catalog/privileges.py)
        self.schema_acl: Acl | None = None  # schema public
        self.database_acl: Acl | None = None
        self.secret_values = secrets if secrets is not None else SecretStore(data_dir)
        if self._path.exists():
            stored = json.loads(self._path.read_text())
            self._next_id = int(stored["next_id"])
            for item_id, entry in stored.get("privileges", {}).items():
                self._owners[item_id] = entry["owner"]
                acl = acl_from_entry(entry.get("acl"))
                if acl is not None:
                    self._acls[item_id] = acl
            self.schema_acl = acl_from_entry(stored.get("schema_acl"))
            self.database_acl = acl_from_entry(stored.get("database_acl"))
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

    def add(self, item: WebhookSource, owner: str | None = None) -> WebhookSource:
        """Store (or replace, by id: ALTER SOURCE) a source; returns it as the catalog hands it out."""
        item = self._with_lookup(item)
        with self._lock:
            self._put(self._items, item.id, item, new_owner=item.id not in self._items, owner=owner)
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

    def add_view(self, view: MaterializedView, owner: str | None = None) -> None:
        with self._lock:
            self._put(self._views, view.id, view, new_owner=True, owner=owner)

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

    def add_table(self, table: Table, owner: str | None = None) -> None:
        with self._lock:
            self._put(self._tables, table.id, table, new_owner=True, owner=owner)

    def remove_table(self, table_id: str) -> None:
        with self._lock:
            self._put(self._tables, table_id, None)

    # ---- connections and sinks -------------------------------------------------------------------
    def connections(self) -> list[Connection]:
        return sorted(self._connections.values(), key=lambda item: int(item.id[1:]))

    def find_connection(self, schema: str, name: str) -> Connection | None:
        return next((c for c in self._connections.values() if c.schema == schema and c.name == name), None)

    def add_connection(self, connection: Connection, owner: str | None = None) -> None:
        with self._lock:
            self._put(self._connections, connection.id, connection, new_owner=True, owner=owner)

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

    def add_sink(self, sink: Sink, owner: str | None = None) -> None:
        with self._lock:
            self._put(self._sinks, sink.id, sink, new_owner=True, owner=owner)

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

    def add_secret(self, secret: Secret, value: bytes, owner: str | None = None) -> None:
        """The value first: a crash in between leaves an unnamed value, forgotten at the next start."""
        with self._lock:
            self.secret_values.put(secret.id, value)
            self._put(self._secrets, secret.id, secret, new_owner=True, owner=owner)

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

    # ---- owners and privileges (catalog/privileges.py) ---------------------------------------------
    def owner_of(self, item_id: str) -> str:
        return self._owners.get(item_id, BOOTSTRAP_SUPERUSER)

    def acl_of(self, item_id: str) -> Acl | None:
        return self._acls.get(item_id)

    def set_acl(self, item_id: str, acl: Acl | None) -> None:
        with self._lock:
            if acl is None:
                self._acls.pop(item_id, None)
            else:
                self._acls[item_id] = acl
            self._persist()

    def set_schema_acl(self, acl: Acl | None) -> None:
        with self._lock:
            self.schema_acl = acl
            self._persist()

    def set_database_acl(self, acl: Acl | None) -> None:
        with self._lock:
            self.database_acl = acl
            self._persist()

    def owned_items(self) -> list[tuple[str, str, str]]:
        """(kind, name, item id) of every item that can have an owner: the objects privileges apply to."""
        return ([("source", item.name, item.id) for item in self.sources()]
                + [("table", table.name, table.id) for table in self.tables()]
                + [("materialized view", view.name, view.id) for view in self.views()]
                + [("sink", sink.name, sink.id) for sink in self.sinks()]
                + [("secret", secret.name, secret.id) for secret in self.secrets()]
                + [("connection", connection.name, connection.id) for connection in self.connections()])

    def _own(self, item_id: str, owner: str | None) -> None:
        """A new item's owner: the one given, else the role running the statement (CREATING_ROLE), else (no
        statement: start-up, tests) the bootstrap superuser, by absence."""
        owner = owner or CREATING_ROLE.get()
        if owner is not None:
            self._owners[item_id] = owner

    def _forget(self, item_id: str) -> None:
        self._owners.pop(item_id, None)
        self._acls.pop(item_id, None)

    # ---- durability -----------------------------------------------------------------------------
    def _put(self, items: dict[str, Any], key: str, item: Any | None, *, new_owner: bool = False,
             owner: str | None = None) -> None:
        """Set (None: remove, with its owner and grants) one entry and persist; `new_owner`: record its owner
        (`_own`). If the write fails (disk full), the in-memory catalog is put back as it was, so what clients see
        matches what is on disk and the statement can simply be retried."""
        had, previous = key in items, items.get(key)
        saved = [(table, table.get(key)) for table in (self._owners, self._acls)]
        if item is None:
            items.pop(key, None)
            self._forget(key)
        else:
            items[key] = item
            if new_owner:
                self._own(key, owner)
        try:
            self._persist()
        except BaseException:
            if had:
                items[key] = previous
            else:
                items.pop(key, None)
            for table, value in saved:
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
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
            "privileges": {item_id: {"owner": self.owner_of(item_id), "acl": acl_text(self._acls.get(item_id))}
                           for item_id in sorted({*self._owners, *self._acls}, key=lambda i: int(i[1:]))},
            "schema_acl": acl_text(self.schema_acl),
            "database_acl": acl_text(self.database_acl),
        }
        replace_file_durably(self._path, json.dumps(document, indent=1).encode())
