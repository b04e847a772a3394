"""The SQL types and run-time values of compiled expressions (see expr.py): PostgreSQL's casts,
input/output rules and jsonb semantics.

Kept apart from expr.py so the compiler stays a readable table of node compilers; everything here
works on one value and is called from the closures expr.py builds.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Sequence
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Final

from headrace.errors import DataError, FeatureNotSupported
from headrace.sql import expr_types as xt

__all__ = ["INTEGER_TYPES", "JSON_NULL", "NUMBER_TYPES", "SqlType", "converter", "parse_json_document"]


class SqlType(enum.Enum):
    TEXT = "text"
    SMALLINT = "smallint"
    INTEGER = "integer"
    BIGINT = "bigint"
    NUMERIC = "numeric"
    BOOLEAN = "boolean"
    JSONB = "jsonb"
    DOUBLE = "double precision"
    BYTEA = "bytea"
    TIMESTAMPTZ = "timestamp with time zone"
    INTERVAL = "interval"
    MAP = "map[text=>text]"  # the headers of a request, as in Materialize
    TEXT_ARRAY = "text[]"
    UNKNOWN = "unknown"  # an untyped string literal or NULL, typed by its context


NUMBER_TYPES = frozenset({SqlType.SMALLINT, SqlType.INTEGER, SqlType.BIGINT, SqlType.NUMERIC, SqlType.DOUBLE})
INTEGER_TYPES = frozenset({SqlType.SMALLINT, SqlType.INTEGER, SqlType.BIGINT})


class _JsonNull:
    """A jsonb value that is JSON null, as opposed to SQL NULL (None)."""

    _instance: _JsonNull | None = None

    def __new__(cls) -> _JsonNull:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "JSON_NULL"


JSON_NULL: Final = _JsonNull()
_MISSING: Final = object()  # no such key or index: SQL NULL, unlike a present JSON null

_INTEGER_RANGES = {"smallint": 1 << 15, "integer": 1 << 31, "bigint": 1 << 63}
_INTEGER_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
_NUMERIC_TEXT = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*", re.ASCII)
_NUMERIC_SPECIAL = {"nan": Decimal("NaN"), "infinity": Decimal("Infinity"), "+infinity": Decimal("Infinity"),
                    "-infinity": Decimal("-Infinity"), "inf": Decimal("Infinity"), "+inf": Decimal("Infinity"),
                    "-inf": Decimal("-Infinity")}


def _invalid_input(type_name: str, value: str) -> DataError:
    return DataError(f'invalid input syntax for type {type_name}: "{value}"', sqlstate="22P02")


# -- numbers ---------------------------------------------------------------------------------

def fits(value: int, type_name: str) -> bool:
    limit = _INTEGER_RANGES[type_name]
    return -limit <= value < limit


def parse_integer(text: str, type_name: str) -> int:
    if not _INTEGER_TEXT.fullmatch(text):
        raise _invalid_input(type_name, text)
    return to_integer(int(text), type_name)


def to_integer(value: int | Decimal | float | bool, type_name: str) -> int:
    """A number as an integer type: rounded half away from zero, range-checked (like PostgreSQL)."""
    if not isinstance(value, int):
        try:
            value = int(Decimal(value).to_integral_value(ROUND_HALF_UP))
        except (InvalidOperation, ValueError, OverflowError):
            raise DataError(f"cannot convert {value} to {type_name}", sqlstate="22003") from None
    if not fits(int(value), type_name):
        raise DataError(f"{type_name} out of range", sqlstate="22003")
    return int(value)


def parse_numeric(text: str) -> Decimal:
    special = _NUMERIC_SPECIAL.get(text.strip().lower())
    if special is not None:
        return special
    if not _NUMERIC_TEXT.fullmatch(text):
        raise _invalid_input("numeric", text)
    return Decimal(text.strip())


def to_decimal(value: int | Decimal | float) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else value)


def numeric_text(value: int | Decimal | float) -> str:
    """PostgreSQL's numeric output: plain notation, the input's scale kept (1.50 stays 1.50)."""
    if isinstance(value, int):
        return str(value)
    number = to_decimal(value)
    if not number.is_finite():
        return "NaN" if number.is_nan() else ("Infinity" if number > 0 else "-Infinity")
    if number.is_zero():
        number = abs(number)  # PostgreSQL has no negative zero
    return format(number, "f")


def parse_boolean(text: str) -> bool:
    """PostgreSQL's boolean input: true/yes/on/1 and false/no/off/0, any unique prefix, any case."""
    word = text.strip().lower()
    if word and ("true".startswith(word) or "yes".startswith(word) or word in ("on", "1")):
        return True
    if word and ("false".startswith(word) or "no".startswith(word) or word in ("of", "off", "0")):
        return False
    raise _invalid_input("boolean", text)


