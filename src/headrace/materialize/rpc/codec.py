"""protocol.py's dataclasses <-> driver.proto's messages (Request / Response), both directions, lossless.

JSON members (documents, keys, configs, checkpoints, driver states) travel as UTF-8 JSON text in `bytes`
fields: encoded like the TCP transport (orjson, or the json module for integers orjson refuses), decoded by
orjson unless the text may hold an integer beyond 64 bits (orjson would turn it into a float), which the json
module then decodes exactly. Arrow tables travel as Arrow IPC streams (protocol._ipc_bytes / _ipc_table).
"Empty: none" fields (driver.proto) map empty bytes to None and back; objects default to {} when empty.

Malformed messages (missing oneof member, undecodable JSON, an object where an array belongs, an unknown
constraint type) raise ProtocolViolation, as protocol.from_wire does.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pyarrow as pa

from headrace.errors import ProtocolViolation
from headrace.materialize.protocol import (
    CONSTRAINT_TYPES,
    Acknowledge,
    Acknowledged,
    Applied,
    Apply,
    Binding,
    ErrorResponse,
    FieldConstraint,
    Flush,
    Flushed,
    Load,
    LoadColumns,
    Loaded,
    LoadedColumns,
    MaterializationSpec,
    Open,
    Opened,
    Request,
    Response,
    Spec,
    SpecResponse,
    StartCommit,
    StartedCommit,
    StateUpdate,
    Store,
    StoreColumns,
    Validate,
    ValidateBinding,
    Validated,
    ValidatedBinding,
    _ipc_bytes,
    _ipc_table,
)
from headrace.materialize.rpc import driver_pb2 as pb
from headrace.materialize.transport import encode_json

__all__ = ["decode_json", "request_from_proto", "request_to_proto", "response_from_proto", "response_to_proto"]

# A run of 19+ digits may be an integer beyond 64 bits, which orjson would decode as a float.
_LONG_DIGITS = re.compile(rb"\d{19,}")
_CONSTRAINT = pb.Response.Validated.Constraint
_CONSTRAINT_NUMBERS = {name: _CONSTRAINT.Type.Value(name) for name in CONSTRAINT_TYPES}
_CONSTRAINT_NAMES = {number: name for name, number in _CONSTRAINT_NUMBERS.items()}

# ---------------------------------------------------------------------------------------------- JSON members


def decode_json(data: bytes) -> Any:
    """JSON text -> value, integers exact at any size (see module docstring)."""
    try:
        if data[:1] == b" " or _LONG_DIGITS.search(data):
            return json.loads(data)
        return orjson.loads(data)
    except ValueError as exc:  # orjson's, json's and UTF-8 decode errors are ValueErrors
        raise ProtocolViolation(f"malformed JSON member: {exc}") from exc


def _object(data: bytes, what: str) -> dict[str, Any]:
    """A JSON object member; empty bytes read as {}."""
    if not data:
        return {}
    value = decode_json(data)
    if not isinstance(value, dict):
        raise ProtocolViolation(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def _optional_object(data: bytes, what: str) -> dict[str, Any] | None:
    return _object(data, what) if data else None


def _array(data: bytes, what: str) -> list[Any]:
    value = decode_json(data) if data else None
    if not isinstance(value, list):
        raise ProtocolViolation(f"{what} must be a JSON array, not {type(value).__name__}")
    return value


def _table(data: bytes) -> pa.Table | None:
    return _ipc_table(data) if data else None


def _blob(table: pa.Table | None) -> bytes:
    return b"" if table is None else _ipc_bytes(table)


# ---------------------------------------------------------------------------------------------- shared


def _state_to_proto(state: StateUpdate | None) -> pb.StateUpdate | None:
    return None if state is None else pb.StateUpdate(updated_json=encode_json(state.updated),
                                                     merge_patch=state.merge_patch)


def _state_from_proto(message: Any) -> StateUpdate | None:
    if not message.HasField("state"):
        return None
    return StateUpdate(_object(message.state.updated_json, "StateUpdate.updated_json"), message.state.merge_patch)


def _spec_to_proto(spec: MaterializationSpec) -> pb.MaterializationSpec:
    return pb.MaterializationSpec(
        name=spec.name, config_json=encode_json(spec.config),
        bindings=[pb.Binding(resource_path=b.resource_path, key=b.key, values=b.values, column_types=b.column_types,
                             delta_updates=b.delta_updates) for b in spec.bindings])


def _spec_from_proto(spec: pb.MaterializationSpec) -> MaterializationSpec:
    bindings = tuple(Binding(tuple(b.resource_path), tuple(b.key), tuple(b.values), dict(b.column_types),
                             b.delta_updates) for b in spec.bindings)
    return MaterializationSpec(spec.name, bindings, _object(spec.config_json, "MaterializationSpec.config_json"))


# ---------------------------------------------------------------------------------------------- requests


def request_to_proto(msg: Request) -> pb.Request:
    """A request dataclass as a driver.proto Request (hot-path kinds first)."""
    kind = type(msg)
    if kind is Store:
        assert isinstance(msg, Store)
        return pb.Request(store=pb.Request.Store(
            binding=msg.binding, key_json=encode_json(msg.key), values_json=encode_json(msg.values),
            doc_json=b"" if msg.doc is None else encode_json(msg.doc), exists=msg.exists, delete=msg.delete))
    if kind is Load:
        assert isinstance(msg, Load)
        return pb.Request(load=pb.Request.Load(binding=msg.binding, key_json=encode_json(msg.key)))
    if isinstance(msg, Acknowledge):
        return pb.Request(acknowledge=pb.Request.Acknowledge())
    if isinstance(msg, Flush):
        return pb.Request(flush=pb.Request.Flush())
    if isinstance(msg, StartCommit):
        return pb.Request(start_commit=pb.Request.StartCommit(
            runtime_checkpoint_json=encode_json(msg.runtime_checkpoint)))
    if isinstance(msg, StoreColumns):
        return pb.Request(store_columns=pb.Request.StoreColumns(
            binding=msg.binding, rows_arrow=_blob(msg.rows), updated_arrow=_blob(msg.updated),
            deleted_arrow=_blob(msg.deleted)))
    if isinstance(msg, LoadColumns):
        return pb.Request(load_columns=pb.Request.LoadColumns(binding=msg.binding, keys_arrow=_ipc_bytes(msg.keys)))
    if isinstance(msg, Open):
        return pb.Request(open=pb.Request.Open(spec=_spec_to_proto(msg.spec), key_begin=msg.key_begin,
                                               key_end=msg.key_end, driver_state_json=encode_json(msg.driver_state)))
    if isinstance(msg, Spec):
        return pb.Request(spec=pb.Request.Spec(connector_type=msg.connector_type, config_json=encode_json(msg.config)))
    if isinstance(msg, Validate):
        return pb.Request(validate=pb.Request.Validate(
            name=msg.name, config_json=encode_json(msg.config),
            bindings=[pb.Request.Validate.Binding(resource_path=b.resource_path, key=b.key, fields=b.fields,
                                                  delta_updates=b.delta_updates, backfill=b.backfill)
                      for b in msg.bindings]))
    if isinstance(msg, Apply):
        apply = pb.Request.Apply(materialization=_spec_to_proto(msg.materialization), version=msg.version,
                                 state_json=encode_json(msg.state))
        if msg.last_materialization is not None:
            apply.last_materialization.CopyFrom(_spec_to_proto(msg.last_materialization))
        return pb.Request(apply=apply)
    raise TypeError(f"not a protocol request: {msg!r}")


def request_from_proto(request: pb.Request) -> Request:
    """A driver.proto Request as its dataclass; ProtocolViolation if malformed."""
    kind = request.WhichOneof("message")
    try:
        if kind == "store":
            s = request.store
            return Store(s.binding, _array(s.key_json, "Store.key_json"), _array(s.values_json, "Store.values_json"),
                         _optional_object(s.doc_json, "Store.doc_json"), s.exists, s.delete)
        if kind == "load":
            return Load(request.load.binding, _array(request.load.key_json, "Load.key_json"))
        if kind == "acknowledge":
            return Acknowledge()
        if kind == "flush":
            return Flush()
        if kind == "start_commit":
            return StartCommit(_object(request.start_commit.runtime_checkpoint_json,
                                       "StartCommit.runtime_checkpoint_json"))
        if kind == "store_columns":
            c = request.store_columns
            return StoreColumns(c.binding, _table(c.rows_arrow), _table(c.updated_arrow), _table(c.deleted_arrow))
        if kind == "load_columns":
            return LoadColumns(request.load_columns.binding, _ipc_table(request.load_columns.keys_arrow))
        if kind == "open":
            o = request.open
            return Open(_spec_from_proto(o.spec), o.key_begin, o.key_end,
                        _object(o.driver_state_json, "Open.driver_state_json"))
        if kind == "spec":
            return Spec(request.spec.connector_type, _object(request.spec.config_json, "Spec.config_json"))
        if kind == "validate":
            v = request.validate
            return Validate(v.name, tuple(ValidateBinding(tuple(b.resource_path), tuple(b.key), dict(b.fields),
                                                          b.delta_updates, b.backfill) for b in v.bindings),
                            _object(v.config_json, "Validate.config_json"))
        if kind == "apply":
            a = request.apply
            last = _spec_from_proto(a.last_materialization) if a.HasField("last_materialization") else None
            return Apply(_spec_from_proto(a.materialization), a.version, last,
                         _object(a.state_json, "Apply.state_json"))
    except pa.ArrowException as exc:
        raise ProtocolViolation(f"malformed {kind} request: {exc!r}") from exc
    raise ProtocolViolation("request carries no message" if kind is None else f"unknown request {kind!r}")


# ---------------------------------------------------------------------------------------------- responses


def response_to_proto(msg: Response) -> pb.Response:
    """A response dataclass as a driver.proto Response (hot-path kinds first)."""
    kind = type(msg)
    if kind is Loaded:
        assert isinstance(msg, Loaded)
        return pb.Response(loaded=pb.Response.Loaded(binding=msg.binding, key_json=encode_json(msg.key),
                                                     doc_json=encode_json(msg.doc)))
    if isinstance(msg, Flushed):
        return pb.Response(flushed=pb.Response.Flushed(state=_state_to_proto(msg.state)))
    if isinstance(msg, Acknowledged):
        return pb.Response(acknowledged=pb.Response.Acknowledged(state=_state_to_proto(msg.state)))
    if isinstance(msg, StartedCommit):
        return pb.Response(started_commit=pb.Response.StartedCommit(state=_state_to_proto(msg.state)))
    if isinstance(msg, LoadedColumns):
        return pb.Response(loaded_columns=pb.Response.LoadedColumns(binding=msg.binding,
                                                                    docs_arrow=_ipc_bytes(msg.docs)))
    if isinstance(msg, Opened):
        checkpoint = b"" if msg.runtime_checkpoint is None else encode_json(msg.runtime_checkpoint)
        return pb.Response(opened=pb.Response.Opened(runtime_checkpoint_json=checkpoint))
    if isinstance(msg, ErrorResponse):
        return pb.Response(error=pb.Response.Error(message=msg.message, fenced_off=msg.fenced_off))
    if isinstance(msg, SpecResponse):
        return pb.Response(spec=pb.Response.Spec(
            protocol=msg.protocol, config_schema_json=encode_json(msg.config_schema),
            resource_config_schema_json=encode_json(msg.resource_config_schema)))
    if isinstance(msg, Validated):
        return pb.Response(validated=pb.Response.Validated(bindings=[
            pb.Response.Validated.Binding(
                resource_path=b.resource_path, delta_updates=b.delta_updates,
                constraints={name: _CONSTRAINT(type=_constraint_number(c.type), reason=c.reason)
                             for name, c in b.constraints.items()})
            for b in msg.bindings]))
    if isinstance(msg, Applied):
        return pb.Response(applied=pb.Response.Applied(action_description=msg.action_description,
                                                       state=_state_to_proto(msg.state)))
    raise TypeError(f"not a protocol response: {msg!r}")


def response_from_proto(response: pb.Response) -> Response:
    """A driver.proto Response as its dataclass; ProtocolViolation if malformed."""
    kind = response.WhichOneof("message")
    try:
        if kind == "loaded":
            r = response.loaded
            return Loaded(r.binding, _array(r.key_json, "Loaded.key_json"), _object(r.doc_json, "Loaded.doc_json"))
        if kind == "flushed":
            return Flushed(_state_from_proto(response.flushed))
        if kind == "acknowledged":
            return Acknowledged(_state_from_proto(response.acknowledged))
        if kind == "started_commit":
            return StartedCommit(_state_from_proto(response.started_commit))
        if kind == "loaded_columns":
            return LoadedColumns(response.loaded_columns.binding, _ipc_table(response.loaded_columns.docs_arrow))
        if kind == "opened":
            return Opened(_optional_object(response.opened.runtime_checkpoint_json, "Opened.runtime_checkpoint_json"))
        if kind == "error":
            return ErrorResponse(response.error.message, response.error.fenced_off)
        if kind == "spec":
            s = response.spec
            return SpecResponse(s.protocol, _object(s.config_schema_json, "Spec.config_schema_json"),
                                _object(s.resource_config_schema_json, "Spec.resource_config_schema_json"))
        if kind == "validated":
            return Validated(tuple(
                ValidatedBinding(tuple(b.resource_path),
                                 {name: FieldConstraint(_constraint_name(c.type), c.reason)
                                  for name, c in b.constraints.items()},
                                 b.delta_updates)
                for b in response.validated.bindings))
        if kind == "applied":
            return Applied(response.applied.action_description, _state_from_proto(response.applied))
    except pa.ArrowException as exc:
        raise ProtocolViolation(f"malformed {kind} response: {exc!r}") from exc
    raise ProtocolViolation("response carries no message" if kind is None else f"unknown response {kind!r}")


def _constraint_number(name: str) -> int:
    try:
        return _CONSTRAINT_NUMBERS[name]
    except KeyError:
        raise ProtocolViolation(f"unknown field constraint type {name!r}") from None


def _constraint_name(number: int) -> str:
    try:
        return _CONSTRAINT_NAMES[number]
    except KeyError:
        raise ProtocolViolation(f"invalid field constraint type {number}") from None
