"""Indexes (CREATE INDEX): durable definitions, one small file replaced atomically beside catalog.json.

An index names the relation it is on by schema, name and catalog id (a relation dropped and created again
under the same name is a new relation: its old indexes are gone), and the columns it is keyed by. Its
rows live in memory only (store/arrangements.py) and are rebuilt from the serving store after a restart."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from headrace.durable import replace_file_durably

INDEXES_FILE = "indexes.json"


@dataclass(frozen=True, slots=True)
class IndexDefinition:
    id: str  # "i<n>"
    name: str
    schema: str
    on_schema: str
    on_name: str
    on_id: str  # the catalog id of the relation (source u1, view u2, ...)
    columns: tuple[str, ...]
    create_sql: str


class IndexCatalog:
    def __init__(self, data_dir: Path | None) -> None:
        self._path = None if data_dir is None else data_dir / INDEXES_FILE
        self._lock = threading.Lock()
        self._indexes: dict[str, IndexDefinition] = {}
        self._next_id = 1
        self.generation = 0  # bumped at every change: plans that used an index are re-checked
        if self._path is not None and self._path.exists():
            stored = json.loads(self._path.read_text())
            self._next_id = int(stored["next_id"])
            for entry in stored["indexes"]:
                index = IndexDefinition(**{**entry, "columns": tuple(entry["columns"])})
                self._indexes[index.id] = index

    def all(self) -> list[IndexDefinition]:
        return sorted(self._indexes.values(), key=lambda index: int(index.id[1:]))

    def find(self, schema: str, name: str) -> IndexDefinition | None:
        return next((i for i in self._indexes.values() if i.schema == schema and i.name == name), None)

    def on(self, schema: str, name: str) -> list[IndexDefinition]:
        return [i for i in self.all() if i.on_schema == schema and i.on_name == name]

    def add(self, index: IndexDefinition) -> None:
        with self._lock:
            self._indexes[index.id] = index
            self._persist()

    def allocate_id(self) -> str:
        with self._lock:
            index_id = f"i{self._next_id}"
            self._next_id += 1
            return index_id

    def remove(self, index_id: str) -> None:
        with self._lock:
            if self._indexes.pop(index_id, None) is not None:
                self._persist()

    def _persist(self) -> None:
        self.generation += 1
        if self._path is None:
            return
        document = {"next_id": self._next_id, "indexes": [asdict(index) for index in self.all()]}
        replace_file_durably(self._path, json.dumps(document, indent=1).encode())