# -- jsonb -----------------------------------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_document(text: str | bytes) -> Any:
    """Parse JSON the way jsonb input does: exact decimals, no NaN/Infinity. Raises ValueError."""
    return json.loads(text, parse_float=Decimal, parse_constant=_reject_constant)


def parse_jsonb(text: str) -> Any:
    try:
        value = parse_json_document(text)
    except ValueError:
        raise _invalid_input("json", text) from None
    return JSON_NULL if value is None else value


def jsonb_kind(value: Any) -> str:
    if value is None or value is JSON_NULL:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float, Decimal)):
        return "numeric"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def jsonb_scalar(value: Any, kind: str, target: str) -> Any:
    """The number or boolean inside a jsonb value, for a cast to `target`."""
    actual = jsonb_kind(value)
    if (kind == "number" and actual == "numeric") or (kind == "boolean" and actual == "boolean"):
        return value
    raise DataError(f"cannot cast jsonb {actual} to type {target}", sqlstate="22023")


def _key_order(key: str) -> tuple[int, bytes]:
    encoded = key.encode("utf-8")
    return len(encoded), encoded  # jsonb stores object keys shorter first, then bytewise


def jsonb_text(value: Any) -> str:
    """jsonb's text output: `{"a": 1, "b": [true, null]}`, keys in jsonb order (so equal documents
    written differently print alike: this is what makes them usable as idempotency keys)."""
    if value is None or value is JSON_NULL:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float, Decimal)):
        return numeric_text(value)
    if isinstance(value, list):
        return "[" + ", ".join(jsonb_text(item) for item in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=_key_order)
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {jsonb_text(value[k])}" for k in keys) + "}"
    raise DataError(f"{type(value).__name__} is not a JSON value")


def jsonb_to_text(value: Any) -> str | None:
    """What `->>` returns: a string unquoted, JSON null as SQL NULL, anything else as jsonb text."""
    if value is JSON_NULL:
        return None
    return value if isinstance(value, str) else jsonb_text(value)


