"""Limits on SQL text, checked before the parser sees it: a statement size limit and an expression depth limit.

The parser (sqlglot, sql/parser.py) is recursive descent in Python: a 10 MB `1+1+...` cost 21 GB and minutes of
CPU, and 100 nested parentheses exhaust Python's recursion limit. So the text is measured first, by one regular
expression pass that only knows what delimits SQL tokens (quotes, comments, dollar quoting, parentheses, commas,
semicolons, operators, AND / OR), and refused before any parsing when it is too large or too deep:

* `StatementTooLong` (54000) beyond `max_statement_bytes` (UTF-8 bytes, 1 MiB by default: --max-statement-bytes);
* `StackDepthExceeded` (54001, PostgreSQL's "stack depth limit exceeded" and its HINT) when the estimated
  expression depth passes MAX_EXPRESSION_DEPTH. The estimate: each open parenthesis or bracket is one level, and
  within a level every binary operator since the last comma, AND or OR is one more (a left-deep `a+b+c` chain
  nests one level per operator in the tree; AND / OR lists are flat). PostgreSQL itself answers 54001 for a
  chain of 10,000 `+`; DuckDB, which runs the translated SELECT, stops at 1,000 levels (max_expression_depth).

Anything deeper that still reaches the parser or planner ends in Python's RecursionError, which the session
turns into the same 54001 (coordinator/client.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from headrace.errors import HeadraceError

DEFAULT_MAX_STATEMENT_BYTES = 1 << 20
MAX_EXPRESSION_DEPTH = 1000
STACK_DEPTH_HINT = ('Increase the configuration parameter "max_stack_depth" (currently 2048kB), after ensuring the '
                    "platform's stack depth limit is adequate.")

# Text at least this long is split, parsed and planned on PARSE_EXECUTOR, off the event loop (coordinator/client.py,
# coordinator/coordinator.py): sqlglot parses some 30 KB/s of dense expressions and planning costs as much again,
# so a statement of a few KB already costs milliseconds (a 2 MB one stalled webhooks 85 s). Below it the thread
# hop (~0.1 ms) would cost more than it saves.
OFF_LOOP_PARSE_CHARS = 4096
# One thread: concurrent large statements queue rather than multiply the CPU and memory they take.
PARSE_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="headrace-parse")
_T = TypeVar("_T")

# Settable once at server start (server.py, from --max-statement-bytes).
max_statement_bytes = DEFAULT_MAX_STATEMENT_BYTES


class StatementTooLong(HeadraceError):
    sqlstate = "54000"  # program_limit_exceeded
    http_status = 413


class StackDepthExceeded(HeadraceError):
    sqlstate = "54001"  # statement_too_complex
    http_status = 400

    def __init__(self) -> None:
        super().__init__("stack depth limit exceeded", hint=STACK_DEPTH_HINT)


async def off_loop(function: Callable[..., _T], *args: Any) -> _T:
    """Run a parsing or planning step on PARSE_EXECUTOR."""
    return await asyncio.get_running_loop().run_in_executor(PARSE_EXECUTOR, function, *args)


def configure(max_bytes: int) -> None:
    """Set the statement size limit of this process (the server's --max-statement-bytes)."""
    global max_statement_bytes
    if max_bytes < 1024:
        raise ValueError("--max-statement-bytes must be at least 1024")
    max_statement_bytes = max_bytes


# What delimits tokens, in the order tried at one position. Everything else (words, numbers, whitespace) is
# skipped by the regular expression engine without a Python-level step.
_TOKENS = re.compile(r"""
      (?P<line_comment>--[^\n]*)
    | (?P<block_comment>/\*)
    | (?P<escape_string>(?<![A-Za-z_0-9$])[eE]'(?:[^'\\]|''|\\.)*')  # E'..\'..': backslash escapes
    | (?P<string>'(?:[^']|'')*')                                        # standard_conforming_strings: no escapes
    | (?P<identifier>"(?:[^"]|"")*")
    | (?P<dollar>\$(?:[A-Za-z_\x80-\uffff][A-Za-z_0-9\x80-\uffff]*)?\$)
    | (?P<parameter>\$[0-9]+)
    | (?P<open>[(\[])
    | (?P<close>[)\]])
    | (?P<separator>[,;])
    | (?P<boolean>(?<![A-Za-z_0-9$])(?:[aA][nN][dD]|[oO][rR])(?![A-Za-z_0-9$]))
    | (?P<operator>::|[-+*/%^<>=~!@#&|`?]+)
""", re.VERBOSE)
_BLOCK_COMMENT_PARTS = re.compile(r"/\*|\*/")


@dataclass(frozen=True, slots=True)
class TextShape:
    """What one scan of SQL text found."""

    statements: list[str]  # the text split at semicolons outside quotes and comments (empty statements dropped)
    depth: int  # the estimated expression depth (see module doc)


def check_statement(sql: str) -> None:
    """Refuse `sql` (one or more statements from a client) if it is too long or too deep; cheap next to parsing it.
    Text the server wrote itself (the catalog's CREATE statements) is not checked: a lower limit set later must
    not make a server unable to read its own catalog."""
    check_size(sql)
    scan(sql)


def check_size(sql: str) -> None:
    # A character is at most 4 UTF-8 bytes: most texts are decided without encoding them.
    if len(sql) <= max_statement_bytes // 4:
        return
    size = len(sql.encode("utf-8", "surrogatepass"))
    if size > max_statement_bytes:
        raise StatementTooLong(f"statement is too long: {size} bytes, the limit is {max_statement_bytes}",
                               hint="raise the server's --max-statement-bytes, or send rows with COPY FROM STDIN")


def scan(sql: str, max_depth: int | None = MAX_EXPRESSION_DEPTH) -> TextShape:
    """Split `sql` at semicolons (outside quotes and comments) and estimate its expression depth; raises
    StackDepthExceeded as soon as the estimate passes `max_depth` (None: never). Unterminated quotes or comments run
    to the end of the text (the parser reports them)."""
    limit = max_depth if max_depth is not None else len(sql) + 1
    statements: list[str] = []
    levels = [0]  # operators since the last separator, per open parenthesis level
    depth = total = 0
    start = position = 0
    length = len(sql)
    while position < length:
        match = _TOKENS.search(sql, position)
        if match is None:
            break
        kind = match.lastgroup
        position = match.end()
        if kind == "operator":
            levels[-1] += 1
            total += 1
        elif kind == "open":
            levels.append(0)
            total += 1
        elif kind == "close":
            if len(levels) > 1:
                total -= levels.pop() + 1
        elif kind == "separator" and match.group() == ";":
            # Every semicolon ends a statement, inside parentheses too (as sqlglot's tokenizer splits; such a
            # statement is a syntax error either way).
            _add_statement(statements, sql[start:match.start()])
            start = position
            levels, total = [0], 0
        elif kind == "separator" or kind == "boolean":
            total -= levels[-1]
            levels[-1] = 0
        elif kind == "block_comment":
            position = _end_of_block_comment(sql, position)
        elif kind == "dollar":
            end = sql.find(match.group(), position)
            position = length if end < 0 else end + len(match.group())
        if total > depth:
            depth = total
            if depth > limit:
                raise StackDepthExceeded()
    _add_statement(statements, sql[start:])
    return TextShape(statements, depth)


def _add_statement(statements: list[str], text: str) -> None:
    text = text.strip()
    if text and not _only_comments(text):
        statements.append(text)


def _only_comments(text: str) -> bool:
    without = re.sub(r"--[^\n]*", "", text)
    position = 0
    while (found := without.find("/*", position)) >= 0:
        end = _end_of_block_comment(without, found + 2)
        without = without[:found] + without[end:]
        position = found
    return not without.strip()


def _end_of_block_comment(sql: str, position: int) -> int:
    """The position after the `*/` closing the block comment opened before `position` (they nest, as in
    PostgreSQL); the end of the text if it is never closed."""
    nesting = 1
    for part in _BLOCK_COMMENT_PARTS.finditer(sql, position):
        nesting += 1 if part.group() == "/*" else -1
        if nesting == 0:
            return part.end()
    return len(sql)
