"""Messages of the materialization protocol, after Flow's materialize.proto (simplified).

The Runtime sends requests named in the imperative (Load), the Driver answers in the past tense (Loaded).
Messages are plain frozen dataclasses; `to_wire` / `from_wire` turn them into JSON-able dicts carrying a
"type" field, so every transport (TCP frames now, gRPC later) shares one codec.

Values in keys, values and docs are JSON-able. Per column type: JSON holds any JSON value, TIMESTAMPTZ an int of
microseconds since the epoch (UTC), VARCHAR a str, BIGINT/INTEGER an int, DOUBLE a float, BOOLEAN a bool.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from headrace.errors import InternalError, ProtocolViolation

# ---------------------------------------------------------------------------------------------- errors


class MaterializationError(InternalError):
    """A materialization failed; the runtime must be reopened on a new connection."""


class DriverError(MaterializationError):
    """The driver answered with an Error response (its message is this error's message)."""


class FencedOff(DriverError):
    """Another runtime opened the same materialization and key range: this one is a zombie and must stop."""


class ProtocolOrderError(ProtocolViolation):
    """A message arrived out of the order the protocol allows (a bug on one side, never user input)."""


# ---------------------------------------------------------------------------------------------- spec


@dataclass(frozen=True, slots=True)
class Binding:
    """One collection materialized into one resource (a table), keyed by `key` columns."""

    resource_path: tuple[str, ...]
    key: tuple[str, ...]
    values: tuple[str, ...]
    column_types: dict[str, str]  # column name -> DuckDB type name, for every key and value column
    delta_updates: bool = False

    @property
    def columns(self) -> tuple[str, ...]:
        return self.key + self.values


@dataclass(frozen=True, slots=True)
class MaterializationSpec:
    name: str
    bindings: tuple[Binding, ...]


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """A driver state update; with merge_patch it is an RFC 7396 merge patch, else a replacement."""

    updated: dict[str, Any]
    merge_patch: bool


# ---------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Open:
    TYPE: ClassVar[str] = "Open"
    spec: MaterializationSpec
    key_begin: int
    key_end: int
    driver_state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Acknowledge:
    TYPE: ClassVar[str] = "Acknowledge"


@dataclass(frozen=True, slots=True)
class Load:
    TYPE: ClassVar[str] = "Load"
    binding: int
    key: list[Any]


@dataclass(frozen=True, slots=True)
class Flush:
    TYPE: ClassVar[str] = "Flush"


@dataclass(frozen=True, slots=True)
class Store:
    TYPE: ClassVar[str] = "Store"
    binding: int
    key: list[Any]
    values: list[Any]
    doc: dict[str, Any] | None
    exists: bool
    delete: bool = False


@dataclass(frozen=True, slots=True)
class StartCommit:
    TYPE: ClassVar[str] = "StartCommit"
    runtime_checkpoint: dict[str, Any]


# ---------------------------------------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class Opened:
    """runtime_checkpoint None: use the runtime's own recovery log; {}: explicit zero checkpoint (rebuild)."""

    TYPE: ClassVar[str] = "Opened"
    runtime_checkpoint: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Acknowledged:
    TYPE: ClassVar[str] = "Acknowledged"
    state: StateUpdate | None = None


@dataclass(frozen=True, slots=True)
class Loaded:
    TYPE: ClassVar[str] = "Loaded"
    binding: int
    key: list[Any]
    doc: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Flushed:
    TYPE: ClassVar[str] = "Flushed"
    state: StateUpdate | None = None


@dataclass(frozen=True, slots=True)
class StartedCommit:
    TYPE: ClassVar[str] = "StartedCommit"
    state: StateUpdate | None = None


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """The driver failed; it closes the connection after sending this. Wire type "Error"."""

    TYPE: ClassVar[str] = "Error"
    message: str
    fenced_off: bool = False


Request: TypeAlias = Open | Acknowledge | Load | Flush | Store | StartCommit
Response: TypeAlias = Opened | Acknowledged | Loaded | Flushed | StartedCommit | ErrorResponse
Message: TypeAlias = Request | Response

# ---------------------------------------------------------------------------------------------- codec


def _state_to_wire(state: StateUpdate | None) -> dict[str, Any] | None:
    return None if state is None else {"updated": state.updated, "merge_patch": state.merge_patch}


def _state_from_wire(d: dict[str, Any] | None) -> StateUpdate | None:
    return None if d is None else StateUpdate(updated=d["updated"], merge_patch=bool(d["merge_patch"]))


def _spec_to_wire(spec: MaterializationSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "bindings": [
            {"resource_path": list(b.resource_path), "key": list(b.key), "values": list(b.values),
             "column_types": b.column_types, "delta_updates": b.delta_updates}
            for b in spec.bindings
        ],
    }


def _spec_from_wire(d: dict[str, Any]) -> MaterializationSpec:
    bindings = tuple(
        Binding(resource_path=tuple(b["resource_path"]), key=tuple(b["key"]), values=tuple(b["values"]),
                column_types=dict(b["column_types"]), delta_updates=bool(b.get("delta_updates", False)))
        for b in d["bindings"]
    )
    return MaterializationSpec(name=d["name"], bindings=bindings)


def to_wire(msg: Message) -> dict[str, Any]:
    """The JSON-able dict form of a message. Hot-path messages are spelled out rather than reflected (speed)."""
    if isinstance(msg, Load):
        return {"type": "Load", "binding": msg.binding, "key": msg.key}
    if isinstance(msg, Store):
        return {"type": "Store", "binding": msg.binding, "key": msg.key, "values": msg.values, "doc": msg.doc,
                "exists": msg.exists, "delete": msg.delete}
    if isinstance(msg, Loaded):
        return {"type": "Loaded", "binding": msg.binding, "key": msg.key, "doc": msg.doc}
    if isinstance(msg, Open):
        return {"type": "Open", "spec": _spec_to_wire(msg.spec), "key_begin": msg.key_begin,
                "key_end": msg.key_end, "driver_state": msg.driver_state}
    if isinstance(msg, StartCommit):
        return {"type": "StartCommit", "runtime_checkpoint": msg.runtime_checkpoint}
    if isinstance(msg, Opened):
        return {"type": "Opened", "runtime_checkpoint": msg.runtime_checkpoint}
    if isinstance(msg, (Acknowledged, Flushed, StartedCommit)):
        return {"type": msg.TYPE, "state": _state_to_wire(msg.state)}
    if isinstance(msg, (Acknowledge, Flush)):
        return {"type": msg.TYPE}
    if isinstance(msg, ErrorResponse):
        return {"type": "Error", "message": msg.message, "fenced_off": msg.fenced_off}
    raise TypeError(f"not a protocol message: {msg!r}")


def from_wire(d: dict[str, Any]) -> Message:
    """Parse a dict made by `to_wire` (or by a driver in another language). Raises ProtocolViolation."""
    try:
        kind = d["type"]
        if kind == "Load":
            return Load(binding=d["binding"], key=d["key"])
        if kind == "Store":
            return Store(binding=d["binding"], key=d["key"], values=d["values"], doc=d.get("doc"),
                         exists=d["exists"], delete=d.get("delete", False))
        if kind == "Loaded":
            return Loaded(binding=d["binding"], key=d["key"], doc=d["doc"])
        if kind == "Open":
            return Open(spec=_spec_from_wire(d["spec"]), key_begin=d["key_begin"], key_end=d["key_end"],
                        driver_state=d.get("driver_state") or {})
        if kind == "StartCommit":
            return StartCommit(runtime_checkpoint=d["runtime_checkpoint"])
        if kind == "Opened":
            return Opened(runtime_checkpoint=d.get("runtime_checkpoint"))
        if kind == "Acknowledged":
            return Acknowledged(state=_state_from_wire(d.get("state")))
        if kind == "Flushed":
            return Flushed(state=_state_from_wire(d.get("state")))
        if kind == "StartedCommit":
            return StartedCommit(state=_state_from_wire(d.get("state")))
        if kind == "Acknowledge":
            return Acknowledge()
        if kind == "Flush":
            return Flush()
        if kind == "Error":
            return ErrorResponse(message=str(d["message"]), fenced_off=bool(d.get("fenced_off", False)))
    except (KeyError, TypeError) as exc:
        raise ProtocolViolation(f"malformed {d.get('type', 'untyped') if isinstance(d, dict) else ''} "
                                f"message: {exc!r}") from exc
    raise ProtocolViolation(f"unknown message type {kind!r}")


# ---------------------------------------------------------------------------------------------- helpers

_JSON_KEY = object()  # marks a key identity built from canonical JSON, so it never equals a plain tuple


def key_identity(binding: int, key: list[Any]) -> Hashable:
    """A hashable identity of (binding, key) that, like Flow's packed keys, tells 1, 1.0 and true apart.

    Keys of str/int components (the common case) map to a plain tuple; others to canonical JSON text."""
    if len(key) == 1:  # the hot path: one string or integer key, checked without a generator
        part = key[0]
        if type(part) is str or type(part) is int:
            return (binding, part)
    elif all(type(part) is str or type(part) is int for part in key):
        return (binding, *key)
    return (binding, _JSON_KEY, json.dumps(key, sort_keys=True, separators=(",", ":")))


def apply_state_update(state: dict[str, Any], update: StateUpdate | None) -> dict[str, Any]:
    """The driver state after `update`: replaced, or RFC 7396 merge-patched (null removes a member)."""
    if update is None:
        return state
    if not update.merge_patch:
        return dict(update.updated)
    merged: dict[str, Any] = _merge_patch(state, update.updated)  # a dict patch always yields a dict
    return merged


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = _merge_patch(result.get(name), value)
    return result
