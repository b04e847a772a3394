"""Wire codec of protocol messages, key identities and driver-state merge patches."""

from __future__ import annotations

import json

import pytest

from headrace.errors import ProtocolViolation
from headrace.materialize.protocol import (
    Acknowledge,
    Acknowledged,
    Binding,
    ErrorResponse,
    Flush,
    Flushed,
    Load,
    Loaded,
    MaterializationSpec,
    Message,
    Open,
    Opened,
    StartCommit,
    StartedCommit,
    StateUpdate,
    Store,
    apply_state_update,
    from_wire,
    key_identity,
    to_wire,
)

SPEC = MaterializationSpec("source_u1", (
    Binding(("headrace_internal", "source_u1"), ("idempotency_key",), ("body", "received_at"),
            {"idempotency_key": "VARCHAR", "body": "JSON", "received_at": "TIMESTAMPTZ"}),
    Binding(("events",), ("id", "seq"), ("v",), {"id": "VARCHAR", "seq": "BIGINT", "v": "DOUBLE"},
            delta_updates=True),
))

EVERY_MESSAGE: list[Message] = [
    Open(SPEC, 0, 0xFFFFFFFF, {"staged": ["f1"]}),
    Acknowledge(),
    Load(0, ["k1"]),
    Flush(),
    Store(0, ["k1"], [{"a": [1, None]}, 1_700_000_000_000_000], {"idempotency_key": "k1"}, exists=True),
    Store(1, ["x", 2], [1.5], None, exists=False, delete=True),
    StartCommit({"batch_id": 7, "offsets": {"0": 12}}),
    Opened(None),
    Opened({}),
    Acknowledged(None),
    Acknowledged(StateUpdate({"a": 1}, merge_patch=True)),
    Loaded(0, ["k1"], {"idempotency_key": "k1", "body": "ü"}),
    Flushed(StateUpdate({"b": None}, merge_patch=False)),
    StartedCommit(None),
    ErrorResponse("materialization m fenced off by another runtime (fence 3)", fenced_off=True),
    ErrorResponse("cannot connect to PostgreSQL at db:5432/x", sqlstate="08001"),
]


@pytest.mark.parametrize("msg", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_survives_json_on_the_wire(msg: Message) -> None:
    wire = json.loads(json.dumps(to_wire(msg)))
    assert wire["type"] == ("Error" if isinstance(msg, ErrorResponse) else type(msg).__name__)
    assert from_wire(wire) == msg


def test_spec_tuples_and_types_come_back_as_declared() -> None:
    opened = from_wire(json.loads(json.dumps(to_wire(Open(SPEC, 1, 2, {})))))
    assert isinstance(opened, Open)
    assert opened.spec.bindings[0].resource_path == ("headrace_internal", "source_u1")
    assert opened.spec.bindings[1].delta_updates is True


def test_error_from_a_foreign_driver_needs_only_a_message() -> None:
    assert from_wire({"type": "Error", "message": "disk full"}) == ErrorResponse("disk full", fenced_off=False)


@pytest.mark.parametrize("wire, problem", [
    ({"type": "Bogus"}, "unknown message type 'Bogus'"),
    ({"type": "Load", "binding": 0}, "malformed Load message"),
    ({"binding": 0}, "malformed"),
])
def test_malformed_messages_are_protocol_violations(wire: dict[str, object], problem: str) -> None:
    with pytest.raises(ProtocolViolation, match=problem):
        from_wire(wire)


def test_key_identity_tells_json_types_apart() -> None:
    identities = {key_identity(0, k) for k in (["1"], [1], [1.0], [True], [None], [[1]], ["[1]"])}
    assert len(identities) == 7
    assert key_identity(0, ["a"]) != key_identity(1, ["a"])
    assert key_identity(0, [{"b": 1, "a": 2}]) == key_identity(0, [{"a": 2, "b": 1}])


def test_state_updates_replace_or_merge_patch() -> None:
    state = {"a": 1, "nested": {"x": 1, "y": 2}}
    assert apply_state_update(state, None) is state
    assert apply_state_update(state, StateUpdate({"b": 2}, merge_patch=False)) == {"b": 2}
    patched = apply_state_update(state, StateUpdate({"a": None, "nested": {"y": None, "z": 3}, "c": [1]},
                                                    merge_patch=True))
    assert patched == {"nested": {"x": 1, "z": 3}, "c": [1]}
    assert state == {"a": 1, "nested": {"x": 1, "y": 2}}  # not mutated
