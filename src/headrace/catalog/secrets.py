"""Secret values, kept apart from the catalog: `<data>/secrets.json`, mode 0600, replaced atomically
(write, fsync, rename, fsync dir), keyed by the secret's catalog id.

Nothing here logs or formats a value; `repr` of the store shows only how many it holds. The
catalog file holds only secret names, so it can be shown, copied or attached to a bug report.
"""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

from headrace.durable import replace_file_durably

SECRETS_FILE = "secrets.json"
FORMAT_VERSION = 1


class SecretStore:
    def __init__(self, data_dir: Path | None) -> None:
        """`data_dir` None keeps the values in memory only (tests)."""
        self._path = data_dir / SECRETS_FILE if data_dir is not None else None
        self._lock = threading.Lock()
        self._values: dict[str, bytes] = {}
        if self._path is not None and self._path.exists():
            stored = json.loads(self._path.read_text())
            self._values = {item_id: base64.b64decode(value) for item_id, value in stored["values"].items()}

    def __repr__(self) -> str:
        return f"SecretStore({len(self._values)} values)"

    def get(self, item_id: str) -> bytes | None:
        return self._values.get(item_id)

    def put(self, item_id: str, value: bytes) -> None:
        with self._lock:
            self._values[item_id] = value
            self._persist()

    def delete(self, item_id: str) -> None:
        with self._lock:
            if self._values.pop(item_id, None) is not None:
                self._persist()

    def retain(self, live_ids: set[str]) -> None:
        """Forget values whose secret is gone (a crash between the two files of CREATE/DROP SECRET)."""
        with self._lock:
            stale = set(self._values) - live_ids
            for item_id in stale:
                del self._values[item_id]
            if stale:
                self._persist()

    def _persist(self) -> None:
        if self._path is None:
            return
        document = {"format": FORMAT_VERSION,
                    "values": {item_id: base64.b64encode(value).decode("ascii") for item_id, value in self._values.items()}}
        replace_file_durably(self._path, json.dumps(document).encode("ascii"), mode=0o600)
