"""PostgreSQL's COPY data formats, sans-I/O: text, csv and binary (copy.c's rules).

    options = CopyOptions.parse({"format": "csv", "header": True}, direction="to")
    encoder = CopyEncoder(options, column_oids, column_names)
    encoder.header() + encoder.row((1, "a")) + ... + encoder.trailer()  # the CopyData payloads
    rows = decode_copy_data(options, data, column_oids, column_names, relation="t")  # COPY FROM

Values are Python values; each column's PostgreSQL type (OID) encodes and decodes them through
headrace.pgwire.types, so COPY and DataRow agree on every value's text and binary form.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headrace.errors import FeatureNotSupported, HeadraceError, SyntaxError_
from headrace.pgwire.types import BINARY_FORMAT, TEXT_FORMAT, cell_encoder, decode_parameter

BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_BINARY_HEADER = BINARY_SIGNATURE + struct.pack("!ii", 0, 0)  # flags, header extension length
_BINARY_TRAILER = struct.pack("!h", -1)
_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")

FORMATS = ("text", "csv", "binary")
BAD_COPY_FILE_FORMAT = "22P04"


@dataclass(frozen=True, slots=True)
class CopyOptions:
    format: str = "text"  # text | csv | binary
    delimiter: str = "\t"
    null: str = "\\N"
    header: bool = False
    quote: str = '"'
    escape: str = '"'
    force_quote: tuple[str, ...] | None = None  # None: none; () with force_quote_all: every column
    force_quote_all: bool = False
    force_not_null: tuple[str, ...] = ()

    @property
    def format_code(self) -> int:
        """CopyInResponse/CopyOutResponse's overall format: 0 textual, 1 binary."""
        return BINARY_FORMAT if self.format == "binary" else TEXT_FORMAT

    @classmethod
    def parse(cls, options: Mapping[str, object], *, direction: str) -> CopyOptions:
        """Validate COPY's options as PostgreSQL does (ProcessCopyOptions)."""
        known = {"format", "delimiter", "null", "header", "quote", "escape", "force_quote",
                 "force_not_null", "encoding", "freeze", "default"}
        for name in options:
            if name not in known:
                raise SyntaxError_(f'option "{name}" not recognized')
        fmt = str(options.get("format", "text")).lower()
        if fmt not in FORMATS:
            raise HeadraceError(f'COPY format "{fmt}" not recognized', sqlstate="22023")
        csv = fmt == "csv"
        if fmt == "binary":
            for name in ("delimiter", "null", "header", "quote", "escape"):
                if name in options:
                    raise SyntaxError_(f"cannot specify {name.upper()} in BINARY mode")
        if not csv:
            for name in ("quote", "escape", "force_quote", "force_not_null"):
                if name in options:
                    raise FeatureNotSupported(f"COPY {name} available only in CSV mode")
        encoding = options.get("encoding")
        if encoding is not None and str(encoding).replace("-", "").upper() != "UTF8":
            raise FeatureNotSupported(f'COPY encoding "{encoding}" is not supported: use UTF8')
        delimiter = _text_option(options, "delimiter", "," if csv else "\t")
        quote = _text_option(options, "quote", '"')
        escape = _text_option(options, "escape", quote)
        if len(delimiter.encode()) != 1:
            raise FeatureNotSupported("COPY delimiter must be a single one-byte character")
        if delimiter in "\r\n":
            raise HeadraceError("COPY delimiter cannot be newline or carriage return", sqlstate="22023")
        if csv and (len(quote.encode()) != 1 or len(escape.encode()) != 1):
            raise FeatureNotSupported("COPY quote and escape must be a single one-byte character")
        if csv and delimiter == quote:
            raise HeadraceError("COPY delimiter and quote must be different", sqlstate="22023")
        null = _text_option(options, "null", "" if csv else "\\N")
        if "\r" in null or "\n" in null:
            raise HeadraceError("COPY null representation cannot use newline or carriage return", sqlstate="22023")
        if not csv and delimiter in "\\.abcdefghijklmnopqrstuvwxyz0123456789":
            raise HeadraceError(f'COPY delimiter cannot be "{delimiter}"', sqlstate="22023")
        header = _bool_option(options.get("header", False))
        force_quote_value = options.get("force_quote")
        force_quote_all = force_quote_value == "*"
        if force_quote_value is not None and direction != "to":
            raise FeatureNotSupported("COPY force quote available only using COPY TO")
        force_not_null_value = options.get("force_not_null", ())
        if force_not_null_value and direction != "from":
            raise FeatureNotSupported("COPY force not null available only using COPY FROM")
        return cls(format=fmt, delimiter=delimiter, null=null, header=header, quote=quote, escape=escape,
                   force_quote=None if force_quote_value is None or force_quote_all else tuple(force_quote_value),  # type: ignore[arg-type]
                   force_quote_all=force_quote_all, force_not_null=tuple(force_not_null_value))  # type: ignore[arg-type]


