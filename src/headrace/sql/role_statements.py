"""Parsing CREATE / ALTER / DROP ROLE (and USER), called from the extended sqlglot parser
(headrace.sql.parser) once it has seen the leading keywords."""

from __future__ import annotations

from typing import Any

from sqlglot import exp
from sqlglot.parser import Parser
from sqlglot.tokens import TokenType

from headrace.sql.ast import AlterRole, CreateRole, DropRole

# Options PostgreSQL has that change nothing in headrace (no inheritance, databases or replication).
_IGNORED_OPTIONS = ("INHERIT", "NOINHERIT", "CREATEDB", "NOCREATEDB", "CREATEROLE", "NOCREATEROLE",
                    "REPLICATION", "NOREPLICATION", "BYPASSRLS", "NOBYPASSRLS")
_FLAGS = {"LOGIN": ("login", True), "NOLOGIN": ("login", False),
          "SUPERUSER": ("superuser", True), "NOSUPERUSER": ("superuser", False)}


def parse_role_name(parser: Parser) -> str:
    identifier = parser._parse_id_var(any_token=True)
    if not isinstance(identifier, exp.Identifier) or not identifier.name:
        parser.raise_error("Expected a role name")
        return ""
    # PostgreSQL folds unquoted names to lower case.
    return identifier.name if identifier.args.get("quoted") else identifier.name.lower()


def parse_role_options(parser: Parser) -> dict[str, Any]:
    options: dict[str, Any] = {}
    parser._match(TokenType.WITH)
    while parser._curr and parser._curr.token_type != TokenType.SEMICOLON:
        word = parser._curr.text.upper()
        if word in _FLAGS:
            parser._advance()
            key, value = _FLAGS[word]
            options[key] = value
        elif word in _IGNORED_OPTIONS:
            parser._advance()
        elif parser._match_text_seq("ENCRYPTED", "PASSWORD") or parser._match_text_seq("PASSWORD"):
            if parser._match(TokenType.NULL):
                options["password"] = None
            elif parser._match(TokenType.STRING):
                options["password"] = parser._prev.text
            else:
                parser.raise_error("Expected a string or NULL after PASSWORD")
                break
        else:
            parser.raise_error(f"Unsupported role option {parser._curr.text!r}")
            break
    return options


def parse_create_role(parser: Parser, is_user: bool) -> CreateRole:
    name = parse_role_name(parser)
    options = {"login": is_user} | parse_role_options(parser)
    return CreateRole(this=name, options=options)


def parse_alter_role(parser: Parser) -> AlterRole:
    name = parse_role_name(parser)
    return AlterRole(this=name, options=parse_role_options(parser))


def parse_drop_role(parser: Parser) -> DropRole:
    if_exists = bool(parser._match_text_seq("IF", "EXISTS"))
    names = [parse_role_name(parser)]
    while parser._match(TokenType.COMMA):
        names.append(parse_role_name(parser))
    return DropRole(names=names, if_exists=if_exists)
