"""Messages of the materialization protocol, after Flow's materialize.proto.

The Runtime sends requests named in the imperative (Load), the Driver answers in the past tense (Loaded).
Messages are plain frozen dataclasses; `to_wire` / `from_wire` turn them into JSON-able dicts carrying a
"type" field, so every transport (TCP frames now, gRPC later) shares one codec.

Control requests come before Open, each answered before the next: Spec -> Spec (SpecResponse here; both carry
wire type "Spec", the response is told apart by its `protocol` field), Validate -> Validated (per binding,
a FieldConstraint for every field of the collection), Apply -> Applied. Then Open starts the transactions.

Values in keys, values and docs are JSON-able. Per column type: JSON holds any JSON value, TIMESTAMPTZ an int of
microseconds since the epoch (UTC), VARCHAR a str, BIGINT/INTEGER an int, DOUBLE a float, BOOLEAN a bool.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

import pyarrow as pa

from headrace.errors import InternalError, InvalidParameterValue, ProtocolViolation
from headrace.materialize.recovery import apply_merge_patch

# ---------------------------------------------------------------------------------------------- errors


class MaterializationError(InternalError):
    """A materialization failed; the runtime must be reopened on a new connection."""


class DriverError(MaterializationError):
    """The driver answered with an Error response (its message is this error's message)."""


class FencedOff(DriverError):
    """Another runtime opened the same materialization and key range: this one is a zombie and must stop."""


class ProtocolOrderError(ProtocolViolation):
    """A message arrived out of the order the protocol allows (a bug on one side, never user input)."""


class InvalidFieldSelection(InvalidParameterValue):
    """A spec selects a field the driver forbids or cannot store, or omits a field it requires."""


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
    # The endpoint's configuration (Flow's config_json): what the driver connects to (a URL, a path, headers).
    # Secrets in it are already resolved: it travels to the driver and is never logged or shown.
    config: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """A driver state update; with merge_patch it is an RFC 7396 merge patch, else a replacement."""

    updated: dict[str, Any]
    merge_patch: bool


# ---------------------------------------------------------------------------------------------- control

PROTOCOL_VERSION = 3032023  # Flow's materialize protocol number, echoed by Spec responses

# Field constraints a driver answers in Validated, after Flow's Response.Validated.Constraint.Type.
FIELD_REQUIRED = "FIELD_REQUIRED"  # this field must be selected
LOCATION_REQUIRED = "LOCATION_REQUIRED"  # the field's location must be selected (headrace: the field itself)
LOCATION_RECOMMENDED = "LOCATION_RECOMMENDED"  # selected by default
FIELD_OPTIONAL = "FIELD_OPTIONAL"  # may be selected
FIELD_FORBIDDEN = "FIELD_FORBIDDEN"  # must not be selected (e.g. a name the store reserves)
INCOMPATIBLE = "INCOMPATIBLE"  # cannot be stored (type unsupported, or an existing column of another type)
CONSTRAINT_TYPES = (FIELD_REQUIRED, LOCATION_REQUIRED, LOCATION_RECOMMENDED, FIELD_OPTIONAL, FIELD_FORBIDDEN,
                    INCOMPATIBLE)
_MUST_SELECT = (FIELD_REQUIRED, LOCATION_REQUIRED)
_MUST_NOT_SELECT = (FIELD_FORBIDDEN, INCOMPATIBLE)


@dataclass(frozen=True, slots=True)
class FieldConstraint:
    type: str  # one of CONSTRAINT_TYPES
    reason: str


def field_constraint(name: str, key: tuple[str, ...], forbidden: str | None = None,
                     incompatible: str | None = None) -> FieldConstraint:
    """A driver's usual answer for one proposed field: forbidden or incompatible for the reason given, else required
    as a key of the collection or recommended as one of its fields."""
    if forbidden is not None:
        return FieldConstraint(FIELD_FORBIDDEN, forbidden)
    if incompatible is not None:
        return FieldConstraint(INCOMPATIBLE, incompatible)
    if name in key:
        return FieldConstraint(LOCATION_REQUIRED, "a key of the collection")
    return FieldConstraint(LOCATION_RECOMMENDED, "a field of the collection")


@dataclass(frozen=True, slots=True)
class ValidateBinding:
    """A proposed binding: the collection's key and every field it offers (name -> DuckDB type name)."""

    resource_path: tuple[str, ...]
    key: tuple[str, ...]
    fields: dict[str, str]
    delta_updates: bool = False
    backfill: int = 0  # bumped to ask for the resource to be rebuilt


@dataclass(frozen=True, slots=True)
class ValidatedBinding:
    resource_path: tuple[str, ...]
    constraints: dict[str, FieldConstraint]
    delta_updates: bool


@dataclass(frozen=True, slots=True)
class Spec:
    TYPE: ClassVar[str] = "Spec"
    connector_type: str = "headrace"
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpecResponse:
    """Response.Spec: the driver's protocol and the JSON schemas of its endpoint and resource configs."""

    TYPE: ClassVar[str] = "Spec"
    protocol: int
    config_schema: dict[str, Any]
    resource_config_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Validate:
    TYPE: ClassVar[str] = "Validate"
    name: str
    bindings: tuple[ValidateBinding, ...]
    config: dict[str, Any] = field(default_factory=dict, repr=False)  # the endpoint's, as in MaterializationSpec


@dataclass(frozen=True, slots=True)
class Validated:
    TYPE: ClassVar[str] = "Validated"
    bindings: tuple[ValidatedBinding, ...]


@dataclass(frozen=True, slots=True)
class Apply:
    """Create or migrate the spec's resources; idempotent. last_materialization: the spec applied before."""

    TYPE: ClassVar[str] = "Apply"
    materialization: MaterializationSpec
    version: str = ""
    last_materialization: MaterializationSpec | None = None
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Applied:
    TYPE: ClassVar[str] = "Applied"
    action_description: str
    state: StateUpdate | None = None


def validate_binding_of(binding: Binding) -> ValidateBinding:
    """The Validate proposal for a binding whose collection offers exactly its selected columns."""
    return ValidateBinding(binding.resource_path, binding.key, dict(binding.column_types), binding.delta_updates)


def check_field_selection(spec: MaterializationSpec, validated: Validated) -> None:
    """Refuse a spec that selects a forbidden or incompatible field, or omits a required one (every problem of
    every binding in one InvalidFieldSelection)."""
    if len(validated.bindings) != len(spec.bindings):
        raise InvalidFieldSelection(f"the driver validated {len(validated.bindings)} bindings of "
                                    f"{spec.name}, the spec has {len(spec.bindings)}")
    problems: list[str] = []
    for binding, answer in zip(spec.bindings, validated.bindings):
        table = ".".join(binding.resource_path)
        selected = set(binding.columns)
        for name in binding.columns:
            constraint = answer.constraints.get(name)
            if constraint is None:
                problems.append(f"{table}: field {name!r} is not a field of the collection")
            elif constraint.type in _MUST_NOT_SELECT:
                problems.append(f"{table}: field {name!r} is selected but {constraint.type} ({constraint.reason})")
        for name, constraint in answer.constraints.items():
            if constraint.type in _MUST_SELECT and name not in selected:
                problems.append(f"{table}: field {name!r} is {constraint.type} but not selected "
                                f"({constraint.reason})")
    if problems:
        raise InvalidFieldSelection(f"materialization {spec.name} selects fields its driver refuses: "
                                    + "; ".join(problems))


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


@dataclass(frozen=True, slots=True, eq=False)
class LoadColumns:
    """Many Loads of one binding as an Arrow table of key columns (a columnar Load; same place and rules as Load:
    each key at most once per transaction). Answered at Flush by one LoadedColumns of the keys the store holds."""

    TYPE: ClassVar[str] = "LoadColumns"
    binding: int
    keys: pa.Table


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


@dataclass(frozen=True, slots=True, eq=False)
class StoreColumns:
    """Many Stores of one binding as Arrow tables (a columnar Store; same place in the transaction as Store).

    `rows`: documents of keys the store does not hold (Store with exists=False), one row each, with the binding's
    key and value columns; `updated`: documents of keys it holds (exists=True); `deleted`: keys to delete (the
    key columns; a key the store does not hold is ignored, so a deletion needs no Load). Column values follow the
    JSON protocol's conventions (JSON columns as JSON text, TIMESTAMPTZ as int64 microseconds or timestamp[us],
    BLOB as binary). On the wire each table is an Arrow IPC stream carried as a blob of one binary frame
    (transport.py)."""

    TYPE: ClassVar[str] = "StoreColumns"
    binding: int
    rows: pa.Table | None = None
    updated: pa.Table | None = None
    deleted: pa.Table | None = None


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


@dataclass(frozen=True, slots=True, eq=False)
class LoadedColumns:
    """The stored documents of a LoadColumns' keys that exist, one row each: the binding's key and value columns in
    StoreColumns' conventions (JSON as text, TIMESTAMPTZ as int64 microseconds, BLOB as binary)."""

    TYPE: ClassVar[str] = "LoadedColumns"
    binding: int
    docs: pa.Table


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
    # the driver's SQLSTATE for an error a user caused or can fix (an unreachable target: 08001); None: internal
    sqlstate: str | None = None


Request: TypeAlias = (Spec | Validate | Apply | Open | Acknowledge | Load | LoadColumns | Flush | Store | StoreColumns
                      | StartCommit)
Response: TypeAlias = (SpecResponse | Validated | Applied | Opened | Acknowledged | Loaded | LoadedColumns | Flushed
                       | StartedCommit | ErrorResponse)
REQUEST_TYPES: tuple[type, ...] = (Spec, Validate, Apply, Open, Acknowledge, Load, LoadColumns, Flush, Store,
                                   StoreColumns, StartCommit)
_TABLE_FIELDS = ("rows", "updated", "deleted")  # StoreColumns' tables, each one blob of its binary frame
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
        "config": spec.config,
    }