def _text_option(options: Mapping[str, object], name: str, default: str) -> str:
    value = options.get(name, default)
    if not isinstance(value, str):
        raise SyntaxError_(f"{name} requires a string value")
    return value


def _bool_option(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("true", "on", "1", "yes"):
        return True
    if text in ("false", "off", "0", "no"):
        return False
    if text == "match":
        return True  # HEADER MATCH: the header line is skipped like HEADER (names not checked)
    raise HeadraceError(f"header requires a Boolean value", sqlstate="22023")


# --- COPY TO ----------------------------------------------------------------------------------

# CopyAttributeOutText: these control characters get a backslash escape by letter.
_TEXT_ESCAPES = {"\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


class CopyEncoder:
    """Encodes rows into COPY TO payloads, one per row (as PostgreSQL sends them)."""

    def __init__(self, options: CopyOptions, column_oids: Sequence[int], column_names: Sequence[str],
                 raw_formats: Sequence[int] | None = None) -> None:
        """`raw_formats`: per column, -1 for Python values, 0 / 1 for PostgreSQL's own text / binary bytes."""
        self._options = options
        self._names = list(column_names)
        target = BINARY_FORMAT if options.format == "binary" else TEXT_FORMAT
        self._encoders = [cell_encoder(oid, raw, target)
                          for oid, raw in zip(column_oids, raw_formats or [-1] * len(column_oids), strict=True)]
        escapes = dict(_TEXT_ESCAPES)
        escapes.setdefault(options.delimiter, "\\" + options.delimiter)
        self._text_table = str.maketrans(escapes)
        if options.force_quote_all:
            self._force_quote = [True] * len(self._names)
        else:
            forced = set(options.force_quote or ())
            unknown = forced - set(self._names)
            if unknown:
                raise HeadraceError(f'column "{sorted(unknown)[0]}" does not exist', sqlstate="42703")
            self._force_quote = [name in forced for name in self._names]
        self._csv_specials = {options.delimiter, options.quote, "\r", "\n"}

    def header(self) -> bytes:
        """What precedes the first row: the binary signature, or the header line when asked."""
        if self._options.format == "binary":
            return _BINARY_HEADER
        if not self._options.header:
            return b""
        if self._options.format == "csv":
            cells = [self._csv_cell(name, force=False) for name in self._names]
        else:
            cells = [name.translate(self._text_table) for name in self._names]
        return (self._options.delimiter.join(cells) + "\n").encode()

    def trailer(self) -> bytes:
        return _BINARY_TRAILER if self._options.format == "binary" else b""

    def row(self, values: Sequence[Any]) -> bytes:
        fmt = self._options.format
        if fmt == "binary":
            parts = [_INT16.pack(len(values))]
            for value, encode in zip(values, self._encoders, strict=True):
                if value is None:
                    parts.append(_INT32.pack(-1))
                else:
                    cell = encode(value)
                    parts.append(_INT32.pack(len(cell)))
                    parts.append(cell)
            return b"".join(parts)
        null = self._options.null
        cells: list[str] = []
        if fmt == "csv":
            for index, (value, encode) in enumerate(zip(values, self._encoders, strict=True)):
                if value is None:
                    cells.append(null)
                else:
                    cells.append(self._csv_cell(encode(value).decode(), force=self._force_quote[index],
                                                single_column=len(values) == 1))
        else:
            for value, encode in zip(values, self._encoders, strict=True):
                cells.append(null if value is None else encode(value).decode().translate(self._text_table))
        return (self._options.delimiter.join(cells) + "\n").encode()

    def _csv_cell(self, text: str, *, force: bool, single_column: bool = False) -> str:
        """CopyAttributeOutCSV: quote when forced, when the text holds a special character, equals
        the NULL string, or is the end-of-data marker alone on its line."""
        options = self._options
        needs_quote = (force or text == options.null or any(char in self._csv_specials for char in text)
                       or (single_column and text == "\\."))
        if not needs_quote:
            return text
        quote, escape = options.quote, options.escape
        escaped = "".join(escape + char if char in (quote, escape) else char for char in text)
        return quote + escaped + quote


# --- COPY FROM --------------------------------------------------------------------------------

def decode_copy_data(options: CopyOptions, data: bytes, column_oids: Sequence[int],
                     column_names: Sequence[str], relation: str) -> list[tuple[Any, ...]]:
    """All rows of COPY FROM's data, typed. Bad data raises 22P04 (or the type's 22xxx error)
    with the line number in the detail, as PostgreSQL's "COPY t, line n" context."""
    if options.format == "binary":
        raise FeatureNotSupported("COPY FROM STDIN in binary format is not supported: use text or csv")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise HeadraceError('invalid byte sequence for encoding "UTF8"', sqlstate="22021") from None
    records = _csv_records(text, options) if options.format == "csv" else _text_records(text, options)
    force_not_null = set(options.force_not_null)
    unknown = force_not_null - set(column_names)
    if unknown:
        raise HeadraceError(f'column "{sorted(unknown)[0]}" does not exist', sqlstate="42703")
    not_null_positions = [name in force_not_null for name in column_names]
    rows: list[tuple[Any, ...]] = []
    first = True
    for line_number, fields in records:
        if first and options.header:
            first = False
            continue
        first = False
        context = f"COPY {relation}, line {line_number}"
        if len(fields) > len(column_oids):
            raise HeadraceError("extra data after last expected column", sqlstate=BAD_COPY_FILE_FORMAT,
                                detail=context)
        if len(fields) < len(column_oids):
            raise HeadraceError(f'missing data for column "{column_names[len(fields)]}"',
                                sqlstate=BAD_COPY_FILE_FORMAT, detail=context)
        values = []
        for index, (field, oid) in enumerate(zip(fields, column_oids, strict=True)):
            if field is None and not_null_positions[index]:
                field = ""
            if field is None:
                values.append(None)
                continue
            try:
                values.append(decode_parameter(oid, TEXT_FORMAT, field.encode()))
            except HeadraceError as error:
                raise HeadraceError(error.message, sqlstate=error.sqlstate,
                                    detail=f'{context}, column {column_names[index]}: "{field}"') from None
        rows.append(tuple(values))
    return rows


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """Lines with their 1-based numbers; \\r\\n and \\n both end a line; `\\.` alone ends the data."""
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if line == "\\.":
            return
        yield number, line


def _text_records(text: str, options: CopyOptions) -> Iterator[tuple[int, list[str | None]]]:
    if not text:
        return
    if text.endswith("\n"):
        text = text[:-1]  # the last line's end, not an empty line after it
    for number, line in _lines(text):
        yield number, _split_text_line(line, options, number)


_TEXT_UNESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _split_text_line(line: str, options: CopyOptions, number: int) -> list[str | None]:
    """CopyReadAttributesText: split at unescaped delimiters; a field whose raw text is the NULL
    string is NULL; then backslash sequences are decoded."""
    fields: list[str | None] = []
    delimiter = options.delimiter
    raw_start = 0
    value: list[str] = []
    index = 0
    length = len(line)
    while True:
        if index >= length or line[index] == delimiter:
            raw = line[raw_start:index]
            fields.append(None if raw == options.null else "".join(value))
            if index >= length:
                return fields
            index += 1
            raw_start = index
            value = []
            continue
        char = line[index]
        if char != "\\":
            value.append(char)
            index += 1
            continue
        index += 1
        if index >= length:
            raise HeadraceError("unterminated escape sequence at end of line", sqlstate=BAD_COPY_FILE_FORMAT,
                                detail=f"line {number}")
        char = line[index]
        if char in "01234567":
            end = index
            while end < length and end < index + 3 and line[end] in "01234567":
                end += 1
            value.append(chr(int(line[index:end], 8) & 0xFF))
            index = end
        elif char == "x" and index + 1 < length and line[index + 1] in "0123456789abcdefABCDEF":
            end = index + 1
            while end < length and end < index + 3 and line[end] in "0123456789abcdefABCDEF":
                end += 1
            value.append(chr(int(line[index + 1:end], 16)))
            index = end
        else:
            value.append(_TEXT_UNESCAPES.get(char, char))
            index += 1


def _csv_records(text: str, options: CopyOptions) -> Iterator[tuple[int, list[str | None]]]:
    """CopyReadAttributesCSV over the whole input: quoted fields may span lines. An unquoted field
    equal to the NULL string is NULL; a quoted one never is."""
    delimiter, quote, escape, null = options.delimiter, options.quote, options.escape, options.null
    index, length, line_number = 0, len(text), 1
    while index < length:
        record_line = line_number
        fields: list[str | None] = []
        if text.startswith("\\.", index) and text[index + 2:index + 3] in ("", "\n", "\r"):
            return  # end-of-data marker
        while True:
            value: list[str] = []
            quoted = False
            while index < length:
                char = text[index]
                if char == quote:
                    quoted = True
                    index += 1
                    while True:
                        if index >= length:
                            raise HeadraceError("unterminated CSV quoted field", sqlstate=BAD_COPY_FILE_FORMAT,
                                                detail=f"COPY line {record_line}")
                        char = text[index]
                        if char == escape and index + 1 < length and text[index + 1] in (quote, escape) \
                                and (escape != quote or text[index + 1] == quote):
                            value.append(text[index + 1])
                            index += 2
                        elif char == quote:
                            index += 1
                            break
                        else:
                            if char == "\n":
                                line_number += 1
                            value.append(char)
                            index += 1
                elif char in (delimiter, "\n", "\r"):
                    break
                else:
                    value.append(char)
                    index += 1
            cell = "".join(value)
            fields.append(None if not quoted and cell == null else cell)
            if index < length and text[index] == delimiter:
                index += 1
                continue
            break
        if index < length and text[index] == "\r":
            index += 1
        if index < length and text[index] == "\n":
            index += 1
        line_number += 1
        yield record_line, fields
