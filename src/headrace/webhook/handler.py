"""Validating one webhook request and turning it into the record the source's log stores.

Sans-I/O: the HTTP layer hands over headers and body bytes; this module decides accept or reject
(`WebhookRejected` carries the HTTP status) and extracts the idempotency key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headrace.catalog.items import WebhookSource
from headrace.errors import FeatureNotSupported, HeadraceError
from headrace.sql.expr import CompiledExpression, compile_expression
from headrace.sql.expr_values import parse_json_document
from headrace.webhook.record import WebhookRecord

# The columns an IDEMPOTENT expression may read. `headers` is always available to it, even when
# the source does not INCLUDE HEADERS (the key often comes from a header such as Idempotency-Key).
KEY_EXPRESSION_COLUMNS = ("body", "headers")


class WebhookRejected(Exception):
    """The request is refused: `status` and `message` are what the sender gets back."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class WebhookHandler:
    def __init__(self, source: WebhookSource) -> None:
        if source.body_format != "json":
            raise FeatureNotSupported(f"BODY FORMAT {source.body_format.upper()} is not supported yet")
        self.source = source
        self._idempotency_key: CompiledExpression | None = None
        if source.idempotent_expr is not None:
            self._idempotency_key = compile_expression(source.idempotent_expr, KEY_EXPRESSION_COLUMNS)

    def validate(self, headers: Sequence[tuple[str, str]], body: bytes, received_at_us: int) -> WebhookRecord:
        """Accept the request as a record, or raise WebhookRejected."""
        try:
            body_text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise WebhookRejected(400, f"request body is not valid UTF-8 (byte {error.start})") from None
        if not body_text.strip():
            raise WebhookRejected(400, "request body is empty; expected a JSON value")
        document = _parse_json_body(body_text)
        header_map = _header_map(headers)
        key = None
        if self._idempotency_key is not None:
            key = self._evaluate_key(self._idempotency_key, document, header_map)
        return WebhookRecord(
            received_at_us=received_at_us,
            idempotency_key=key,
            headers=header_map if self.source.include_headers else None,
            body_text=body_text,
        )

    @staticmethod
    def _evaluate_key(expression: CompiledExpression, document: Any, header_map: dict[str, str]) -> str:
        try:
            key = expression.text({"body": document, "headers": header_map})
        except (HeadraceError, RecursionError):
            # The sender gets no details: a CHECK-like expression must not leak what it computes.
            raise WebhookRejected(400, "could not evaluate the idempotency key for this request") from None
        if key is None:
            raise WebhookRejected(400, "idempotency key is null")
        return key


def _parse_json_body(body_text: str) -> Any:
    try:
        return parse_json_document(body_text)
    except RecursionError:
        raise WebhookRejected(400, "request body is not valid JSON: nested too deeply") from None
    except ValueError as error:
        raise WebhookRejected(400, f"request body is not valid JSON: {error}") from None


def _header_map(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Header names lower-cased; a repeated header's values joined with ", " (as RFC 9110 allows)."""
    result: dict[str, str] = {}
    for name, value in headers:
        name, value = _clean_text(name).lower(), _clean_text(value)
        result[name] = f"{result[name]}, {value}" if name in result else value
    return result


def _clean_text(text: str) -> str:
    # HTTP parsers decode header bytes with surrogateescape; such text cannot be stored as UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text