def _spec_from_wire(d: dict[str, Any]) -> MaterializationSpec:
    bindings = tuple(
        Binding(resource_path=tuple(b["resource_path"]), key=tuple(b["key"]), values=tuple(b["values"]),
                column_types=dict(b["column_types"]), delta_updates=bool(b.get("delta_updates", False)))
        for b in d["bindings"]
    )
    return MaterializationSpec(name=d["name"], bindings=bindings, config=d.get("config") or {})


def _control_to_wire(msg: Message) -> dict[str, Any] | None:
    if isinstance(msg, Spec):
        return {"type": "Spec", "connector_type": msg.connector_type, "config": msg.config}
    if isinstance(msg, SpecResponse):
        return {"type": "Spec", "protocol": msg.protocol, "config_schema": msg.config_schema,
                "resource_config_schema": msg.resource_config_schema}
    if isinstance(msg, Validate):
        return {"type": "Validate", "name": msg.name, "bindings": [
            {"resource_path": list(b.resource_path), "key": list(b.key), "fields": b.fields,
             "delta_updates": b.delta_updates, "backfill": b.backfill} for b in msg.bindings], "config": msg.config}
    if isinstance(msg, Validated):
        return {"type": "Validated", "bindings": [
            {"resource_path": list(b.resource_path), "delta_updates": b.delta_updates,
             "constraints": {name: {"type": c.type, "reason": c.reason} for name, c in b.constraints.items()}}
            for b in msg.bindings]}
    if isinstance(msg, Apply):
        last = msg.last_materialization
        return {"type": "Apply", "materialization": _spec_to_wire(msg.materialization), "version": msg.version,
                "last_materialization": None if last is None else _spec_to_wire(last), "state": msg.state}
    if isinstance(msg, Applied):
        return {"type": "Applied", "action_description": msg.action_description,
                "state": _state_to_wire(msg.state)}
    return None


