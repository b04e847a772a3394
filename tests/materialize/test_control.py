"""Spec, Validate and Apply: the control requests, against the real serving-store connector over TCP."""

from __future__ import annotations

import pytest

from headrace.materialize.lifecycle import TransactionLifecycle
from headrace.materialize.protocol import (
    FIELD_FORBIDDEN,
    INCOMPATIBLE,
    LOCATION_RECOMMENDED,
    LOCATION_REQUIRED,
    PROTOCOL_VERSION,
    Acknowledge,
    Applied,
    Apply,
    Binding,
    FieldConstraint,
    InvalidFieldSelection,
    MaterializationError,
    MaterializationSpec,
    Open,
    Opened,
    ProtocolOrderError,
    Spec,
    SpecResponse,
    Validate,
    ValidateBinding,
    Validated,
    ValidatedBinding,
    check_field_selection,
)

from .conftest import WEBHOOK_COLUMNS, DriverServer, webhook_doc, webhook_spec

SPEC = webhook_spec()
OPEN = Open(SPEC, 0, 0xFFFFFFFF, {})


# ---------------------------------------------------------------------------------------------- ordering


def test_control_requests_come_before_open_each_answered() -> None:
    machine = TransactionLifecycle()
    machine.on_request(Spec())
    machine.on_response(SpecResponse(PROTOCOL_VERSION, {}, {}))
    machine.on_request(Validate("m", ()))
    machine.on_response(Validated(()))
    machine.on_request(Apply(SPEC))
    machine.on_response(Applied("created"))
    machine.on_request(OPEN)
    machine.on_response(Opened(None))  # the first response of the transactions, after control answers
    machine.on_request(Acknowledge())


@pytest.mark.parametrize("steps, problem", [
    ([("req", Spec()), ("req", Validate("m", ()))], "Validate sent before Spec \\(response\\) answered Spec"),
    ([("req", Apply(SPEC)), ("req", OPEN)], "Open sent before Applied answered Apply"),
    ([("resp", Validated(()))], "Validated must answer Validate, but the last request is nothing"),
    ([("req", Validate("m", ())), ("resp", Applied("x"))], "Applied must answer Apply, but the last request is "
                                                           "Validate"),
    ([("req", Apply(SPEC)), ("resp", Applied("x")), ("resp", Applied("x"))], "already answered"),
    ([("req", OPEN), ("req", Spec())], "Spec \\(a control request\\) must be the first request, but follows Open"),
])
def test_control_ordering_violations_name_both_messages(steps: list[tuple[str, object]], problem: str) -> None:
    machine = TransactionLifecycle()
    for side, msg in steps[:-1]:
        (machine.on_request if side == "req" else machine.on_response)(msg)  # type: ignore[arg-type]
    side, msg = steps[-1]
    with pytest.raises(ProtocolOrderError, match=problem):
        (machine.on_request if side == "req" else machine.on_response)(msg)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- field selection


def validated(**constraints: str) -> Validated:
    return Validated((ValidatedBinding(SPEC.bindings[0].resource_path,
                                       {name: FieldConstraint(kind, "because") for name, kind in constraints.items()},
                                       False),))


def test_a_selection_honouring_every_constraint_passes() -> None:
    check_field_selection(SPEC, validated(idempotency_key=LOCATION_REQUIRED, body=LOCATION_RECOMMENDED,
                                          received_at=LOCATION_RECOMMENDED, extra="FIELD_OPTIONAL"))


@pytest.mark.parametrize("constraints, problem", [
    ({"body": FIELD_FORBIDDEN}, "field 'body' is selected but FIELD_FORBIDDEN \\(because\\)"),
    ({"received_at": INCOMPATIBLE}, "field 'received_at' is selected but INCOMPATIBLE"),
    ({"must": "FIELD_REQUIRED"}, "field 'must' is FIELD_REQUIRED but not selected"),
    ({"body": None}, "field 'body' is not a field of the collection"),
])
def test_a_bad_selection_is_refused_with_the_reason(constraints: dict[str, str | None], problem: str) -> None:
    base = {"idempotency_key": LOCATION_REQUIRED, "body": LOCATION_RECOMMENDED, "received_at": LOCATION_RECOMMENDED}
    merged = {name: kind for name, kind in {**base, **constraints}.items() if kind is not None}
    with pytest.raises(InvalidFieldSelection, match=problem) as info:
        check_field_selection(SPEC, validated(**merged))
    assert info.value.sqlstate == "22023"


# ---------------------------------------------------------------------------------------------- over the wire


def test_spec_validate_apply_then_open(driver_server: DriverServer) -> None:
    runtime = driver_server.runtime(SPEC)
    assert runtime.spec_of_driver().protocol == PROTOCOL_VERSION
    answer = runtime.validate()
    assert answer.bindings[0].constraints["idempotency_key"].type == LOCATION_REQUIRED
    assert answer.bindings[0].constraints["body"].type == LOCATION_RECOMMENDED
    assert "created table" in runtime.apply().action_description
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"n": 1})
    with pytest.raises(MaterializationError, match="Apply must come before open"):
        runtime.apply()
    runtime.close()


def test_re_applying_is_a_no_op_and_a_new_column_migrates(driver_server: DriverServer) -> None:
    for _ in range(2):
        runtime = driver_server.runtime(SPEC)
        runtime.apply()
        runtime.close()
    again = driver_server.runtime(SPEC)
    assert again.apply().action_description == "no changes"
    again.close()
    wider = MaterializationSpec(SPEC.name, (Binding(SPEC.bindings[0].resource_path, ("idempotency_key",),
                                                    ("body", "received_at", "n"), {**WEBHOOK_COLUMNS, "n": "BIGINT"}),))
    runtime = driver_server.runtime(wider)
    runtime.validate()
    assert runtime.apply(last_spec=SPEC).action_description.startswith("added column 'n' BIGINT")
    runtime.open()
    runtime.transact([(0, ["a"], {**webhook_doc("a", 1), "n": 5})], {"n": 1})
    cursor = driver_server.store.cursor()
    assert cursor.execute("SELECT n FROM headrace_internal.source_u1").fetchall() == [(5,)]
    runtime.close()


def test_the_serving_store_refuses_reserved_unsupported_and_retyped_fields(driver_server: DriverServer) -> None:
    driver_server.store.apply(SPEC.bindings[0])
    proposal = ValidateBinding(SPEC.bindings[0].resource_path, ("idempotency_key",), {
        "idempotency_key": "VARCHAR", "body": "BIGINT", "hr_timestamp": "BIGINT", "blob": "HUGEINT", "ok": "BOOLEAN"})
    runtime = driver_server.runtime(SPEC)
    with pytest.raises(InvalidFieldSelection) as info:
        runtime.validate([proposal])
    message = str(info.value)
    assert "field 'body' is selected but INCOMPATIBLE (the existing column has type JSON, not BIGINT)" in message
    assert "field 'received_at' is not a field of the collection" in message
    raw = runtime._control(Validate(SPEC.name, (proposal,)), Validated)  # the answer itself
    assert isinstance(raw, Validated)
    kinds = {name: c.type for name, c in raw.bindings[0].constraints.items()}
    assert kinds == {"idempotency_key": LOCATION_REQUIRED, "body": INCOMPATIBLE, "hr_timestamp": FIELD_FORBIDDEN,
                     "blob": INCOMPATIBLE, "ok": LOCATION_RECOMMENDED}
    runtime.close()