def jsonb_equal(left: Any, right: Any) -> bool:
    """jsonb equality: structural, numbers by value, and true is not 1 (unlike Python's ==)."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, (int, float, Decimal)):
        return isinstance(right, (int, float, Decimal)) and to_decimal(left) == to_decimal(right)
    if isinstance(left, dict):
        return (isinstance(right, dict) and left.keys() == right.keys()
                and all(jsonb_equal(left[key], right[key]) for key in left))
    if isinstance(left, list):
        return (isinstance(right, list) and len(left) == len(right)
                and all(jsonb_equal(a, b) for a, b in zip(left, right, strict=True)))
    return bool(left == right)


def _get(value: Any, key: str | int | None, text_path: bool) -> Any:
    """One step into a jsonb value; _MISSING when there is nothing there."""
    if isinstance(value, dict):
        return value.get(key, _MISSING) if isinstance(key, str) else _MISSING
    if isinstance(value, list):
        if text_path and isinstance(key, str) and _INTEGER_TEXT.fullmatch(key):
            key = int(key)  # #> paths are text[]: on arrays their elements are indexes
        if isinstance(key, int) and not isinstance(key, bool) and -len(value) <= key < len(value):
            return value[key]
    return _MISSING


def step(value: Any, key: str | int) -> Any:
    """`value -> key`: an object key (text) or an array index (integer, negative from the end)."""
    found = _get(value, key, text_path=False)
    return None if found is _MISSING else (JSON_NULL if found is None else found)


def path_getter(steps: Sequence[str | int | None], *, text_path: bool = False) -> Callable[[Any], Any]:
    """A function walking `steps` into a jsonb value (for chained `->` and for `#>`)."""
    path = tuple(steps)

    def walk(value: Any) -> Any:
        for key in path:
            value = _get(value, key, text_path)
            if value is _MISSING:
                return None
        return JSON_NULL if value is None else value

    return walk


def parse_text_array(literal: str) -> list[str | None]:
    """A text[] literal such as '{a,"b c",0}' (for #> paths). NULL elements stay None."""
    text = literal.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise DataError(f'malformed array literal: "{literal}"', sqlstate="22P02")
    body, elements, index = text[1:-1], [], 0
    if not body.strip():
        return []
    while True:
        while index < len(body) and body[index].isspace():
            index += 1
        if index < len(body) and body[index] == '"':
            index, element = _quoted_element(body, index + 1, literal)
            elements.append(element)
            while index < len(body) and body[index].isspace():
                index += 1
        else:
            end = body.find(",", index)
            end = len(body) if end < 0 else end
            raw = body[index:end].strip()
            if not raw or any(c in raw for c in '{}"\\'):
                raise DataError(f'malformed array literal: "{literal}"', sqlstate="22P02")
            elements.append(None if raw.upper() == "NULL" else raw)
            index = end
        if index >= len(body):
            return elements
        if body[index] != ",":
            raise DataError(f'malformed array literal: "{literal}"', sqlstate="22P02")
        index += 1


def _quoted_element(body: str, index: int, literal: str) -> tuple[int, str]:
    characters: list[str] = []
    while index < len(body):
        char = body[index]
        if char == "\\" and index + 1 < len(body):
            characters.append(body[index + 1])
            index += 2
        elif char == '"':
            return index + 1, "".join(characters)
        else:
            characters.append(char)
            index += 1
    raise DataError(f'malformed array literal: "{literal}"', sqlstate="22P02")


# -- casts ------------------------------------------------------------------------------------

def converter(source: SqlType, target: SqlType) -> Callable[[Any], Any]:
    """The function converting a non-NULL value of `source` type to `target` type (a cast)."""
    textual = source in (SqlType.TEXT, SqlType.UNKNOWN)
    if target is SqlType.TEXT:
        if textual:
            return str
        if source is SqlType.JSONB:
            return jsonb_text
        if source is SqlType.BOOLEAN:
            return lambda v: "true" if v else "false"
        return _TO_TEXT.get(source, str)
    if source is SqlType.DOUBLE and target in INTEGER_TYPES | {SqlType.NUMERIC}:
        return _double_to(target)
    if target is SqlType.DOUBLE:
        if textual:
            return xt.parse_double
        if source in NUMBER_TYPES:
            return xt.number_to_double
        if source is SqlType.JSONB:
            return lambda v: xt.number_to_double(jsonb_scalar(v, "number", "double precision"))
    if target in INTEGER_TYPES:
        name = target.value
        if textual:
            return lambda v: parse_integer(v, name)
        if source in NUMBER_TYPES or source is SqlType.BOOLEAN:
            return lambda v: to_integer(v, name)
        if source is SqlType.JSONB:
            return lambda v: to_integer(jsonb_scalar(v, "number", name), name)
    if target is SqlType.NUMERIC:
        if textual:
            return parse_numeric
        if source in INTEGER_TYPES:
            return Decimal
        if source is SqlType.JSONB:
            return lambda v: to_decimal(jsonb_scalar(v, "number", "numeric"))
    if target is SqlType.BOOLEAN:
        if textual:
            return parse_boolean
        if source in INTEGER_TYPES:
            return bool
        if source is SqlType.JSONB:
            return lambda v: jsonb_scalar(v, "boolean", "boolean")
    if target is SqlType.JSONB:
        if textual:
            return parse_jsonb
        if source is SqlType.MAP:
            return dict
        if source in NUMBER_TYPES or source is SqlType.BOOLEAN:
            return lambda v: v  # numbers and booleans are already JSON values (as to_jsonb would)
    if textual and target in _FROM_TEXT:
        return _FROM_TEXT[target]
    if source is SqlType.BYTEA and target is SqlType.BYTEA:
        return bytes
    raise FeatureNotSupported(f"cast from {source.value} to {target.value}")


def _double_to(target: SqlType) -> Callable[[Any], Any]:
    def convert(value: float) -> Any:
        if math.isnan(value) or math.isinf(value):
            if target is SqlType.NUMERIC:
                return Decimal(value)
            raise DataError(f"{target.value} out of range", sqlstate="22003")
        if target is SqlType.NUMERIC:
            return Decimal(repr(value))
        return to_integer(round(value), target.value)  # rint: halves to even, as PostgreSQL
    return convert


_TO_TEXT: dict[SqlType, Callable[[Any], str]] = {
    SqlType.NUMERIC: numeric_text,
    SqlType.DOUBLE: xt.double_text,
    SqlType.BYTEA: xt.bytea_text,
    SqlType.TIMESTAMPTZ: xt.timestamptz_text,
    SqlType.INTERVAL: xt.interval_text,
    SqlType.MAP: xt.map_text,
    SqlType.TEXT_ARRAY: xt.text_array_text,
}
_FROM_TEXT: dict[SqlType, Callable[[str], Any]] = {
    SqlType.BYTEA: xt.parse_bytea,
    SqlType.TIMESTAMPTZ: xt.parse_timestamptz,
    SqlType.INTERVAL: xt.parse_interval,
}
