"""Parsing: sqlglot's PostgreSQL dialect, extended with headrace's statements.

No statement is recognised by regular expressions: headrace's statements are parsed by the same
recursive-descent parser as SELECT, through overrides of sqlglot's statement entry points."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import sqlglot
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers
from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from headrace.errors import SyntaxError_
from headrace.sql import limits
from headrace.sql.ast import DropObject, ShowCreateObject, ShowObjects, ShowVariable
from headrace.sql.role_statements import parse_alter_role, parse_create_role, parse_drop_role, parse_grant
from headrace.sql.sink_grammar import SinkGrammar

# sqlglot warns with the statement's text when it falls back to an opaque Command: client bytes in the server's
# log (issue 20). What it could not parse is answered to the client instead.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

OBJECT_KINDS = {"SOURCE": "source", "SOURCES": "source"}


class HeadraceParser(SinkGrammar):  # sources, secrets (source_grammar.py), connections and sinks (sink_grammar.py)
    STATEMENT_PARSERS = {
        **Postgres.Parser.STATEMENT_PARSERS,
        TokenType.SHOW: lambda self: self._parse_show_statement(),
    }

    def _parse_create(self) -> exp.Expr:  # type: ignore[override]
        if self._match_text_seq("SOURCE"):
            return self._parse_create_source()
        if self._match_texts(("ROLE", "USER")):
            return parse_create_role(self, is_user=self._prev.text.upper() == "USER")
        if self._match_text_seq("SECRET"):
            return self._parse_secret(alter=False)
        if self._match_text_seq("CONNECTION"):
            return self._parse_create_connection()
        if self._match_text_seq("SINK"):
            return self._parse_create_sink()
        return super()._parse_create()

    def _parse_alter(self) -> exp.Expr:  # type: ignore[override]
        if self._match_texts(("ROLE", "USER")):
            return parse_alter_role(self)
        if self._match_text_seq("SOURCE"):
            return self._parse_alter_source()
        if self._match_text_seq("SECRET"):
            return self._parse_secret(alter=True)
        return super()._parse_alter()

    def _parse_drop(self, exists: bool = False, kind: str | None = None) -> exp.Expr:  # type: ignore[override]
        if self._match_text_seq("SOURCE"):
            if_exists = self._match_text_seq("IF", "EXISTS")
            names = self._parse_csv(self._parse_table_parts)
            cascade = bool(self._match_text_seq("CASCADE"))  # drops the materialized views reading it
            if not cascade:
                self._match_text_seq("RESTRICT")
            return DropObject(kind="source", expressions=names, if_exists=bool(if_exists), cascade=cascade)
        if self._match_texts(("ROLE", "USER")):
            return parse_drop_role(self)
        if self._match_text_seq("SECRET"):
            return self._parse_drop_secret()
        if self._match_text_seq("SINK"):
            return self._parse_drop_named("sink")
        if self._match_text_seq("CONNECTION"):
            return self._parse_drop_named("connection")
        return super()._parse_drop(exists=exists, kind=kind)

    def _parse_grant(self) -> exp.Expr:  # type: ignore[override]
        return parse_grant(self, revoke=False)  # privileges (sql/role_statements.py)

    def _parse_revoke(self) -> exp.Expr:  # type: ignore[override]
        return parse_grant(self, revoke=True)

    def _parse_types(self, *args: object, **kwargs: object) -> exp.Expr | None:  # type: ignore[override]
        # sqlglot stops after an OID-like type; PostgreSQL also has their arrays: $1::oid[] (asyncpg).
        parsed = super()._parse_types(*args, **kwargs)  # type: ignore[arg-type]
        if isinstance(parsed, exp.ObjectIdentifier) and self._match_pair(TokenType.L_BRACKET, TokenType.R_BRACKET):
            element = exp.DataType(this=exp.DataType.Type.USERDEFINED, kind=exp.to_identifier(parsed.name.lower()))
            return exp.DataType(this=exp.DataType.Type.ARRAY, expressions=[element], nested=True)
        return parsed

    def _parse_show_statement(self) -> exp.Expr:
        if self._match_text_seq("SOURCES"):
            schema = self._parse_id_var() if self._match(TokenType.FROM) else None
            return ShowObjects(kind="source", schema=schema.name if schema else None)
        if self._match_text_seq("SECRETS"):
            schema = self._parse_id_var() if self._match(TokenType.FROM) else None
            return ShowObjects(kind="secret", schema=schema.name if schema else None)
        if self._match_text_seq("MATERIALIZED", "VIEWS"):
            schema = self._parse_id_var() if self._match(TokenType.FROM) else None
            return ShowObjects(kind="materialized view", schema=schema.name if schema else None)
        if self._match_text_seq("SINKS"):
            schema = self._parse_id_var() if self._match(TokenType.FROM) else None
            return ShowObjects(kind="sink", schema=schema.name if schema else None)
        if self._match_text_seq("CONNECTIONS"):
            schema = self._parse_id_var() if self._match(TokenType.FROM) else None
            return ShowObjects(kind="connection", schema=schema.name if schema else None)
        if self._match_text_seq("INDEXES"):
            schema = self._parse_id_var() if self._match(TokenType.FROM) else None
            return ShowObjects(kind="index", schema=schema.name if schema else None)
        if self._match_text_seq("CREATE", "MATERIALIZED", "VIEW"):
            return ShowCreateObject(kind="materialized view", this=self._parse_table_parts())
        parts = []
        while self._curr and self._curr.token_type != TokenType.SEMICOLON:
            parts.append(self._curr.text)  # any token, dots included (SHOW myapp.setting)
            self._advance()
        if not parts:
            self.raise_error("Expected a variable name after SHOW")
        return ShowVariable(this=" ".join(parts).lower())


class HeadraceTokenizer(Postgres.Tokenizer):
    # sqlglot turns the rest of a SHOW into one opaque string; headrace parses SHOW itself.
    COMMANDS = Postgres.Tokenizer.COMMANDS - {TokenType.SHOW}


class Headrace(Postgres):
    Tokenizer = HeadraceTokenizer
    Parser = HeadraceParser


@dataclass(frozen=True, slots=True)
class ParsedStatement:
    sql: str  # this statement's own text, sliced from the input
    ast: exp.Expr


# Above this many characters text is split by the limits scan (sql/limits.py), linear and ~20x faster than sqlglot's
# tokenizer, which it otherwise takes as the reference.
SCAN_SPLIT_CHARS = 64 * 1024


def split_statements(sql: str) -> list[str]:
    """Split text into statements at top-level semicolons, using sqlglot's tokenizer (so that
    semicolons inside strings, identifiers and comments are not split on)."""
    if len(sql) > SCAN_SPLIT_CHARS:
        return limits.scan(sql, max_depth=None).statements
    try:
        tokens = Headrace().tokenize(sql)
    except TokenError as exc:
        raise SyntaxError_(f"syntax error: {exc}") from None
    statements: list[str] = []
    start: int | None = None
    end = 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            if start is not None:
                statements.append(sql[start : end + 1])
            start = None
            continue
        if start is None:
            start = token.start
        end = token.end
    if start is not None:
        statements.append(sql[start : end + 1])
    return statements


def parse_statement(sql: str) -> exp.Expr:
    """Parse exactly one statement. Syntax errors become 42601 with PostgreSQL's 1-based position."""
    from headrace.sql.session_statements import parse_session_statement  # imports this module

    try:
        # Unquoted names fold to lower case, as PostgreSQL folds them: `CREATE TABLE Foo` makes foo, which
        # `SELECT * FROM FOO` reads; "Foo" quoted stays Foo.
        return normalize_identifiers(_parse_statement(sql, parse_session_statement), dialect="postgres")
    except RecursionError:
        # Deeper than sqlglot's recursive descent goes (e.g. ~60 nested parentheses): PostgreSQL's answer for an
        # expression deeper than its stack.
        raise limits.StackDepthExceeded() from None


