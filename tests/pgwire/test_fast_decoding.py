"""The unchecked fast decoders of the per-query messages (Parse, Bind, Describe, Execute, Query, Sync,
Flush) agree with the checked decoders on every body: the same message, or the same ProtocolViolation."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import ProtocolViolation
from headrace.pgwire import messages as m
from headrace.pgwire.messages import frontend

from . import wire_client as wc

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
format_codes = st.lists(st.integers(-2, 2), max_size=3)
valid_messages = st.one_of(
    st.builds(wc.query, texts),
    st.builds(wc.parse, texts, texts, st.lists(st.integers(0, 2**32 - 1), max_size=3)),
    st.builds(wc.bind, texts, texts, st.lists(st.one_of(st.none(), st.binary(max_size=8)), max_size=3),
              format_codes, format_codes),
    st.builds(wc.describe, st.sampled_from("SP"), texts),
    st.builds(wc.execute, texts, st.integers(-2**31, 2**31 - 1)),
    st.just(wc.sync()),
    st.just(wc.flush()),
)


def checked(type_byte: bytes, body: bytes) -> m.FrontendMessage | str:
    """What the checked decoder alone makes of the body (the message, or its error text)."""
    try:
        return frontend._TYPED_DECODERS[type_byte][1](frontend._Reader(body))
    except ProtocolViolation as exc:
        return str(exc)


def decoded(type_byte: bytes, body: bytes) -> m.FrontendMessage | str:
    decoder = m.FrontendDecoder()
    decoder.feed(wc.startup({"user": "u"}))
    try:
        [message] = decoder.feed(type_byte + struct.pack("!i", len(body) + 4) + body)
    except ProtocolViolation as exc:
        return str(exc)
    return message


@given(valid_messages)
def test_valid_messages_decode_as_the_checked_decoder_does(wire: bytes) -> None:
    type_byte, body = wire[:1], wire[5:]
    result = decoded(type_byte, body)
    assert not isinstance(result, str)
    assert result == checked(type_byte, body)


@given(valid_messages, st.data())
def test_damaged_messages_fail_or_decode_as_the_checked_decoder_does(wire: bytes, data: st.DataObject) -> None:
    type_byte, body = wire[:1], bytearray(wire[5:])
    for _ in range(data.draw(st.integers(1, 3))):
        action = data.draw(st.sampled_from(["flip", "cut", "extend"]))
        if action == "flip" and body:
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
        elif action == "cut" and body:
            del body[data.draw(st.integers(0, len(body) - 1)):]
        else:
            body += data.draw(st.binary(min_size=1, max_size=4))
    assert decoded(type_byte, bytes(body)) == checked(type_byte, bytes(body))
