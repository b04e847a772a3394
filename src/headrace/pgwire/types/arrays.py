"""One-dimensional arrays of any scalar codec, in text ('{1,NULL,"a b"}') and binary form.

Values are Python lists (tuples are accepted on output); multi-dimensional input is refused."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from headrace.pgwire.types.base import TypeCodec, Unsupported

_ARRAY_HEADER = struct.Struct("!iiI")  # dimensions, has-nulls flag, element type oid
_DIMENSION = struct.Struct("!ii")  # length, lower bound
_INT32 = struct.Struct("!i")
_NULL_ELEMENT = _INT32.pack(-1)
_WHITESPACE = " \t\n\r\v\f"  # PostgreSQL's array_isspace; Python's str.isspace() is broader
_NEEDS_QUOTES = frozenset('{},"\\' + _WHITESPACE)


def _quote_element(text: str) -> str:
    if text and not _NEEDS_QUOTES.intersection(text) and text.upper() != "NULL":
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _parse_text_array(text: str) -> list[tuple[str, bool]]:
    """Split an array literal into (element text, was quoted) pairs; the caller maps NULL."""
    literal = text.strip(_WHITESPACE)
    if literal.startswith("["):  # optional dimension decoration: '[1:3]={1,2,3}'
        literal = literal[literal.index("=") + 1:].strip(_WHITESPACE)
    if not (literal.startswith("{") and literal.endswith("}")):
        raise ValueError("array value must start with \"{\"")
    body, elements, position = literal[1:-1], [], 0
    if not body.strip(_WHITESPACE):
        return []
    while True:
        while position < len(body) and body[position] in _WHITESPACE:
            position += 1
        if position < len(body) and body[position] == "{":
            raise Unsupported("multidimensional arrays are not supported")
        chars: list[str] = []
        quoted = position < len(body) and body[position] == '"'
        if quoted:
            position += 1
            while position < len(body) and body[position] != '"':
                if body[position] == "\\":
                    position += 1
                chars.append(body[position])
                position += 1
            if position >= len(body):
                raise ValueError("unterminated quoted array element")
            position += 1
            element = "".join(chars)
        else:
            while position < len(body) and body[position] != ",":
                if body[position] in '{}"':
                    raise ValueError("unexpected character in array element")
                if body[position] == "\\":
                    position += 1
                chars.append(body[position])
                position += 1
            element = "".join(chars).strip(_WHITESPACE)
            if not element:
                raise ValueError("empty array element")
        elements.append((element, quoted))
        while position < len(body) and body[position] in _WHITESPACE:
            position += 1
        if position == len(body):
            return elements
        if body[position] != ",":
            raise ValueError("junk after array element")
        position += 1


def split_array_literal(text: str) -> list[str | None]:
    """A one-dimensional array literal ('{a,"b c",NULL}') as its element texts, NULL as None (for SQL casts)."""
    return [None if not quoted and element.upper() == "NULL" else element
            for element, quoted in _parse_text_array(text)]


def make_array_codec(element_oid: int, element: TypeCodec) -> TypeCodec:
    def encode_text(values: Sequence[Any]) -> bytes:
        items = ["NULL" if value is None else _quote_element(element.encode_text(value).decode("utf-8"))
                 for value in values]
        return ("{" + ",".join(items) + "}").encode("utf-8")

    def encode_binary(values: Sequence[Any]) -> bytes:
        if not values:
            return _ARRAY_HEADER.pack(0, 0, element_oid)
        parts = [_ARRAY_HEADER.pack(1, int(any(value is None for value in values)), element_oid),
                 _DIMENSION.pack(len(values), 1)]
        for value in values:
            if value is None:
                parts.append(_NULL_ELEMENT)
            else:
                cell = element.encode_binary(value)
                parts.append(_INT32.pack(len(cell)))
                parts.append(cell)
        return b"".join(parts)

    def decode_text(text: str) -> list[Any]:
        return [None if not quoted and item.upper() == "NULL" else element.decode_text(item)
                for item, quoted in _parse_text_array(text)]

    def decode_binary(data: bytes) -> list[Any]:
        dimensions, _, sent_element_oid = _ARRAY_HEADER.unpack_from(data)
        if sent_element_oid != element_oid:
            raise ValueError(f"wrong element type {sent_element_oid}, expected {element_oid}")
        if dimensions == 0:
            return []
        if dimensions != 1:
            raise Unsupported("multidimensional arrays are not supported")
        length, _ = _DIMENSION.unpack_from(data, _ARRAY_HEADER.size)
        position = _ARRAY_HEADER.size + _DIMENSION.size
        values: list[Any] = []
        for _ in range(length):
            size = _INT32.unpack_from(data, position)[0]
            position += 4
            if size == -1:
                values.append(None)
                continue
            if size < 0 or position + size > len(data):
                raise ValueError("array element length")
            values.append(element.decode_binary(data[position:position + size]))
            position += size
        if position != len(data):
            raise ValueError("trailing bytes after array elements")
        return values

    return TypeCodec(encode_text, encode_binary, decode_text, decode_binary)