def parse_client_statement(sql: str) -> exp.Expr:
    """parse_statement for text a client sent: refused first if over the statement limits (sql/limits.py: 54000 too
    long, 54001 too deep), before sqlglot spends time and memory on it."""
    limits.check_statement(sql)
    return parse_statement(sql)


def _parse_statement(sql: str, parse_session_statement: Callable[..., exp.Expr | None]) -> exp.Expr:
    session_statement = parse_session_statement(sql, parse_statement)
    if session_statement is not None:
        return session_statement
    try:
        parsed = sqlglot.parse(sql, dialect=Headrace)
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        position = _position_of(sql, first.get("line"), first.get("col"))
        highlight = first.get("highlight")
        description = str(first.get("description") or exc).split(". Line")[0].split(" but got <Token")[0]
        if highlight:
            message = f'syntax error at or near "{highlight}"'
            detail = description
        else:
            message, detail = f"syntax error: {description}", None
        raise SyntaxError_(message, detail=detail, position=position) from None
    except TokenError as exc:
        raise SyntaxError_(f"syntax error: {exc}") from None
    statements = [stmt for stmt in parsed if stmt is not None]
    if len(statements) != 1:
        raise SyntaxError_("expected exactly one statement")
    statement = statements[0]
    if isinstance(statement, exp.Command):
        # sqlglot falls back to an opaque Command for syntax it does not know: refuse it rather
        # than guess at its meaning.
        raise SyntaxError_(f"syntax error at or near \"{statement.name}\"", position=1)
    return statement


def _position_of(sql: str, line: int | None, col: int | None) -> int | None:
    if not line or not col:
        return None
    lines = sql.split("\n")
    return sum(len(text) + 1 for text in lines[: line - 1]) + max(col - 1, 0) + 1 if line <= len(lines) else None
