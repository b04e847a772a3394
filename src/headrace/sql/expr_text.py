"""Text functions for webhook CHECKs, with PostgreSQL's names and results: split_part, position, substring
(positional and POSIX regex), regexp_match, ~ and ~*, length, left/right, replace, starts_with.
"""

from __future__ import annotations

import re
from typing import Any

from sqlglot import exp

from headrace.errors import DataError
from headrace.sql.expr import Columns, Compiled, _compiles
from headrace.sql.expr_calls import ANONYMOUS_FUNCTIONS, T, call_overloaded, compile_arguments

# -- text -------------------------------------------------------------------------------------------

def _split_part(text: str, delimiter: str, field: int) -> str:
    if field == 0:
        raise DataError("field position must not be zero", sqlstate="22023")
    if delimiter == "":
        return text if field in (1, -1) else ""
    parts = text.split(delimiter)
    index = field - 1 if field > 0 else len(parts) + field
    return parts[index] if 0 <= index < len(parts) else ""


@_compiles(exp.SplitPart)
def _split_part_node(node: exp.SplitPart, columns: Columns) -> Compiled:
    arguments = compile_arguments([node.this, node.args.get("delimiter"), node.args.get("part_index")], columns)
    return call_overloaded("split_part", arguments, [((T.TEXT, T.TEXT, T.INTEGER), T.TEXT, _split_part)])


@_compiles(exp.StrPosition)
def _position(node: exp.StrPosition, columns: Columns) -> Compiled:
    arguments = compile_arguments([node.args["substr"], node.this], columns)
    return call_overloaded("position", arguments, [((T.TEXT, T.TEXT), T.INTEGER, lambda sub, text: text.find(sub) + 1),
                                         ((T.BYTEA, T.BYTEA), T.INTEGER, lambda sub, data: data.find(sub) + 1)])


def _substring_positional(value: Any, start: int, length: int | None = None) -> Any:
    """PostgreSQL's substring: positions before 1 still count towards the length."""
    if length is not None and length < 0:
        raise DataError("negative substring length not allowed", sqlstate="22011")
    begin = max(start, 1) - 1
    end = len(value) if length is None else max(start + length - 1, 0)
    return value[begin:end] if end > begin else value[:0]


def _posix_regex(pattern: str, flags: int = 0) -> re.Pattern[str]:
    try:
        return re.compile(pattern, flags)
    except re.error as error:
        raise DataError(f"invalid regular expression: {error}", sqlstate="2201B") from None


def _substring_regex(text: str, pattern: str) -> str | None:
    found = _posix_regex(pattern).search(text)
    if found is None:
        return None
    return found.group(1) if found.re.groups else found.group(0)


@_compiles(exp.Substring)
def _substring(node: exp.Substring, columns: Columns) -> Compiled:
    arguments = compile_arguments([node.this, node.args.get("start"), node.args.get("length")], columns)
    if len(arguments) == 2 and arguments[1].sql_type in (T.TEXT, T.UNKNOWN) and arguments[0].sql_type is not T.BYTEA:
        return call_overloaded("substring", arguments, [((T.TEXT, T.TEXT), T.TEXT, _substring_regex)])
    return call_overloaded("substring", arguments, [
        ((T.TEXT, T.INTEGER), T.TEXT, _substring_positional),
        ((T.TEXT, T.INTEGER, T.INTEGER), T.TEXT, _substring_positional),
        ((T.BYTEA, T.INTEGER), T.BYTEA, _substring_positional),
        ((T.BYTEA, T.INTEGER, T.INTEGER), T.BYTEA, _substring_positional),
    ])


def _regexp_match(text: str, pattern: str, flags: str = "") -> list[str | None] | None:
    if "g" in flags:
        raise DataError('regexp_match() does not support the "global" option', sqlstate="22023",
                        hint="Use the regexp_matches function instead.")
    unknown = set(flags) - {"i", "c", "n", "s", "x"}
    if unknown:
        raise DataError(f'invalid regular expression option: "{sorted(unknown)[0]}"', sqlstate="22023")
    case = re.IGNORECASE if "i" in flags.replace("c", "") else 0
    found = _posix_regex(pattern, case).search(text)
    if found is None:
        return None
    return list(found.groups()) if found.re.groups else [found.group(0)]


ANONYMOUS_FUNCTIONS["regexp_match"] = [((T.TEXT, T.TEXT), T.TEXT_ARRAY, _regexp_match),
                              ((T.TEXT, T.TEXT, T.TEXT), T.TEXT_ARRAY, _regexp_match)]


@_compiles(exp.RegexpLike, exp.RegexpILike)
def _regexp_like(node: exp.Expression, columns: Columns) -> Compiled:
    flags = re.IGNORECASE if isinstance(node, exp.RegexpILike) else 0
    return call_overloaded("~", compile_arguments([node.this, node.expression], columns),
                 [((T.TEXT, T.TEXT), T.BOOLEAN, lambda text, pattern: _posix_regex(pattern, flags).search(text) is not None)])


@_compiles(exp.Length)
def _length(node: exp.Length, columns: Columns) -> Compiled:
    return call_overloaded("length", compile_arguments([node.this], columns), [((T.TEXT,), T.INTEGER, len), ((T.BYTEA,), T.INTEGER, len)])


def _left(text: str, count: int) -> str:
    return text[:count] if count >= 0 else text[: max(len(text) + count, 0)]


def _right(text: str, count: int) -> str:
    return (text[-count:] if count else "") if count >= 0 else text[min(-count, len(text)):]


@_compiles(exp.Left, exp.Right)
def _left_right(node: exp.Expression, columns: Columns) -> Compiled:
    name, implementation = ("left", _left) if isinstance(node, exp.Left) else ("right", _right)
    return call_overloaded(name, compile_arguments([node.this, node.expression], columns), [((T.TEXT, T.INTEGER), T.TEXT, implementation)])


@_compiles(exp.Replace)
def _replace(node: exp.Replace, columns: Columns) -> Compiled:
    arguments = compile_arguments([node.this, node.expression, node.args.get("replacement")], columns)
    return call_overloaded("replace", arguments, [((T.TEXT, T.TEXT, T.TEXT), T.TEXT,
                                         lambda text, old, new: text.replace(old, new) if old else text)])


@_compiles(exp.StartsWith)
def _starts_with(node: exp.StartsWith, columns: Columns) -> Compiled:
    return call_overloaded("starts_with", compile_arguments([node.this, node.expression], columns),
                 [((T.TEXT, T.TEXT), T.BOOLEAN, str.startswith)])

