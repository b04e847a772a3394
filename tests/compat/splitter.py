"""Split a psql script into the statements psql would send, as psql's lexer does (psqlscan.l, simplified).

A statement ends at a `;` outside quotes, comments, parentheses and the BEGIN ... END body of a CREATE [OR REPLACE]
FUNCTION | PROCEDURE (psql's heuristic: BEGIN and, inside it, CASE open; END closes). Quoting: '...' (E'...' with backslash escapes),
"...", $tag$...$tag$; comments `--` and nested `/* */` are dropped. A backslash outside quotes starts a psql
meta-command running to the end of the line: `\\g` sends the buffer; `\\gset`, `\\gexec`, `\\gdesc`, `\\gx`,
`\\crosstabview` end the buffer as a statement the harness does not run (kind SKIPPED); other meta-commands are
recorded as skipped and leave the buffer alone. `COPY ... FROM stdin;` takes the lines up to `\\.` as its data.
`\\set NAME :abs_srcdir '/data/x'` followed by `COPY t FROM :'NAME'` becomes a COPY FROM STDIN of that data file; another
`\\set NAME 'value'` defines a variable whose `:NAME` is replaced by its value, which is lexed in turn (its `;` split)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

_SKIPPING_TERMINATORS = {"gset", "gexec", "gdesc", "gx", "crosstabview", "gp"}
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\x80-\uffff][A-Za-z_0-9\x80-\uffff]*)?\$")
_COPY_FROM_STDIN = re.compile(r"^\s*copy\b.*\bfrom\s+stdin\b", re.IGNORECASE | re.DOTALL)
_COPY_FROM_VARIABLE = re.compile(r"^(\s*copy\b.*\bfrom\s+):'([A-Za-z_]+)'(.*)$", re.IGNORECASE | re.DOTALL)
_SET_DATA_FILE = re.compile(r"^set\s+([A-Za-z_]+)\s+:abs_srcdir\s+'(/data/[^']+)'\s*$")
_STANDARD_STRINGS = re.compile(
    r"^\s*(?:(reset)|set\s+(?:session\s+)?)\s*standard_conforming_strings\b(?:\s*(?:=|to)\s*'?(\w+))?", re.I)
_SET_VARIABLE = re.compile(r"^set\s+([A-Za-z_][A-Za-z_0-9]*)\s+(.*)$", re.DOTALL)
_VARIABLE_VALUE_PART = re.compile(r"'((?:[^']|'')*)'|(\S+)")
_IDENTIFIER = re.compile(r"[A-Za-z_\x80-\uffff][A-Za-z_0-9$\x80-\uffff]*")
_ROUTINE_HEADS = (("create", "function"), ("create", "procedure"), ("create", "or", "replace", "function"),
                  ("create", "or", "replace", "procedure"))


class Kind(enum.Enum):
    SQL = "sql"  # run it
    SKIPPED = "skipped"  # a psql meta-command, or a statement ended by one the harness does not emulate


@dataclass(frozen=True)
class Statement:
    line: int  # 1-based line where the statement (or meta-command) starts
    sql: str
    kind: Kind = Kind.SQL
    reason: str = ""  # why skipped
    copy_data: str | None = None  # inline COPY FROM stdin data
    copy_file: str | None = None  # data file (relative to the regress dir) for COPY FROM :'var'

    @property
    def is_select(self) -> bool:
        """Whether it is a query returning rows by its first keyword (SELECT, WITH without DML, VALUES, TABLE)."""
        words = re.findall(r"[A-Za-z_]+", self.sql[:2000].lower())
        if not words:
            return False
        if words[0] == "with":
            return not any(word in ("insert", "update", "delete", "merge") for word in words)
        return words[0] in ("select", "values", "table") or self.sql.lstrip().startswith("(")


def _is_identifier_char(char: str) -> bool:
    return char.isalnum() or char in "_$"


def has_top_level_order_by(sql: str) -> bool:
    """Whether `sql` has ORDER BY outside parentheses (so its rows' order is defined); quotes and comments must
    already be dropped or never contain the words at depth 0 (the splitter's output drops comments)."""
    depth = 0
    masked = []
    i = 0
    while i < len(sql):
        char = sql[i]
        if char in "'\"":
            end = sql.find(char, i + 1)
            end = len(sql) if end < 0 else end
            masked.append(" " * (end + 1 - i))
            i = end + 1
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        masked.append(char if depth == 0 else " ")
        i += 1
    return re.search(r"\border\s+by\b", "".join(masked), re.IGNORECASE) is not None


def split(script: str) -> list[Statement]:
    statements: list[Statement] = []
    variables: dict[str, str] = {}  # data files, for COPY FROM :'name'
    values: dict[str, str] = {}  # other psql variables, interpolated as :name
    buffer: list[str] = []
    words: list[str] = []  # the statement's first identifiers, to recognize CREATE FUNCTION
    standard_strings = True  # psql follows standard_conforming_strings: off makes '...' take backslash escapes
    begin_depth = 0
    start_line = 0
    depth = 0
    i = 0
    line = 1
    n = len(script)

    def emit(kind: Kind = Kind.SQL, reason: str = "") -> None:
        nonlocal buffer, depth, words, begin_depth, standard_strings
        sql = "".join(buffer).strip()
        setting = _STANDARD_STRINGS.match(sql)
        if setting:
            standard_strings = bool(setting.group(1)) or (setting.group(2) or "on").lower() in ("on", "true", "1")
        buffer = []
        depth = 0
        words = []
        begin_depth = 0
        if sql:
            statements.append(Statement(start_line, sql, kind, reason))

    def take(text: str) -> None:
        nonlocal start_line, line
        if not buffer and not text.isspace():
            start_line = line
        if buffer or not text.isspace():
            buffer.append(text)
        line += text.count("\n")

    while i < n:
        char = script[i]
        if char == "-" and script.startswith("--", i):
            end = script.find("\n", i)
            i = n if end < 0 else end  # the newline itself is taken next
            continue
        if char == "/" and script.startswith("/*", i):
            nesting, j = 0, i
            while j < n:
                if script.startswith("/*", j):
                    nesting, j = nesting + 1, j + 2
                elif script.startswith("*/", j):
                    nesting, j = nesting - 1, j + 2
                    if nesting == 0:
                        break
                else:
                    j += 1
            take(" ")
            line += script.count("\n", i, j)
            i = j
            continue
        if char == "'":
            escaped = not standard_strings or (
                i > 0 and script[i - 1] in "eE" and (i < 2 or not _is_identifier_char(script[i - 2])))
            j = _closing_quote(script, i, "'", backslash_escapes=escaped)
            take(script[i:j + 1])
            i = j + 1
            continue
        if char == '"':
            j = _closing_quote(script, i, '"', backslash_escapes=False)
            take(script[i:j + 1])
            i = j + 1
            continue
        if char == "$" and (i == 0 or not _is_identifier_char(script[i - 1])):
            match = _DOLLAR_TAG.match(script, i)
            if match:
                end = script.find(match.group(0), match.end())
                end = n if end < 0 else end + len(match.group(0))
                take(script[i:end])
                i = end
                continue
        if char == ":" and not script.startswith("::", i) and (i == 0 or script[i - 1] != ":"):
            name = _IDENTIFIER.match(script, i + 1)
            if name and name.group(0) in values:
                # psql lexes a variable's value in place (its semicolons end statements)
                script = script[:i] + values[name.group(0)].replace("\n", " ") + script[name.end():]
                n = len(script)
                continue
        if (char.isalpha() or char == "_") and (i == 0 or not _is_identifier_char(script[i - 1])):
            word = _IDENTIFIER.match(script, i)
            if word:
                text = word.group(0).lower()
                if len(words) < 4:
                    words.append(text)
                if depth == 0 and any(tuple(words[:len(head)]) == head for head in _ROUTINE_HEADS):
                    if text == "begin" or (text == "case" and begin_depth > 0):
                        begin_depth += 1
                    elif text == "end" and begin_depth > 0:
                        begin_depth -= 1
                take(word.group(0))
                i = word.end()
                continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "\\":
            end = script.find("\n", i)
            end = n if end < 0 else end
            command = script[i + 1:end].strip()
            name = command.split(None, 1)[0] if command else ""
            if name in _SKIPPING_TERMINATORS:
                emit(Kind.SKIPPED, f"ended by \\{name}")
            elif name == "g":
                emit()
            else:
                data_file = _SET_DATA_FILE.match(command)
                variable = _SET_VARIABLE.match(command)
                if data_file:
                    variables[data_file.group(1)] = data_file.group(2).lstrip("/")
                elif variable:
                    values[variable.group(1)] = "".join(
                        quoted.replace("''", "'") if bare is None else bare
                        for quoted, bare in (m.groups() for m in _VARIABLE_VALUE_PART.finditer(variable.group(2))))
                statements.append(Statement(line, "\\" + command, Kind.SKIPPED, "psql meta-command"))
            i = end
            continue
        elif char == ";" and depth == 0 and begin_depth == 0:
            buffer.append(";")
            statement_line = start_line
            emit()
            i += 1
            last = statements[-1] if statements and statements[-1].line == statement_line else None
            if last is not None and last.kind is Kind.SQL:
                statements[-1] = _with_copy_source(last, script, i, variables)
                if statements[-1].copy_data is not None:
                    i, line = _skip_copy_data(script, i, line)
            continue
        take(char)
        i += 1
    emit()
    return statements


def _with_copy_source(statement: Statement, script: str, position: int, variables: dict[str, str]) -> Statement:
    from_variable = _COPY_FROM_VARIABLE.match(statement.sql)
    if from_variable and from_variable.group(2) in variables:
        sql = f"{from_variable.group(1)}STDIN{from_variable.group(3)}"
        return Statement(statement.line, sql, copy_file=variables[from_variable.group(2)])
    if not _COPY_FROM_STDIN.match(statement.sql):
        return statement
    start = script.find("\n", position)
    start = len(script) if start < 0 else start + 1
    data: list[str] = []
    for data_line in script[start:].splitlines(keepends=True):
        if data_line.rstrip("\r\n") == "\\.":
            break
        data.append(data_line)
    return Statement(statement.line, statement.sql, copy_data="".join(data))


def _skip_copy_data(script: str, position: int, line: int) -> tuple[int, int]:
    """Move past the inline COPY data that follows `position` (through its `\\.` line)."""
    terminator = re.compile(r"^\\\.\r?$", re.MULTILINE)
    match = terminator.search(script, position)
    end = len(script) if match is None else match.end()
    return end, line + script.count("\n", position, end)


def _closing_quote(script: str, start: int, quote: str, *, backslash_escapes: bool) -> int:
    """Where the quoted text opened at `start` ends (a doubled quote is one character; with `backslash_escapes`,
    a backslash escapes what follows); len(script) if it never does."""
    j = start + 1
    while j < len(script):
        if backslash_escapes and script[j] == "\\":
            j += 2
            continue
        if script[j] == quote:
            if script.startswith(quote * 2, j):
                j += 2
                continue
            return j
        j += 1
    return j