def _control_from_wire(kind: str, d: dict[str, Any]) -> Message | None:
    if kind == "Spec":
        if "protocol" in d:
            return SpecResponse(protocol=int(d["protocol"]), config_schema=d.get("config_schema") or {},
                                resource_config_schema=d.get("resource_config_schema") or {})
        return Spec(connector_type=d.get("connector_type", "headrace"), config=d.get("config") or {})
    if kind == "Validate":
        return Validate(name=d["name"], bindings=tuple(
            ValidateBinding(tuple(b["resource_path"]), tuple(b["key"]), dict(b["fields"]),
                            bool(b.get("delta_updates", False)), int(b.get("backfill", 0)))
            for b in d["bindings"]), config=d.get("config") or {})
    if kind == "Validated":
        return Validated(bindings=tuple(
            ValidatedBinding(tuple(b["resource_path"]),
                             {name: FieldConstraint(c["type"], c.get("reason", ""))
                              for name, c in b["constraints"].items()},
                             bool(b.get("delta_updates", False)))
            for b in d["bindings"]))
    if kind == "Apply":
        last = d.get("last_materialization")
        return Apply(materialization=_spec_from_wire(d["materialization"]), version=d.get("version", ""),
                     last_materialization=None if last is None else _spec_from_wire(last),
                     state=d.get("state") or {})
    if kind == "Applied":
        return Applied(action_description=d.get("action_description", ""), state=_state_from_wire(d.get("state")))
    return None


