"""A tiny driver for tests: the "recovery log with idempotent apply" pattern over a JSON-file key/value store.

The endpoint (`KvStore`) is not transactional: one JSON file of key -> document, rewritten on each apply.
  * Store: documents are collected in memory.
  * StartCommit: they are staged in a file named by a fresh transaction id; StartedCommit's state is a merge
    patch {"pending": {<id>: <file>}}, so the runtime's recovery log commits the staged file's name atomically
    with its checkpoint.
  * Acknowledge: every pending staged file is applied (idempotently: documents are fully reduced, so writing
    them again yields the same map) and deleted; Acknowledged's merge patch removes them from "pending".
  * Open: the pending files come from the recovery log's driver state (Open.driver_state), so a runtime that
    crashed between StartedCommit and Acknowledged has them applied by the next runtime's first Acknowledge.
  * Load: read from the applied map (the connection loop only evaluates Loads after Acknowledged).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from headrace.materialize.protocol import (
    Acknowledged,
    Load,
    Loaded,
    Open,
    Opened,
    StartedCommit,
    StateUpdate,
    Store,
)


class KvStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.applies = 0  # staged files applied (a re-apply after a crash counts again)

    @property
    def data_file(self) -> Path:
        return self.directory / "data.json"

    def read(self) -> dict[str, Any]:
        return json.loads(self.data_file.read_text()) if self.data_file.exists() else {}

    def apply_staged(self, staged: Path) -> None:
        if not staged.exists():
            return  # applied and deleted by an earlier acknowledgement whose Acknowledged was lost
        data = self.read()
        for key, doc in json.loads(staged.read_text()):
            if doc is None:
                data.pop(key, None)
            else:
                data[key] = doc
        temporary = self.data_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(data))
        os.replace(temporary, self.data_file)
        self.applies += 1
        staged.unlink()


class KvTransactor:
    def __init__(self, store: KvStore) -> None:
        self.kv = store
        self.pending: dict[str, str] = {}
        self.stores: list[Store] = []

    def open(self, open: Open) -> Opened:
        self.pending = dict(open.driver_state.get("pending", {}))
        return Opened(runtime_checkpoint=None)  # not authoritative: the runtime's recovery log is

    def load(self, loads: list[Load]) -> list[Loaded]:
        data = self.kv.read()
        return [Loaded(load.binding, load.key, data[load.key[0]]) for load in loads if load.key[0] in data]

    def store(self, stores: list[Store]) -> None:
        self.stores.extend(stores)

    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit:
        transaction = uuid.uuid4().hex
        staged = self.kv.directory / f"staged-{transaction}.json"
        staged.write_text(json.dumps([(s.key[0], None if s.delete else s.doc) for s in self.stores]))
        self.stores = []
        self.pending[transaction] = str(staged)
        return StartedCommit(StateUpdate({"pending": {transaction: str(staged)}}, merge_patch=True))

    def acknowledge(self) -> Acknowledged:
        applied, self.pending = self.pending, {}
        for staged in applied.values():
            self.kv.apply_staged(Path(staged))
        if not applied:
            return Acknowledged(None)
        return Acknowledged(StateUpdate({"pending": {transaction: None for transaction in applied}},
                                        merge_patch=True))

    def close(self) -> None:
        self.stores = []
