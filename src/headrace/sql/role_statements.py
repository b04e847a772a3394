"""Parsing CREATE / ALTER / DROP ROLE (and USER) and GRANT / REVOKE of privileges, called from the extended
sqlglot parser (headrace.sql.parser) once it has seen the leading keywords."""

from __future__ import annotations

from typing import Any

from sqlglot import exp
from sqlglot.parser import Parser
from sqlglot.tokens import TokenType

from headrace.errors import FeatureNotSupported
from headrace.sql.ast import AlterRole, CreateRole, DropRole, GrantPrivileges

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


# GRANT's privilege keywords (PostgreSQL's; TEMP is TEMPORARY)
PRIVILEGE_KEYWORDS = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "USAGE", "CREATE",
                      "CONNECT", "TEMPORARY", "TEMP")
_UNSUPPORTED_KINDS = ("SEQUENCE", "FUNCTION", "PROCEDURE", "ROUTINE", "LANGUAGE", "LARGE", "TABLESPACE", "TYPE",
                      "DOMAIN", "FOREIGN", "PARAMETER", "ALL")


def parse_grant(parser: Parser, revoke: bool) -> GrantPrivileges:
    """GRANT privileges ON objects TO grantees [WITH GRANT OPTION] [GRANTED BY role], or
    REVOKE [GRANT OPTION FOR] privileges ON objects FROM grantees [CASCADE | RESTRICT]."""
    grant_option = bool(revoke and parser._match_text_seq("GRANT", "OPTION", "FOR"))
    privileges = _parse_privileges(parser)
    if not parser._match(TokenType.ON):
        parser.raise_error("Expected ON")
    kind, objects = _parse_objects(parser)
    if not parser._match_text_seq("FROM" if revoke else "TO") and not parser._match(
            TokenType.FROM if revoke else TokenType.ALIAS):
        parser.raise_error("Expected FROM" if revoke else "Expected TO")
    grantees = [_parse_grantee(parser)]
    while parser._match(TokenType.COMMA):
        grantees.append(_parse_grantee(parser))
    if not revoke and parser._match_text_seq("WITH", "GRANT", "OPTION"):
        grant_option = True
    if parser._match_text_seq("GRANTED", "BY"):
        _parse_grantee(parser)  # only the current role may be named (checked as PostgreSQL does: it is the owner)
    if revoke and not parser._match_text_seq("CASCADE"):
        parser._match_text_seq("RESTRICT")  # no grant options, so nothing depends on a grant: both are the same
    return GrantPrivileges(revoke=revoke, privileges=privileges, kind=kind, objects=objects, grantees=grantees,
                           grant_option=grant_option)


def _parse_privileges(parser: Parser) -> list[str]:
    if parser._match(TokenType.ALL):
        parser._match_text_seq("PRIVILEGES")
        return ["ALL"]
    names = []
    while True:
        word = (parser._curr.text.upper() if parser._curr else "")
        if word not in PRIVILEGE_KEYWORDS:
            parser.raise_error("Expected a privilege (SELECT, INSERT, UPDATE, DELETE, USAGE, CREATE, ...) or ALL")
            return names
        parser._advance()
        if parser._curr is not None and parser._curr.token_type == TokenType.L_PAREN:
            raise FeatureNotSupported("column privileges are not supported")
        names.append("TEMPORARY" if word == "TEMP" else word)
        if not parser._match(TokenType.COMMA):
            return names


def _parse_objects(parser: Parser) -> tuple[str, list[tuple[str | None, str]]]:
    if parser._match_text_seq("ALL", "TABLES", "IN", "SCHEMA"):
        return "all tables", _parse_names(parser, qualified=False)
    for keyword, kind in (("SCHEMA", "schema"), ("DATABASE", "database"), ("SECRET", "secret"),
                          ("CONNECTION", "connection")):
        if parser._match_text_seq(keyword):
            return kind, _parse_names(parser, qualified=kind in ("secret", "connection"))
    if parser._curr is not None and parser._curr.text.upper() in _UNSUPPORTED_KINDS and parser._next is not None \
            and parser._next.token_type not in (TokenType.COMMA, TokenType.FROM, TokenType.ALIAS):
        raise FeatureNotSupported(f"GRANT ON {parser._curr.text.upper()} is not supported (headrace has tables, "
                                  "sources, materialized views, secrets, connections, schema public and its database)")
    parser._match(TokenType.TABLE)
    return "table", _parse_names(parser, qualified=True)


def _parse_names(parser: Parser, qualified: bool) -> list[tuple[str | None, str]]:
    names = [_parse_name(parser, qualified)]
    while parser._match(TokenType.COMMA):
        names.append(_parse_name(parser, qualified))
    return names


def _parse_name(parser: Parser, qualified: bool) -> tuple[str | None, str]:
    parts = [parse_role_name(parser)]
    while qualified and parser._match(TokenType.DOT):
        parts.append(parse_role_name(parser))
    return (parts[-2] if len(parts) > 1 else None), parts[-1]


CURRENT_ROLE_GRANTEE = "\0current_user"  # CURRENT_USER / CURRENT_ROLE / SESSION_USER: the executing role


def _parse_grantee(parser: Parser) -> str:
    """A role name, "" for PUBLIC, CURRENT_ROLE_GRANTEE for CURRENT_USER and its synonyms."""
    parser._match_text_seq("GROUP")  # PostgreSQL's TO GROUP role: the same as TO role
    token = parser._curr
    if token is not None and token.token_type != TokenType.IDENTIFIER:  # an unquoted word
        word = token.text.upper()
        if word == "PUBLIC":
            parser._advance()
            return ""
        if word in ("CURRENT_USER", "CURRENT_ROLE", "SESSION_USER"):
            parser._advance()
            return CURRENT_ROLE_GRANTEE
    return parse_role_name(parser)
