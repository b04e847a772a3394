"""The durable catalog: the CREATE statement of every item, in one small file replaced atomically.

Items are rebuilt by re-parsing their `create_sql` at start (like Materialize's catalog), so the
statement text is the single source of truth for a definition."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from headrace.catalog.items import WebhookSource

CATALOG_FILE = "catalog.json"
FORMAT_VERSION = 1

# Builds an item from its stored statement (the SQL layer knows how): (id, create_sql) -> item.
ItemBuilder = Callable[[str, str], WebhookSource]


class Catalog:
    def __init__(self, data_dir: Path, build_item: ItemBuilder) -> None:
        self._path = data_dir / CATALOG_FILE
        self._lock = threading.Lock()
        self._next_id = 1
        self._items: dict[str, WebhookSource] = {}
        if self._path.exists():
            stored = json.loads(self._path.read_text())
            self._next_id = int(stored["next_id"])
            for entry in stored["items"]:
                item = build_item(entry["id"], entry["create_sql"])
                self._items[item.id] = item

    def allocate_id(self) -> str:
        with self._lock:
            item_id = f"u{self._next_id}"
            self._next_id += 1
            return item_id

    def sources(self) -> list[WebhookSource]:
        return sorted(self._items.values(), key=lambda item: int(item.id[1:]))

    def find(self, schema: str, name: str) -> WebhookSource | None:
        for item in self._items.values():
            if item.schema == schema and item.name == name:
                return item
        return None

    def add(self, item: WebhookSource) -> None:
        with self._lock:
            self._items[item.id] = item
            self._persist()

    def remove(self, item_id: str) -> None:
        with self._lock:
            self._items.pop(item_id, None)
            self._persist()

    def _persist(self) -> None:
        """Write-fsync-rename-fsync: after a crash the catalog is either the old or the new one."""
        document = {
            "format": FORMAT_VERSION,
            "next_id": self._next_id,
            "items": [{"id": item.id, "create_sql": item.create_sql} for item in self.sources()],
        }
        temporary = self._path.with_suffix(".tmp")
        with open(temporary, "w") as handle:
            json.dump(document, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self._path)
        directory = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
