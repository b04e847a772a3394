"""COPY's text, csv and binary formats: PostgreSQL's exact escaping, and decode(encode(rows)) == rows."""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import HeadraceError
from headrace.pgwire import types as t
from headrace.pgwire.copy_format import BINARY_SIGNATURE, CopyEncoder, CopyOptions, decode_copy_data


def encode(options: CopyOptions, oids: list[int], rows: list[tuple[Any, ...]], names: list[str] | None = None) -> bytes:
    encoder = CopyEncoder(options, oids, names or [f"c{i}" for i in range(len(oids))])
    return encoder.header() + b"".join(encoder.row(row) for row in rows) + encoder.trailer()


def test_text_escapes_like_postgresql() -> None:
    data = encode(CopyOptions(), [t.TEXT, t.TEXT, t.INT4], [("a\tb\nc\\d\re", None, 7), ("\b\f\v", "", -1)])
    assert data == b"a\\tb\\nc\\\\d\\re\t\\N\t7\n\\b\\f\\v\t\t-1\n"


def test_text_escapes_a_custom_delimiter_and_writes_a_header() -> None:
    options = CopyOptions.parse({"delimiter": "|", "header": True, "null": "NULL"}, direction="to")
    assert encode(options, [t.TEXT, t.TEXT], [("x|y", None)], ["a|b", "c"]) == b"a\\|b|c\nx\\|y|NULL\n"


def test_csv_quotes_only_when_needed() -> None:
    options = CopyOptions.parse({"format": "csv", "header": True}, direction="to")
    data = encode(options, [t.TEXT, t.TEXT, t.TEXT, t.INT4, t.BOOL],
                  [('say "hi"', "a,b", "", 1, True), ("line\nbreak", None, "plain", None, False)],
                  ["q", "c,omma", "e", "n", "b"])
    assert data == (b'q,"c,omma",e,n,b\n'
                    b'"say ""hi""","a,b","",1,t\n'
                    b'"line\nbreak",,plain,,f\n')


def test_csv_force_quote_custom_quote_escape_and_end_marker() -> None:
    options = CopyOptions.parse({"format": "csv", "force_quote": "*", "quote": "'", "escape": "\\"}, direction="to")
    assert encode(options, [t.TEXT, t.INT4], [("it's", 5)]) == b"'it\\'s','5'\n"
    single = CopyOptions.parse({"format": "csv"}, direction="to")
    assert encode(single, [t.TEXT], [("\\.",)]) == b'"\\."\n'


def test_binary_has_signature_header_tuples_and_trailer() -> None:
    options = CopyOptions.parse({"format": "binary"}, direction="to")
    data = encode(options, [t.INT4, t.TEXT], [(1, "ab"), (None, "c")])
    expected = (BINARY_SIGNATURE + struct.pack("!ii", 0, 0)
                + struct.pack("!hi", 2, 4) + struct.pack("!i", 1) + struct.pack("!i", 2) + b"ab"
                + struct.pack("!hi", 2, -1) + struct.pack("!i", 1) + b"c"
                + struct.pack("!h", -1))
    assert data == expected


@pytest.mark.parametrize(("options", "sqlstate"), [
    ({"format": "xml"}, "22023"),
    ({"format": "binary", "delimiter": ","}, "42601"),
    ({"quote": "'"}, "0A000"),
    ({"delimiter": "ab"}, "0A000"),
    ({"format": "csv", "delimiter": '"'}, "22023"),
    ({"freeze": True, "bogus": 1}, "42601"),
    ({"header": "maybe"}, "22023"),
])
def test_invalid_options_are_refused(options: dict[str, object], sqlstate: str) -> None:
    with pytest.raises(HeadraceError) as raised:
        CopyOptions.parse(options, direction="to")
    assert raised.value.sqlstate == sqlstate


