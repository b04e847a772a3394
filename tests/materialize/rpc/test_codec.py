"""codec.py: every protocol message survives dataclass -> proto -> bytes -> proto -> dataclass exactly (types of
JSON values included, integers of any size, Arrow tables with their schemas), and agrees with the TCP transport's
to_wire / from_wire; malformed messages are ProtocolViolations."""

from __future__ import annotations

import datetime
import decimal
import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import ProtocolViolation
from headrace.materialize.protocol import (
    CONSTRAINT_TYPES,
    REQUEST_TYPES,
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
    Message,
    Open,
    Opened,
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
    from_wire,
    to_wire,
)
from headrace.materialize.rpc import driver_pb2 as pb
from headrace.materialize.rpc.codec import (
    decode_json,
    request_from_proto,
    request_to_proto,
    response_from_proto,
    response_to_proto,
)
from headrace.materialize.transport import decode_payload, encode_frame

U32 = st.integers(0, 2**32 - 1)
names = st.text(max_size=12)
scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)
keys = st.lists(json_values, min_size=1, max_size=3)
states = st.none() | st.builds(StateUpdate, json_objects, st.booleans())

bindings = st.builds(
    Binding, st.lists(names, max_size=3).map(tuple), st.lists(names, max_size=3).map(tuple),
    st.lists(names, max_size=3).map(tuple), st.dictionaries(names, names, max_size=4), st.booleans())
specs = st.builds(MaterializationSpec, names, st.lists(bindings, max_size=3).map(tuple), json_objects)
validate_bindings = st.builds(ValidateBinding, st.lists(names, max_size=3).map(tuple),
                              st.lists(names, max_size=3).map(tuple), st.dictionaries(names, names, max_size=4),
                              st.booleans(), U32)
constraints = st.builds(FieldConstraint, st.sampled_from(CONSTRAINT_TYPES), st.text(max_size=20))
validated_bindings = st.builds(ValidatedBinding, st.lists(names, max_size=3).map(tuple),
                               st.dictionaries(names, constraints, max_size=4), st.booleans())

# Arrow columns of the types the columnar path carries, DuckDB's own Arrow types included, with nulls.
_UTC = datetime.timezone.utc
_ARROW_COLUMNS: list[tuple[pa.DataType, st.SearchStrategy[Any]]] = [
    (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.float64(), st.floats(allow_nan=False)),
    (pa.bool_(), st.booleans()),
    (pa.string(), st.text(max_size=10)),
    (pa.large_string(), st.text(max_size=10)),
    (pa.binary(), st.binary(max_size=10)),
    (pa.timestamp("us", tz="UTC"), st.datetimes(timezones=st.just(_UTC))),
    (pa.decimal128(18, 2), st.decimals(-(10**15), 10**15, places=2, allow_nan=False, allow_infinity=False)),
    (pa.date32(), st.dates()),
]


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    rows = draw(st.integers(0, 5))
    columns = draw(st.lists(st.sampled_from(range(len(_ARROW_COLUMNS))), min_size=1, max_size=4))
    arrays, fields = [], []
    for position, index in enumerate(columns):
        arrow_type, values = _ARROW_COLUMNS[index]
        data = draw(st.lists(st.none() | values, min_size=rows, max_size=rows))
        arrays.append(pa.array(data, arrow_type))
        fields.append(f"c{position}")
    return pa.table(arrays, names=fields)


optional_tables = st.none() | tables()

requests = st.one_of(
    st.builds(Spec, names, json_objects),
    st.builds(Validate, names, st.lists(validate_bindings, max_size=3).map(tuple), json_objects),
    st.builds(Apply, specs, names, st.none() | specs, json_objects),
    st.builds(Open, specs, U32, U32, json_objects),
    st.just(Acknowledge()),
    st.builds(Load, U32, keys),
    st.builds(LoadColumns, U32, tables()),
    st.just(Flush()),
    st.builds(Store, U32, keys, st.lists(json_values, max_size=4), st.none() | json_objects, st.booleans(),
              st.booleans()),
    st.builds(StoreColumns, U32, optional_tables, optional_tables, optional_tables),
    st.builds(StartCommit, json_objects),
)
responses = st.one_of(
    st.builds(SpecResponse, U32, json_objects, json_objects),
    st.builds(Validated, st.lists(validated_bindings, max_size=3).map(tuple)),
    st.builds(Applied, st.text(max_size=20), states),
    st.builds(Opened, st.none() | json_objects),
    st.builds(Acknowledged, states),
    st.builds(Loaded, U32, keys, json_objects),
    st.builds(LoadedColumns, U32, tables()),
    st.builds(Flushed, states),
    st.builds(StartedCommit, states),
    st.builds(ErrorResponse, st.text(max_size=40), st.booleans()),
)


