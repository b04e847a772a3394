"""Validating one webhook request and turning it into the rows the source's log stores.

Sans-I/O: the HTTP layer hands over headers and body bytes; this module decides accept or reject
(`WebhookRejected` carries the HTTP status), evaluates the CHECK once per request, splits the body
into rows by the BODY FORMAT, and extracts each row's idempotency key.

- TEXT: one row, the body must be UTF-8; BYTES: one row, as received;
- JSON: every JSON value in the body is a row (one value, or NDJSON / concatenated values);
- JSON ARRAY: the elements of a top-level array are the rows (an empty array: no rows); any
  other single JSON value is one row, as in Materialize.
A JSON row's bytes are its text exactly as the sender wrote it (sliced from the body).

What the store would refuse is refused here, with 400 and PostgreSQL's message, before anything is written
(webhook/store_rules.py): \u0000 and lone surrogate escapes in JSON, NUL in TEXT, in a kept header or in the
idempotency key. Accepting such a row would acknowledge it and then fail its batch in the pipeline.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import orjson
import sqlglot
from sqlglot import exp

from headrace.catalog.items import WebhookSource
from headrace.errors import FeatureNotSupported, HeadraceError
from headrace.sql.ddl import check_columns, key_columns
from headrace.sql.expr import NOW, CompiledExpression, compile_expression
from headrace.webhook.record import WebhookRecord
from headrace.webhook.store_rules import NUL_IN_TEXT, StoreRefusal, headers_refusal, jsonb_refusal, text_refusal

CHECK_FAILED = "request failed the CHECK"  # never more: the sender must learn nothing about secrets

# Anything evaluating an expression may raise on hostile input; none of it may escape as a 500.
_EVALUATION_ERRORS = (HeadraceError, RecursionError, ValueError, TypeError, OverflowError, ArithmeticError,
                      UnicodeError, KeyError, IndexError)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_JSON = json.JSONDecoder(parse_float=Decimal, parse_constant=_reject_constant)
_WHITESPACE = " \t\n\r"
_WHITESPACE_BYTES = frozenset(_WHITESPACE.encode())
_SHALLOW_BRACKETS = 256


# A request's headers: (name, value) pairs as received, or already mapped as `_header_map` maps
# them (names lower-cased, a repeated header's values joined; the HTTP fast path builds it).
Headers = Sequence[tuple[str, str]] | dict[str, str]


class WebhookRejected(Exception):
    """The request is refused: `status` and `message` are what the sender gets back."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class WebhookHandler:
    """Compiled once per source (CHECK, IDEMPOTENT); `validate` runs per request."""

    def __init__(self, source: WebhookSource) -> None:
        if source.body_format not in _SPLITTERS:
            raise FeatureNotSupported(f"BODY FORMAT {source.body_format.upper()} is not supported")
        self.source = source
        self._split = _SPLITTERS[source.body_format]
        if source.body_format == "json" and not _reads_body(source.idempotent_expr):
            self._split = _json_rows_unread  # nothing evaluates the body's value: validating it is enough
        self._idempotency_key: CompiledExpression | None = None
        if source.idempotent_expr is not None:
            self._idempotency_key = compile_expression(source.idempotent_expr, key_columns(source))
        self._check: CompiledExpression | None = None
        if source.check_expr is not None:
            self._check = compile_expression(source.check_expr, check_columns(source))
        self._header_columns = tuple((c.column, c.header, c.as_bytes) for c in source.header_columns)
        self._column_headers = frozenset(c.header for c in source.header_columns)
        self._keeps_headers = source.include_headers or bool(source.header_columns)
        self._keeps_all_headers = source.include_headers and not source.headers_allowed and not source.headers_excluded
        # IDEMPOTENT (headers->>'x') and the like, the common case: a dict lookup per request
        # instead of evaluating the expression (checked against it here, on two probe requests).
        self._key_header = _header_lookup(source)
        if self._key_header is not None and not self._header_lookup_agrees(self._key_header):
            self._key_header = None

    def validate(self, headers: Headers, body: bytes, received_at_us: int) -> list[WebhookRecord]:
        """The request's rows as records (one per row), or WebhookRejected. Nothing is written here."""
        header_map = headers if isinstance(headers, dict) else _header_map(headers)
        if self._check is not None:
            self._run_check(header_map, body, received_at_us)
        rows = self._split(body)
        body_refusal = self._body_refusal(body)
        if body_refusal is not None:
            raise WebhookRejected(400, f"request body is refused by the store: {body_refusal.describe()}")
        kept = self._kept_headers(header_map) if self._keeps_headers else None
        if kept and (header_refusal := headers_refusal(kept)) is not None:
            raise WebhookRejected(400, f"a request header is refused by the store: {header_refusal.describe()}")
        key = self._idempotency_key
        key_header = self._key_header
        if key_header is not None:
            found = header_map.get(key_header)
            if found is None and rows:  # as evaluating the expression per row would
                raise WebhookRejected(400, "idempotency key is null")
            if found is not None:
                _check_key(found)
            return [WebhookRecord(received_at_us, found, kept, raw) for _, raw in rows]
        records = []
        for value, raw in rows:
            records.append(WebhookRecord(
                received_at_us=received_at_us,
                idempotency_key=None if key is None else _check_key(
                    self._evaluate_key(key, value, header_map, received_at_us)),
                headers=kept,
                body=raw,
            ))
        return records

    def _body_refusal(self, body: bytes) -> StoreRefusal | None:
        """What the store would refuse in a body already split into valid rows (cheap when there is nothing)."""
        body_format = self.source.body_format
        if body_format in ("json", "json_array"):
            return jsonb_refusal(body)  # one pass over the body covers every row sliced from it
        if body_format == "text" and body.find(0) >= 0:  # memchr: cheaper than `b"\x00" in body`
            return NUL_IN_TEXT
        return None

    # ---- CHECK ----------------------------------------------------------------------------------
    def _run_check(self, header_map: dict[str, str], body: bytes, received_at_us: int) -> None:
        assert self._check is not None
        try:
            row = self._check_row(header_map, body, received_at_us)
            passed = self._check(row)
        except _EVALUATION_ERRORS:
            passed = False  # an error is a failed CHECK, and says nothing more
        if passed is not True:
            raise WebhookRejected(400, CHECK_FAILED)

    def _check_row(self, header_map: dict[str, str], body: bytes, received_at_us: int) -> dict[str, Any]:
        row: dict[str, Any] = {NOW: received_at_us}
        options = {option.kind: option for option in self.source.check_options if option.kind != "secret"}
        body_option = options.get("body")
        row[body_option.alias if body_option else "body"] = (
            body if body_option is not None and body_option.as_bytes else body.decode("utf-8"))
        headers_option = options.get("headers")
        row[headers_option.alias if headers_option else "headers"] = header_map
        lookup = self.source.secret_lookup
        for option in self.source.check_options:
            if option.kind == "secret":
                assert option.secret is not None
                value = lookup(option.secret) if lookup is not None else None
                if value is None:
                    raise KeyError("secret")  # not named: the message must not reach the sender anyway
                row[option.alias] = value if option.as_bytes else value.decode("utf-8")
        return row

    # ---- rows -----------------------------------------------------------------------------------
    def _kept_headers(self, header_map: dict[str, str]) -> dict[str, str]:
        """The headers the source stores: its INCLUDE HEADERS filter, plus any INCLUDE HEADER column's."""
        if self._keeps_all_headers:  # INCLUDE HEADERS without a filter (the common case): no test per header
            return header_map.copy()
        keeps, columns = self.source.keeps_header, self._column_headers
        return {name: value for name, value in header_map.items() if name in columns or keeps(name)}

    def _header_lookup_agrees(self, header: str) -> bool:
        assert self._idempotency_key is not None
        try:
            present = self._evaluate_key(self._idempotency_key, None, {header: "probe"}, 0)
        except WebhookRejected:
            return False
        try:
            self._evaluate_key(self._idempotency_key, None, {}, 0)
        except WebhookRejected as absent:
            return present == "probe" and absent.message == "idempotency key is null"
        return False

    def _evaluate_key(self, expression: CompiledExpression, value: Any, header_map: dict[str, str],
                      received_at_us: int) -> str:
        row: dict[str, Any] = {"body": value, "headers": header_map, NOW: received_at_us}
        for column, header, as_bytes in self._header_columns:
            found = header_map.get(header)
            row[column] = found.encode("utf-8") if as_bytes and found is not None else found
        try:
            key = expression.text(row)
        except _EVALUATION_ERRORS:
            # The sender gets no details: a CHECK-like expression must not leak what it computes.
            raise WebhookRejected(400, "could not evaluate the idempotency key for this request") from None
        if key is None:
            raise WebhookRejected(400, "idempotency key is null")
        return key


