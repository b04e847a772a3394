"""What the store refuses in a webhook row, by PostgreSQL 15's rules: one function per column kind, used at ingest
(refused with 400 before anything is written: webhook/handler.py) and by the pipeline (a record already in the log
that breaks them is quarantined instead of failing its batch for good: pipeline/quarantine.py).

- jsonb (BODY FORMAT JSON / JSON ARRAY, the headers map): no \\u0000 escape (22P05) and no lone UTF-16 surrogate
  escape (22P02); raw UTF-8 surrogates are invalid UTF-8, which the JSON decoders refuse already.
- text (BODY FORMAT TEXT, INCLUDE HEADER columns, the idempotency key): valid UTF-8 without NUL (22021).

Messages are PostgreSQL 15's own (`SELECT '"\\ud800"'::jsonb`, `SELECT '"\\u0000"'::jsonb`, a NUL in text).

Cheap in the common case: a body without a backslash costs one memchr, one without `\\u` a substring search; only a
body with `\\u` escapes is walked escape by escape."""

from __future__ import annotations

import re
from typing import NamedTuple

INVALID_TEXT_REPRESENTATION = "22P02"
UNTRANSLATABLE_CHARACTER = "22P05"
CHARACTER_NOT_IN_REPERTOIRE = "22021"


class StoreRefusal(NamedTuple):
    """Why the store would refuse a value: SQLSTATE, PostgreSQL's message and detail."""

    sqlstate: str
    message: str
    detail: str = ""

    def describe(self) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.message}{detail} (SQLSTATE {self.sqlstate})"


_JSON_SYNTAX = "invalid input syntax for type json"
LOW_SURROGATE_EXPECTED = StoreRefusal(INVALID_TEXT_REPRESENTATION, _JSON_SYNTAX,
                                      "Unicode low surrogate must follow a high surrogate.")
HIGH_AFTER_HIGH = StoreRefusal(INVALID_TEXT_REPRESENTATION, _JSON_SYNTAX,
                               "Unicode high surrogate must not follow a high surrogate.")
NUL_ESCAPE = StoreRefusal(UNTRANSLATABLE_CHARACTER, "unsupported Unicode escape sequence",
                          "\\u0000 cannot be converted to text.")
NUL_IN_TEXT = StoreRefusal(CHARACTER_NOT_IN_REPERTOIRE, 'invalid byte sequence for encoding "UTF8": 0x00')

# A backslash and what it escapes: `\\` is consumed whole, so the `\u` of `\\u0000` is not an escape.
_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def jsonb_refusal(text: bytes) -> StoreRefusal | None:
    """Why jsonb refuses JSON text that is otherwise valid JSON (the caller parsed it), or None."""
    # The common case, nothing to walk: a one-byte search (memchr) first, ~4x cheaper than `b"\\u" in text`.
    if text.find(b"\\") < 0 or b"\\u" not in text:
        return None
    high_end = -1  # where the last high surrogate escape ended, while it waits for its low half
    for escape in _ESCAPE.finditer(text):
        digits = escape.group(1)
        if digits is None:
            if high_end >= 0:
                return LOW_SURROGATE_EXPECTED
            continue
        code = int(digits, 16)
        if high_end >= 0:
            if escape.start() == high_end and 0xDC00 <= code <= 0xDFFF:
                high_end = -1
                continue
            return HIGH_AFTER_HIGH if escape.start() == high_end and 0xD800 <= code <= 0xDBFF \
                else LOW_SURROGATE_EXPECTED
        if code == 0:
            return NUL_ESCAPE
        if 0xD800 <= code <= 0xDBFF:
            high_end = escape.end()
        elif 0xDC00 <= code <= 0xDFFF:
            return LOW_SURROGATE_EXPECTED
    return LOW_SURROGATE_EXPECTED if high_end >= 0 else None


def text_refusal(text: str) -> StoreRefusal | None:
    """Why a text column refuses this (decoded) text, or None: NUL, or a surrogate (not encodable as UTF-8)."""
    if "\x00" in text:
        return NUL_IN_TEXT
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            return _invalid_utf8(text[error.start].encode("utf-8", "surrogatepass"))
    return None


def text_bytes_refusal(data: bytes) -> StoreRefusal | None:
    """Why a text column refuses these bytes, or None: invalid UTF-8 or a NUL byte."""
    if b"\x00" in data:
        return NUL_IN_TEXT
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        return _invalid_utf8(data[error.start:error.start + _sequence_length(data[error.start])])
    return None


def headers_refusal(headers: dict[str, str]) -> StoreRefusal | None:
    """Why the store refuses a headers map (stored as jsonb, and header columns as text), or None."""
    joined = "".join([*headers.values(), *headers])  # one scan for the common case: ASCII, no NUL
    if joined.isascii() and "\x00" not in joined:
        return None
    for name, value in headers.items():
        refusal = text_refusal(name) or text_refusal(value)
        if refusal is not None:
            return refusal
    return None


def _invalid_utf8(sequence: bytes) -> StoreRefusal:
    shown = " ".join(f"0x{byte:02x}" for byte in sequence[:4])
    return StoreRefusal(CHARACTER_NOT_IN_REPERTOIRE, f'invalid byte sequence for encoding "UTF8": {shown}')


def _sequence_length(lead: int) -> int:
    """Bytes of the UTF-8 sequence a lead byte starts, as PostgreSQL counts them when it shows an invalid one."""
    return 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF8 else 1