def to_wire(msg: Message) -> dict[str, Any]:
    """The JSON-able dict form of a message. Hot-path messages are spelled out rather than reflected (speed)."""
    if isinstance(msg, Load):
        return {"type": "Load", "binding": msg.binding, "key": msg.key}
    if isinstance(msg, Store):
        return {"type": "Store", "binding": msg.binding, "key": msg.key, "values": msg.values, "doc": msg.doc,
                "exists": msg.exists, "delete": msg.delete}
    if isinstance(msg, Loaded):
        return {"type": "Loaded", "binding": msg.binding, "key": msg.key, "doc": msg.doc}
    if isinstance(msg, StoreColumns):
        return {"type": "StoreColumns", "binding": msg.binding,
                "blobs": {name: _ipc_bytes(getattr(msg, name)) for name in _TABLE_FIELDS
                          if getattr(msg, name) is not None}}
    if isinstance(msg, LoadColumns):
        return {"type": "LoadColumns", "binding": msg.binding, "blobs": {"keys": _ipc_bytes(msg.keys)}}
    if isinstance(msg, LoadedColumns):
        return {"type": "LoadedColumns", "binding": msg.binding, "blobs": {"docs": _ipc_bytes(msg.docs)}}
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
        wire: dict[str, Any] = {"type": "Error", "message": msg.message, "fenced_off": msg.fenced_off}
        if msg.sqlstate is not None:
            wire["sqlstate"] = msg.sqlstate
        return wire
    control = _control_to_wire(msg)
    if control is not None:
        return control
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
        if kind == "StoreColumns":
            blobs = d.get("blobs") or {}
            tables = {name: _ipc_table(blobs[name]) for name in _TABLE_FIELDS if name in blobs}
            return StoreColumns(binding=d["binding"], **tables)
        if kind == "LoadColumns":
            return LoadColumns(binding=d["binding"], keys=_ipc_table(d["blobs"]["keys"]))
        if kind == "LoadedColumns":
            return LoadedColumns(binding=d["binding"], docs=_ipc_table(d["blobs"]["docs"]))
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
            sqlstate = d.get("sqlstate")
            return ErrorResponse(message=str(d["message"]), fenced_off=bool(d.get("fenced_off", False)),
                                 sqlstate=None if sqlstate is None else str(sqlstate))
        control = _control_from_wire(kind, d)
        if control is not None:
            return control
    except (KeyError, TypeError, ValueError, AttributeError, pa.ArrowException) as exc:
        raise ProtocolViolation(f"malformed {d.get('type', 'untyped') if isinstance(d, dict) else ''} "
                                f"message: {exc!r}") from exc
    raise ProtocolViolation(f"unknown message type {kind!r}")


# ---------------------------------------------------------------------------------------------- helpers


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _ipc_table(blob: bytes | memoryview) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


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
    patched = apply_merge_patch(state, update.updated)
    return patched if isinstance(patched, dict) else {}  # driver state is always an object
