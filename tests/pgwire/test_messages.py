"""The wire codec: frontend decoding (whole and split at any byte), backend encoding (known bytes and
a round trip through the independent decoder in wire_client)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import ProtocolViolation
from headrace.pgwire import messages as m

from . import wire_client as wc

# --- frontend decoding --------------------------------------------------------------------------

STARTUP_PARAMS = {"user": "headrace", "database": "headrace", "application_name": "psql"}


def decode_all(data: bytes, *, after_startup: bool = True) -> list[m.FrontendMessage]:
    decoder = m.FrontendDecoder()
    if after_startup:
        assert decoder.feed(wc.startup({"user": "u"})) == [m.StartupMessage(m.PROTOCOL_3_0, {"user": "u"})]
    return decoder.feed(data)


@pytest.mark.parametrize("wire, expected", [
    (wc.startup(STARTUP_PARAMS), m.StartupMessage(196608, STARTUP_PARAMS)),
    (wc.startup({}, version=(3 << 16) | 2), m.StartupMessage((3 << 16) | 2, {})),
    (wc.startup({}, version=2 << 16), m.StartupMessage(2 << 16, {})),
    (wc.ssl_request(), m.SSLRequest()),
    (wc.gssenc_request(), m.GSSENCRequest()),
    (wc.cancel_request(42, 0xFFFFFFFE), m.CancelRequest(42, 0xFFFFFFFE)),
])
def test_startup_phase_packets(wire: bytes, expected: m.FrontendMessage) -> None:
    assert decode_all(wire, after_startup=False) == [expected]


def test_startup_packet_known_bytes() -> None:
    wire = b"\0\0\0\x14" b"\0\3\0\0" b"user\0alice\0\0"
    assert decode_all(wire, after_startup=False) == [m.StartupMessage(196608, {"user": "alice"})]


def test_ssl_request_keeps_the_decoder_in_the_startup_phase() -> None:
    decoder = m.FrontendDecoder()
    stream = wc.ssl_request() + wc.startup({"user": "u"}) + wc.query("SELECT 1")
    assert decoder.feed(stream) == [m.SSLRequest(), m.StartupMessage(196608, {"user": "u"}),
                                    m.Query("SELECT 1")]


@pytest.mark.parametrize("wire, expected", [
    (wc.query("SELECT 'é'"), m.Query("SELECT 'é'")),
    (wc.parse("s1", "SELECT $1", [23, 0]), m.Parse("s1", "SELECT $1", (23, 0))),
    (wc.parse("", "SELECT 1"), m.Parse("", "SELECT 1", ())),
    (wc.bind("p", "s", [b"5", None, b""], [0, 1, 0], [1]),
     m.Bind("p", "s", (0, 1, 0), (b"5", None, b""), (1,))),
    (wc.bind("", ""), m.Bind("", "", (), (), ())),
    (wc.describe("S", "s1"), m.Describe("S", "s1")),
    (wc.describe("P", ""), m.Describe("P", "")),
    (wc.execute("p", 10), m.Execute("p", 10)),
    (wc.close("S", "s1"), m.Close("S", "s1")),
    (wc.close("P", "p"), m.Close("P", "p")),
    (wc.sync(), m.Sync()),
    (wc.flush(), m.Flush()),
    (wc.terminate(), m.Terminate()),
    (wc.copy_data(b"\0\1"), m.CopyData(b"\0\1")),
    (wc.copy_done(), m.CopyDone()),
    (wc.copy_fail("nope"), m.CopyFail("nope")),
    (wc.password(b"secret\0"), m.PasswordMessage(b"secret\0")),
])
def test_typed_messages(wire: bytes, expected: m.FrontendMessage) -> None:
    assert decode_all(wire) == [expected]


def test_known_bytes_of_a_sync_and_an_execute() -> None:
    assert decode_all(b"S\0\0\0\4" + b"E\0\0\0\x09\0\0\0\0\5") == [m.Sync(), m.Execute("", 5)]


@pytest.mark.parametrize("wire, match", [
    (b"F\0\0\0\4", "invalid frontend message type 70"),
    (b"Z\0\0\0\4", "invalid frontend message type 90"),
    (b"S\0\0\0\3", "invalid message length"),
    (b"S\0\0\0\5\0", "invalid message format"),  # Sync has no body
    (b"E" + struct.pack("!i", 20_000) + b"\0" * 20_000, "invalid message length"),  # small-message limit
    (wc.describe("X", "s"), "invalid DESCRIBE message subtype"),
    (wc.close("X", "s"), "invalid CLOSE message subtype"),
    (b"Q\0\0\0\x06ab", "invalid string"),  # no terminating NUL
    (b"Q\0\0\0\x06\xff\0", "invalid byte sequence"),
    (b"B\0\0\0\x0b\0\0\0\0\1\0\0", "invalid message format"),  # format count overruns the body
])
def test_malformed_messages_raise_protocol_violation(wire: bytes, match: str) -> None:
    with pytest.raises(ProtocolViolation, match=match):
        decode_all(wire)


@pytest.mark.parametrize("wire", [struct.pack("!i", 4), struct.pack("!i", 20_000)])
def test_bad_startup_length(wire: bytes) -> None:
    with pytest.raises(ProtocolViolation, match="invalid length of startup packet"):
        decode_all(wire, after_startup=False)


def test_messages_before_a_malformed_one_are_still_delivered() -> None:
    decoder = m.FrontendDecoder()
    decoder.push(wc.startup({"user": "u"}) + wc.query("SELECT 1") + b"?\0\0\0\4")
    assert decoder.next_message() == m.StartupMessage(196608, {"user": "u"})
    assert decoder.next_message() == m.Query("SELECT 1")
    with pytest.raises(ProtocolViolation):
        decoder.next_message()


def test_incomplete_input_waits_for_more() -> None:
    decoder = m.FrontendDecoder()
    wire = wc.startup({"user": "u"}) + wc.query("SELECT 1")
    assert decoder.feed(wire[:-1]) == [m.StartupMessage(196608, {"user": "u"})]
    assert decoder.feed(wire[-1:]) == [m.Query("SELECT 1")]
    assert decoder.feed(b"") == []


# Any client byte stream, split anywhere, decodes to the same messages.
names = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
oids = st.integers(0, 2**32 - 1)
int16s = st.integers(0, 1)
frontend_messages = st.one_of(
    names.map(m.Query),
    st.builds(m.Parse, names, names, st.lists(oids, max_size=4).map(tuple)),
    st.builds(m.Bind, names, names, st.lists(int16s, max_size=3).map(tuple),
              st.lists(st.one_of(st.none(), st.binary(max_size=10)), max_size=4).map(tuple),
              st.lists(int16s, max_size=3).map(tuple)),
    st.builds(m.Describe, st.sampled_from(["S", "P"]), names),
    st.builds(m.Execute, names, st.integers(-(2**31), 2**31 - 1)),
    st.builds(m.Close, st.sampled_from(["S", "P"]), names),
    st.just(m.Sync()), st.just(m.Flush()), st.just(m.CopyDone()),
    st.binary(max_size=20).map(m.CopyData),
)


def encode_frontend(message: m.FrontendMessage) -> bytes:
    match message:
        case m.Query(sql):
            return wc.query(sql)
        case m.Parse(statement, sql, param_types):
            return wc.parse(statement, sql, param_types)
        case m.Bind(portal, statement, param_formats, params, result_formats):
            return wc.bind(portal, statement, params, param_formats, result_formats)
        case m.Describe(kind, name):
            return wc.describe(kind, name)
        case m.Execute(portal, max_rows):
            return wc.execute(portal, max_rows)
        case m.Close(kind, name):
            return wc.close(kind, name)
        case m.Sync():
            return wc.sync()
        case m.Flush():
            return wc.flush()
        case m.CopyDone():
            return wc.copy_done()
        case m.CopyData(data):
            return wc.copy_data(data)
    raise AssertionError(message)


@given(st.dictionaries(names.filter(bool), names, max_size=3), st.lists(frontend_messages, max_size=8),
       st.data())
def test_any_split_of_a_stream_decodes_to_the_same_messages(
        parameters: dict[str, str], typed: list[m.FrontendMessage], data: st.DataObject) -> None:
    stream = wc.startup(parameters) + b"".join(encode_frontend(message) for message in typed)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = m.FrontendDecoder()
    decoded: list[m.FrontendMessage] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += decoder.feed(stream[start:end])
    assert decoded == [m.StartupMessage(196608, parameters), *typed]


# --- backend encoding ---------------------------------------------------------------------------

@pytest.mark.parametrize("encoded, known", [
    (m.authentication_ok(), b"R\0\0\0\x08\0\0\0\0"),
    (m.authentication_cleartext_password(), b"R\0\0\0\x08\0\0\0\3"),
    (m.authentication_sasl(["SCRAM-SHA-256"]), b"R\0\0\0\x17\0\0\0\x0aSCRAM-SHA-256\0\0"),
    (m.parameter_status("a", "b"), b"S\0\0\0\x08a\0b\0"),
    (m.backend_key_data(1, 2), b"K\0\0\0\x0c\0\0\0\1\0\0\0\2"),
    (m.ready_for_query("I"), b"Z\0\0\0\5I"),
    (m.command_complete("SELECT 1"), b"C\0\0\0\x0dSELECT 1\0"),
    (m.empty_query_response(), b"I\0\0\0\4"),
    (m.parse_complete(), b"1\0\0\0\4"),
    (m.bind_complete(), b"2\0\0\0\4"),
    (m.close_complete(), b"3\0\0\0\4"),
    (m.no_data(), b"n\0\0\0\4"),
    (m.portal_suspended(), b"s\0\0\0\4"),
    (m.parameter_description([23, 25]), b"t\0\0\0\x0e\0\2\0\0\0\x17\0\0\0\x19"),
    (m.data_row([b"1", None]), b"D\0\0\0\x0f\0\2\0\0\0\1" + b"1" + b"\xff\xff\xff\xff"),
    (m.row_description([("a", 23, 4, -1, 0)]),
     b"T\0\0\0\x1a\0\1a\0" + b"\0\0\0\0\0\0\0\0\0\x17\0\4\xff\xff\xff\xff\0\0"),
    (m.error_response("ERROR", "42601", "bad"),
     b"E\0\0\0\x1fSERROR\0VERROR\0C42601\0Mbad\0\0"),
    (m.negotiate_protocol_version(0, ["_pq_.x"]), b"v\0\0\0\x13\0\0\0\0\0\0\0\1_pq_.x\0"),
])
def test_backend_known_bytes(encoded: bytes, known: bytes) -> None:
    assert encoded == known


def test_backend_messages_round_trip_through_a_client_decoder() -> None:
    stream = b"".join([
        m.authentication_ok(), m.authentication_sasl(["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"]),
        m.authentication_sasl_continue(b"r=abc"), m.authentication_sasl_final(b"v=xyz"),
        m.parameter_status("server_version", "16.0"), m.backend_key_data(0xFFFFFFFF, -1),
        m.row_description([("é", 1184, 8, -1, 1), ("n", 1700, -1, 65540, 0)]),
        m.data_row([b"", None, b"\0" * 300]),
        m.command_complete("INSERT 0 3"), m.empty_query_response(),
        m.error_response("FATAL", "08P01", "boom", detail="d", hint="h", position=7),
        m.notice_response("NOTICE", "00000", "hello", detail="d2"),
        m.parse_complete(), m.bind_complete(), m.close_complete(), m.no_data(), m.portal_suspended(),
        m.parameter_description([]), m.parameter_description([2**32 - 1]),
        m.negotiate_protocol_version(0, []), m.ready_for_query("E"),
    ])
    assert wc.decode_backend(stream) == [
        ("R", 0), ("R", 10, ["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"]), ("R", 11, b"r=abc"),
        ("R", 12, b"v=xyz"), ("S", "server_version", "16.0"), ("K", 0xFFFFFFFF, 0xFFFFFFFF),
        ("T", [("é", 1184, 8, -1, 1), ("n", 1700, -1, 65540, 0)]), ("D", [b"", None, b"\0" * 300]),
        ("C", "INSERT 0 3"), ("I",),
        ("E", {"S": "FATAL", "V": "FATAL", "C": "08P01", "M": "boom", "D": "d", "H": "h", "P": "7"}),
        ("N", {"S": "NOTICE", "V": "NOTICE", "C": "00000", "M": "hello", "D": "d2"}),
        ("1",), ("2",), ("3",), ("n",), ("s",), ("t", []), ("t", [2**32 - 1]), ("v", 0, []), ("Z", "E"),
    ]


def test_append_data_rows_encodes_each_column_with_its_encoder() -> None:
    out = bytearray(b"prefix")
    m.append_data_rows(out, [(1, "a"), (None, "b")], [lambda v: b"%d" % v, str.encode])
    assert out.startswith(b"prefix")
    assert wc.decode_backend(bytes(out[6:])) == [("D", [b"1", b"a"]), ("D", [None, b"b"])]


def test_append_data_rows_rejects_rows_of_the_wrong_width() -> None:
    with pytest.raises(ValueError, match="row has 1 values but the result has 2 columns"):
        m.append_data_rows(bytearray(), [(1,)], [str.encode, str.encode])


@given(st.lists(st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=3, max_size=3), max_size=20))
def test_data_rows_round_trip(rows: list[list[bytes | None]]) -> None:
    out = bytearray()
    m.append_data_rows(out, rows, [bytes] * 3)
    assert wc.decode_backend(bytes(out)) == [("D", row) for row in rows]