def _check_key(key: str) -> str:
    refusal = text_refusal(key)
    if refusal is not None:
        raise WebhookRejected(400, f"idempotency key is refused by the store: {refusal.describe()}")
    return key


# -- body formats: body bytes -> [(value the expressions see, the row's bytes)] -------------------------

Rows = list[tuple[Any, bytes]]


def _text_rows(body: bytes) -> Rows:
    return [(_utf8(body, "text"), body)]


def _bytes_rows(body: bytes) -> Rows:
    return [(body, body)]


def _json_rows(body: bytes) -> Rows:
    text = _utf8(body, "JSON")
    if text and text[0] not in _WHITESPACE:  # the common case first: one value, the whole body
        value, end = _decode_at(text, 0)
        if end == len(text):
            return [(value, body)]  # its text re-encoded would be the body itself
    rows: Rows = []
    index = _skip_whitespace(text, 0)
    if index == len(text):
        raise WebhookRejected(400, "request body is empty; expected a JSON value")
    while index < len(text):
        value, end = _decode_at(text, index)
        rows.append((value, text[index:end].encode("utf-8")))
        index = _skip_whitespace(text, end)
    return rows


def _json_rows_unread(body: bytes) -> Rows:
    """As `_json_rows` when no expression reads the rows' values (they are None): the common body,
    one JSON value from its first byte to its last, is only validated, by orjson, which accepts a
    subset of what the standard decoder does (anything it refuses is decided by that decoder)."""
    # orjson nests deeper than the standard decoder (which the pipeline also decodes with): a body
    # that might nest deep is left to that decoder.
    if (body and body[0] not in _WHITESPACE_BYTES and body[-1] not in _WHITESPACE_BYTES
            and body.count(b"[") + body.count(b"{") < _SHALLOW_BRACKETS):
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        else:
            return [(None, body)]
    return [(None, raw) for _, raw in _json_rows(body)]


