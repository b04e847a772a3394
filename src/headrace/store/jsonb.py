"""jsonb's text output as PostgreSQL prints it.

The store keeps JSON as compact text in the order it arrived; PostgreSQL's jsonb keeps one value
per key (the last), orders keys by length and then bytes, prints ", " and ": " between items and
numbers as numeric (1e2 -> 100, 1.50 stays 1.50)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

_ESCAPE = json.encoder.py_encode_basestring  # type: ignore[attr-defined]


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    latest = dict(pairs)  # a repeated key keeps its last value, as jsonb does
    return {key: latest[key] for key in sorted(latest, key=lambda k: (len(k.encode()), k.encode()))}


def _number(text: str) -> Decimal:
    return Decimal(text)


def jsonb_text(text: str) -> str:
    """PostgreSQL's jsonb output of a JSON document."""
    value = json.loads(text, object_pairs_hook=_object, parse_float=_number, parse_int=int)
    return _render(value)


def _render(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_ESCAPE(key)}: {_render(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_render(item) for item in value) + "]"
    if isinstance(value, str):
        return _ESCAPE(value)  # type: ignore[no-any-return]
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, Decimal):
        return format(value.copy_abs() if value.is_zero() else value, "f")  # numeric has no -0
    return str(value)
