"""Just enough JSON Schema to pick conditional branches (oneOf, anyOf, if/then/else) for a value.

Flow applies a `reduce` annotation only where the schema that carries it validates the right-hand document.
headrace does not validate documents in general (the pipeline does that upstream); it evaluates a subschema
only to decide which branch of a conditional applies. Supported keywords: type, const, enum, required,
properties, patternProperties, additionalProperties, propertyNames, min/maxProperties, dependentRequired, items,
prefixItems, additionalItems, contains, min/maxItems, uniqueItems, minimum, maximum, exclusiveMinimum,
exclusiveMaximum, multipleOf, min/maxLength, pattern, allOf, anyOf, oneOf, not, if/then/else, $ref.
Other keywords (format, contentMediaType, ...) are annotations and never fail.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any
from urllib.parse import urldefrag

from headrace.errors import InvalidParameterValue
from headrace.materialize.reduce.values import MISSING, compare, parse_pointer, query

Schema = Any  # a dict, or a boolean schema


@lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


class SchemaIndex:
    """Resolves $ref within one schema document: "#", "#/json/pointer", "#anchor", and $id URIs."""

    def __init__(self, root: Schema) -> None:
        self.root = root
        self._resources: dict[str, Schema] = {"": root}
        self._anchors: dict[tuple[str, str], Schema] = {}
        self._walk(root, "")

    def _walk(self, schema: Schema, base: str) -> None:
        if isinstance(schema, list):
            for item in schema:
                self._walk(item, base)
            return
        if not isinstance(schema, dict):
            return
        ident = schema.get("$id")
        if isinstance(ident, str):
            base = urldefrag(ident).url
            self._resources[base] = schema
        anchor = schema.get("$anchor")
        if isinstance(anchor, str):
            self._anchors[(base, anchor)] = schema
            self._anchors[("", anchor)] = schema
        for key, value in schema.items():
            if key not in ("const", "enum", "default", "examples", "reduce"):
                self._walk(value, base)

    def resolve(self, ref: str) -> Schema:
        url, fragment = urldefrag(ref)
        resource = self._resources.get(url)
        if resource is None:
            raise InvalidParameterValue(f"cannot resolve $ref {ref!r}: unknown schema {url!r}")
        if fragment == "":
            return resource
        if fragment.startswith("/"):
            target = query(parse_pointer(fragment), resource)
            if target is MISSING:
                raise InvalidParameterValue(f"cannot resolve $ref {ref!r}: no such location")
            return target
        target = self._anchors.get((url, fragment))
        if target is None:
            raise InvalidParameterValue(f"cannot resolve $ref {ref!r}: no $anchor {fragment!r}")
        return target


def _json_equal(a: Any, b: Any) -> bool:
    # Flow's order ranks booleans apart from numbers, so true != 1 while 1 == 1.0, as JSON Schema wants.
    return compare(a, b) == 0


def _is_type(value: Any, name: str) -> bool:
    t = type(value)
    if name == "object":
        return t is dict
    if name == "array":
        return t is list
    if name == "string":
        return t is str
    if name == "boolean":
        return t is bool
    if name == "null":
        return value is None
    if name == "number":
        return t is int or t is float
    if name == "integer":
        return t is int or (t is float and value.is_integer())
    return False


def is_valid(schema: Schema, value: Any, index: SchemaIndex) -> bool:
    """Whether `value` validates against `schema` (within the keywords listed in this module's docstring)."""
    if schema is True or schema == {}:
        return True
    if schema is False:
        return False
    if not isinstance(schema, dict):
        return True
    ref = schema.get("$ref")
    if isinstance(ref, str) and not is_valid(index.resolve(ref), value, index):
        return False
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is_type(value, n) for n in names):
            return False
    if "const" in schema and not _json_equal(schema["const"], value):
        return False
    if "enum" in schema and not any(_json_equal(option, value) for option in schema["enum"]):
        return False
    t = type(value)
    if t is dict and not _valid_object(schema, value, index):
        return False
    if t is list and not _valid_array(schema, value, index):
        return False
    if (t is int or t is float) and not _valid_number(schema, value):
        return False
    if t is str and not _valid_string(schema, value):
        return False
    for sub in schema.get("allOf", ()):
        if not is_valid(sub, value, index):
            return False
    if "anyOf" in schema and not any(is_valid(sub, value, index) for sub in schema["anyOf"]):
        return False
    if "oneOf" in schema and sum(1 for sub in schema["oneOf"] if is_valid(sub, value, index)) != 1:
        return False
    if "not" in schema and is_valid(schema["not"], value, index):
        return False
    if "if" in schema:
        branch = "then" if is_valid(schema["if"], value, index) else "else"
        if branch in schema and not is_valid(schema[branch], value, index):
            return False
    return True


def _valid_object(schema: dict[str, Any], value: dict[str, Any], index: SchemaIndex) -> bool:
    for name in schema.get("required", ()):
        if name not in value:
            return False
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        return False
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        return False
    for name, needed in schema.get("dependentRequired", {}).items():
        if name in value and any(n not in value for n in needed):
            return False
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    additional = schema.get("additionalProperties", True)
    names = schema.get("propertyNames")
    for name, item in value.items():
        if names is not None and not is_valid(names, name, index):
            return False
        matched = False
        if name in properties:
            matched = True
            if not is_valid(properties[name], item, index):
                return False
        for pattern, sub in patterns.items():
            if _regex(pattern).search(name):
                matched = True
                if not is_valid(sub, item, index):
                    return False
        if not matched and not is_valid(additional, item, index):
            return False
    return True


def _valid_array(schema: dict[str, Any], value: list[Any], index: SchemaIndex) -> bool:
    if "minItems" in schema and len(value) < schema["minItems"]:
        return False
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return False
    prefix, rest = item_schemas(schema)
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else rest
        if sub is not None and not is_valid(sub, item, index):
            return False
    if "contains" in schema and not any(is_valid(schema["contains"], item, index) for item in value):
        return False
    if schema.get("uniqueItems"):
        for i, a in enumerate(value):
            if any(_json_equal(a, b) for b in value[i + 1:]):
                return False
    return True


def item_schemas(schema: dict[str, Any]) -> tuple[list[Schema], Schema | None]:
    """(schemas of leading items by position, schema of every later item or None) under either draft's spelling:
    2020-12 prefixItems + items, or 2019-09 items as a list + additionalItems."""
    items = schema.get("items")
    if "prefixItems" in schema:
        return list(schema["prefixItems"]), items
    if isinstance(items, list):
        return items, schema.get("additionalItems")
    return [], items


def _valid_number(schema: dict[str, Any], value: float) -> bool:
    if "minimum" in schema and value < schema["minimum"]:
        return False
    if "maximum" in schema and value > schema["maximum"]:
        return False
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        return False
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        return False
    if "multipleOf" in schema:
        quotient = value / schema["multipleOf"]
        if not float(quotient).is_integer():
            return False
    return True


def _valid_string(schema: dict[str, Any], value: str) -> bool:
    if "minLength" in schema and len(value) < schema["minLength"]:
        return False
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return False
    if "pattern" in schema and not _regex(schema["pattern"]).search(value):
        return False
    return True