def _reads_body(expression: str | None) -> bool:
    """Whether the expression may read the `body` column (when unsure: yes)."""
    if expression is None:
        return False
    try:
        tree = sqlglot.parse_one(expression, read="postgres")
    except sqlglot.errors.SqlglotError:
        return True
    if any(True for _ in tree.find_all(exp.Star)):
        return True
    return any(column.name.lower() == "body" or not column.name for column in tree.find_all(exp.Column))


def _header_lookup(source: WebhookSource) -> str | None:
    """The header's name if the IDEMPOTENT expression only looks one header up by a literal name
    (`headers->>'x'`, `headers->'x'`, `headers['x']`) in the headers map; else None."""
    if source.idempotent_expr is None or any(column.column == "headers" for column in source.header_columns):
        return None  # an INCLUDE HEADER column named headers hides the map
    try:
        tree = sqlglot.parse_one(source.idempotent_expr, read="postgres")
    except sqlglot.errors.SqlglotError:
        return None
    name: object = None
    if isinstance(tree, (exp.JSONExtract, exp.JSONExtractScalar)) and isinstance(tree.expression, exp.JSONPath):
        steps = tree.expression.expressions
        if len(steps) == 2 and isinstance(steps[0], exp.JSONPathRoot) and isinstance(steps[1], exp.JSONPathKey):
            name = steps[1].this
    elif isinstance(tree, exp.Bracket) and len(tree.expressions) == 1:
        literal = tree.expressions[0]
        if isinstance(literal, exp.Literal) and literal.is_string:
            name = literal.this
    column = tree.this
    if not (isinstance(name, str) and isinstance(column, exp.Column) and not column.table and column.name == "headers"):
        return None
    return name


def _json_array_rows(body: bytes) -> Rows:
    text = _utf8(body, "JSON")
    index = _skip_whitespace(text, 0)
    if index == len(text):
        raise WebhookRejected(400, "request body is empty; expected a JSON array")
    if text[index] != "[":
        value, end = _decode_at(text, index)
        if _skip_whitespace(text, end) != len(text):
            raise WebhookRejected(400, "request body is not valid JSON: extra data after the value")
        return [(value, text[index:end].encode("utf-8"))]
    rows: Rows = []
    index = _skip_whitespace(text, index + 1)
    if text[index : index + 1] == "]":
        index += 1
    else:
        while True:
            value, end = _decode_at(text, index)
            rows.append((value, text[index:end].encode("utf-8")))
            index = _skip_whitespace(text, end)
            separator = text[index : index + 1]
            index = _skip_whitespace(text, index + 1)
            if separator == "]":
                break
            if separator != ",":
                raise WebhookRejected(400, "request body is not valid JSON: expected ',' or ']' in the array")
    if _skip_whitespace(text, index) != len(text):
        raise WebhookRejected(400, "request body is not valid JSON: extra data after the array")
    return rows


_SPLITTERS: dict[str, Callable[[bytes], Rows]] = {
    "text": _text_rows, "bytes": _bytes_rows, "json": _json_rows, "json_array": _json_array_rows,
}


def _utf8(body: bytes, what: str) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise WebhookRejected(400, f"request body is not valid UTF-8 (byte {error.start}); BODY FORMAT {what} "
                                   "needs UTF-8") from None


def _skip_whitespace(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WHITESPACE:
        index += 1
    return index


def _decode_at(text: str, index: int) -> tuple[Any, int]:
    try:
        return _JSON.raw_decode(text, index)
    except RecursionError:
        raise WebhookRejected(400, "request body is not valid JSON: nested too deeply") from None
    except ValueError as error:
        raise WebhookRejected(400, f"request body is not valid JSON: {error}") from None
    except ArithmeticError:  # decimal's InvalidOperation: an exponent no numeric can hold (PostgreSQL refuses it too)
        raise WebhookRejected(400, "request body is not valid JSON: a number is out of range") from None


def _header_map(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Header names lower-cased; a repeated header's values joined with ", " (as RFC 9110 allows)."""
    result: dict[str, str] = {}
    for name, value in headers:
        if not (name.isascii() and value.isascii()):  # rare: ASCII needs no cleaning (hot path)
            name, value = _clean_text(name), _clean_text(value)
        name = name.lower()
        result[name] = f"{result[name]}, {value}" if name in result else value
    return result


def _clean_text(text: str) -> str:
    # HTTP parsers decode header bytes with surrogateescape; such text cannot be stored as UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text
