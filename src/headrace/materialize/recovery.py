"""The runtime's recovery log: its checkpoint plus the driver's state, for drivers whose store is not authoritative.

Flow keeps both in the task's recovery log; headrace keeps them in one small JSON file per materialization key
range. The rules of seed 001 this implements:

  * StartedCommit's driver state commits atomically WITH the runtime checkpoint: `commit(checkpoint, state)`
    writes one new file (temp file, fsync, rename over the old one, fsync of the directory), so after a crash
    the file holds either the previous pair or the new pair, never a mix.
  * Acknowledged's driver state is non-transactional: `update_driver_state(state)` writes it the same way but
    nothing depends on it surviving; a driver must tolerate seeing the state of StartedCommit again (that is
    what makes "recovery log with idempotent apply" re-apply after a crash between StartedCommit and
    Acknowledged).
  * Driver state updates may be RFC 7396 merge patches: `apply_merge_patch` (and `create_merge_patch`, its
    inverse for drivers that want to send minimal patches).
  * `rebuild()` records the explicit zero checkpoint (a driver's Opened with {}): start from scratch.

Spark's checkpoint (offsets written before a batch, commits after) sits beside this log; the runtime checkpoint
names {epoch, batch_id}, so `is_replayed_batch` recognises a batch Spark replays after a crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headrace.durable import replace_file_durably
from headrace.errors import InternalError

_FORMAT_VERSION = 1


# ---------------------------------------------------------------------------------------------- RFC 7396


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 MergePatch(target, patch), without mutating either: objects merge member by member, a null
    member removes it, anything else (arrays included) replaces the target."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = apply_merge_patch(result.get(name), value)
    return result


def create_merge_patch(source: Any, target: Any) -> Any:
    """A merge patch that turns `source` into `target`. Exact only when no object in `target` holds a null
    member (RFC 7396 cannot express those: null means "remove")."""
    if not isinstance(source, dict) or not isinstance(target, dict):
        return target
    patch: dict[str, Any] = {name: None for name in source if name not in target}
    for name, value in target.items():
        if name not in source:
            patch[name] = value
        elif not _strictly_equal(source[name], value):
            patch[name] = create_merge_patch(source[name], value)
    return patch


def _strictly_equal(a: Any, b: Any) -> bool:
    """JSON equality that tells 1, 1.0 and true apart (Python's == does not)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_strictly_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_strictly_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


# ---------------------------------------------------------------------------------------------- the log


@dataclass(frozen=True, slots=True)
class RecoveredState:
    """What the log holds: runtime_checkpoint None before the first commit (or after rebuild())."""

    runtime_checkpoint: dict[str, Any] | None
    driver_state: dict[str, Any]
    commits: int


class RecoveryLog:
    """One materialization key range's recovery log: a JSON file replaced atomically on every write.

    Not thread-safe: one runtime owns it (fencing between runtimes is the file's single owner, e.g. the
    pipeline process of one server; see docs/materialization.md)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._state = self._read()

    @property
    def state(self) -> RecoveredState:
        return self._state

    def commit(self, runtime_checkpoint: dict[str, Any], driver_state: dict[str, Any]) -> None:
        """Durably record a transaction: its runtime checkpoint and StartedCommit's driver state, together."""
        self._write(RecoveredState(dict(runtime_checkpoint), dict(driver_state), self._state.commits + 1))

    def update_driver_state(self, driver_state: dict[str, Any]) -> None:
        """Record Acknowledged's driver state (non-transactional: losing it must be harmless)."""
        if driver_state != self._state.driver_state:
            self._write(RecoveredState(self._state.runtime_checkpoint, dict(driver_state), self._state.commits))

    def rebuild(self) -> None:
        """The explicit zero checkpoint: forget the checkpoint and driver state, start from scratch."""
        self._write(RecoveredState(None, {}, 0))

    def _read(self) -> RecoveredState:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return RecoveredState(None, {}, 0)
        try:
            data = json.loads(raw)
            if data.get("version") != _FORMAT_VERSION:
                raise ValueError(f"unknown format version {data.get('version')!r}")
            return RecoveredState(data["runtime_checkpoint"], dict(data["driver_state"]), int(data["commits"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Never a torn file (writes are atomic renames): this is corruption, so refuse to guess.
            raise InternalError(f"recovery log {self.path} is unreadable: {exc}") from exc

    def _write(self, state: RecoveredState) -> None:
        payload = json.dumps({"version": _FORMAT_VERSION, "runtime_checkpoint": state.runtime_checkpoint,
                              "driver_state": state.driver_state, "commits": state.commits},
                             separators=(",", ":")).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_file_durably(self.path, payload, temporary=self.path.with_name(self.path.name + ".tmp"))
        self._state = state


def is_replayed_batch(runtime_checkpoint: dict[str, Any] | None, epoch: str, batch_id: int) -> bool:
    """Whether Spark batch `batch_id` of checkpoint `epoch` is already covered by `runtime_checkpoint` (Spark
    replays a batch whose offsets it wrote but whose commit it did not, after a crash)."""
    if not runtime_checkpoint or runtime_checkpoint.get("epoch") != epoch:
        return False
    committed = runtime_checkpoint.get("batch_id")
    return isinstance(committed, int) and batch_id <= committed