def typed(value: Any) -> Any:
    """A value with the type of every JSON leaf made explicit (1, 1.0 and True compare equal in Python)."""
    if isinstance(value, dict):
        return {"dict": {k: typed(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return [typed(v) for v in value]
    if isinstance(value, (bytes, pa.Table)):
        return "<blob>"  # tables are compared as tables
    return (type(value).__name__, value)


def tables_of(msg: Message) -> list[pa.Table | None]:
    return [getattr(msg, name) for name in ("rows", "updated", "deleted", "keys", "docs") if hasattr(msg, name)]


def assert_same(decoded: Message, original: Message) -> None:
    assert type(decoded) is type(original)
    assert typed(to_wire(decoded)) == typed(to_wire(original))
    for got, want in zip(tables_of(decoded), tables_of(original), strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            assert got is not None and got.equals(want, check_metadata=True)
    if not tables_of(original):
        assert decoded == original


def through_proto(msg: Message) -> Message:
    if isinstance(msg, REQUEST_TYPES):
        return request_from_proto(pb.Request.FromString(request_to_proto(msg).SerializeToString()))
    return response_from_proto(pb.Response.FromString(response_to_proto(msg).SerializeToString()))


@settings(max_examples=400, deadline=None)
@given(requests)
def test_every_request_survives_the_proto_exactly(msg: Message) -> None:
    assert_same(through_proto(msg), msg)


@settings(max_examples=400, deadline=None)
@given(responses)
def test_every_response_survives_the_proto_exactly(msg: Message) -> None:
    assert_same(through_proto(msg), msg)


@settings(max_examples=200, deadline=None)
@given(requests | responses)
def test_the_proto_and_the_tcp_frames_agree(msg: Message) -> None:
    over_tcp = from_wire(decode_payload(encode_frame(to_wire(msg))[4:]))
    assert_same(through_proto(msg), over_tcp)


def test_each_message_kind_has_its_own_oneof_member() -> None:
    table = pa.table({"k": ["a"]})
    kinds = {request_to_proto(msg).WhichOneof("message") for msg in (
        Spec(), Validate("m", ()), Apply(MaterializationSpec("m", ())), Open(MaterializationSpec("m", ()), 0, 1),
        Acknowledge(), Load(0, ["a"]), LoadColumns(0, table), Flush(), Store(0, ["a"], [], None, False),
        StoreColumns(0, rows=table), StartCommit({}))}
    assert len(kinds) == len(REQUEST_TYPES) == len(pb.Request.DESCRIPTOR.oneofs_by_name["message"].fields)
    answers = {response_to_proto(msg).WhichOneof("message") for msg in (
        SpecResponse(1, {}, {}), Validated(()), Applied(""), Opened(None), Acknowledged(), Loaded(0, ["a"], {}),
        LoadedColumns(0, table), Flushed(), StartedCommit(), ErrorResponse("x"))}
    assert len(answers) == len(pb.Response.DESCRIPTOR.oneofs_by_name["message"].fields)


def test_none_and_empty_objects_stay_apart() -> None:
    assert through_proto(Opened(None)) == Opened(None)
    assert through_proto(Opened({})) == Opened({})
    assert through_proto(Store(0, ["k"], [], None, False)).doc is None  # type: ignore[union-attr]
    assert through_proto(Store(0, ["k"], [], {}, True, delete=True)).doc == {}  # type: ignore[union-attr]
    assert through_proto(Acknowledged(None)) == Acknowledged(None)
    assert through_proto(Acknowledged(StateUpdate({}, False))) == Acknowledged(StateUpdate({}, False))


def test_json_from_other_languages_keeps_big_integers_exact() -> None:
    # A foreign driver writes plain JSON: no leading space marks its big integers.
    assert decode_json(b'{"n": 123456789012345678901234567890, "m": -9223372036854775809}') == \
        {"n": 123456789012345678901234567890, "m": -9223372036854775809}
    loaded = response_from_proto(pb.Response(loaded=pb.Response.Loaded(
        binding=0, key_json=b"[18446744073709551616]", doc_json=b'{"v": 1.5, "d": "12.30"}')))
    assert loaded == Loaded(0, [2**64], {"v": 1.5, "d": "12.30"})
    assert json.dumps(loaded.key) == "[18446744073709551616]"  # type: ignore[union-attr]


def test_decimals_dates_and_timestamps_in_arrow_survive() -> None:
    table = pa.table({"d": pa.array([decimal.Decimal("12.30")], pa.decimal128(18, 2)),
                      "t": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=_UTC)],
                                    pa.timestamp("us", tz="UTC")),
                      "day": pa.array([datetime.date(2024, 2, 29)], pa.date32())})
    decoded = through_proto(StoreColumns(1, updated=table))
    assert isinstance(decoded, StoreColumns) and decoded.rows is None and decoded.deleted is None
    assert decoded.updated is not None and decoded.updated.equals(table, check_metadata=True)


@pytest.mark.parametrize("message, problem", [
    (pb.Request(), "request carries no message"),
    (pb.Request(load=pb.Request.Load(binding=0, key_json=b"{")), "malformed JSON member"),
    (pb.Request(load=pb.Request.Load(binding=0, key_json=b'{"a": 1}')), "Load.key_json must be a JSON array"),
    (pb.Request(load=pb.Request.Load(binding=0)), "Load.key_json must be a JSON array"),
    (pb.Request(start_commit=pb.Request.StartCommit(runtime_checkpoint_json=b"[1]")),
     "StartCommit.runtime_checkpoint_json must be a JSON object"),
    (pb.Request(store_columns=pb.Request.StoreColumns(binding=0, rows_arrow=b"not arrow")),
     "malformed store_columns request"),
    (pb.Response(), "response carries no message"),
    (pb.Response(validated=pb.Response.Validated(bindings=[pb.Response.Validated.Binding(
        constraints={"f": pb.Response.Validated.Constraint(type=0)})])), "invalid field constraint type 0"),
    (pb.Response(loaded=pb.Response.Loaded(binding=0, key_json=b"[1]", doc_json=b"\xff")), "malformed JSON"),
])
def test_malformed_messages_are_protocol_violations(message: Any, problem: str) -> None:
    decode = request_from_proto if isinstance(message, pb.Request) else response_from_proto
    with pytest.raises(ProtocolViolation, match=problem):
        decode(message)


def test_an_unknown_constraint_type_is_refused_on_the_way_out() -> None:
    with pytest.raises(ProtocolViolation, match="unknown field constraint type 'MAYBE'"):
        response_to_proto(Validated((ValidatedBinding(("t",), {"f": FieldConstraint("MAYBE", "")}, False),)))