def test_text_decoding_unescapes_octal_hex_and_nulls() -> None:
    rows = decode_copy_data(CopyOptions(), b"a\\101\\x42\\n\t\\N\n\\\\N\tz\r\n", [t.TEXT, t.TEXT], ["a", "b"], "t")
    assert rows == [("aAB\n", None), ("\\N", "z")]


def test_csv_decoding_quotes_newlines_header_and_nulls() -> None:
    options = CopyOptions.parse({"format": "csv", "header": True}, direction="from")
    data = b'id,note\n1,"multi\nline, ""quoted"""\n2,\n3,""\n'
    assert decode_copy_data(options, data, [t.INT4, t.TEXT], ["id", "note"], "t") == [
        (1, 'multi\nline, "quoted"'), (2, None), (3, "")]


def test_end_of_data_marker_stops_reading() -> None:
    assert decode_copy_data(CopyOptions(), b"1\n\\.\n2\n", [t.INT4], ["a"], "t") == [(1,)]


@pytest.mark.parametrize(("data", "message", "line"), [
    (b"1\t2\n3\n", 'missing data for column "b"', 2),
    (b"1\t2\t3\n", "extra data after last expected column", 1),
])
def test_bad_rows_are_22P04_with_the_line_number(data: bytes, message: str, line: int) -> None:
    with pytest.raises(HeadraceError) as raised:
        decode_copy_data(CopyOptions(), data, [t.INT4, t.INT4], ["a", "b"], "t")
    assert (raised.value.sqlstate, raised.value.message) == ("22P04", message)
    assert raised.value.detail == f"COPY t, line {line}"


def test_bad_values_keep_their_type_error_and_say_where() -> None:
    with pytest.raises(HeadraceError) as raised:
        decode_copy_data(CopyOptions(), b"1\nx\n", [t.INT4], ["n"], "t")
    assert raised.value.sqlstate == "22P02" and raised.value.detail == 'COPY t, line 2, column n: "x"'
    options = CopyOptions.parse({"format": "csv"}, direction="from")
    with pytest.raises(HeadraceError) as raised:
        decode_copy_data(options, b'"open\n', [t.TEXT], ["n"], "t")
    assert raised.value.sqlstate == "22P04"


# Text that can be a cell: anything but NUL and lone surrogates.
cells = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
values = st.one_of(st.none(), cells)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(values, values, st.one_of(st.none(), st.integers(-2**63, 2**63 - 1))), max_size=8),
       st.sampled_from(["text", "csv"]), st.sampled_from([",", "\t", "|", ";"]), st.booleans())
def test_round_trip(rows: list[tuple[Any, ...]], fmt: str, delimiter: str, header: bool) -> None:
    options = CopyOptions.parse({"format": fmt, "delimiter": delimiter, "header": header}, direction="to")
    oids = [t.TEXT, t.VARCHAR, t.INT8]
    data = encode(options, oids, rows)
    decoded = decode_copy_data(CopyOptions.parse({"format": fmt, "delimiter": delimiter, "header": header},
                                                 direction="from"), data, oids, ["c0", "c1", "c2"], "t")
    assert decoded == rows


@settings(max_examples=100, deadline=None)
@given(st.lists(st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-10**9, max_value=10**9),
                max_size=5))
def test_numeric_round_trip_in_text(numbers: list[Decimal]) -> None:
    rows = [(number,) for number in numbers]
    data = encode(CopyOptions(), [t.NUMERIC], rows)
    assert decode_copy_data(CopyOptions(), data, [t.NUMERIC], ["n"], "t") == rows


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(values), max_size=6), st.sampled_from(["text", "csv"]))
def test_single_column_round_trip(rows: list[tuple[Any, ...]], fmt: str) -> None:
    options = CopyOptions.parse({"format": fmt}, direction="to")
    data = encode(options, [t.TEXT], rows)
    assert decode_copy_data(CopyOptions.parse({"format": fmt}, direction="from"), data, [t.TEXT], ["c"], "t") == rows
