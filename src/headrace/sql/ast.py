"""headrace's own statements, as sqlglot expression nodes so they live in the same tree as SELECT."""

from __future__ import annotations

from typing import Any

from sqlglot import exp


class CreateWebhookSource(exp.Expression):
    """CREATE SOURCE <name> FROM WEBHOOK BODY FORMAT <fmt> [INCLUDE HEADERS] [IDEMPOTENT (<expr>)]"""

    arg_types: dict[str, Any] = {
        "this": True,  # exp.Table: the source's (possibly qualified) name
        "body_format": True,  # str, lowercased
        "include_headers": False,  # bool
        "idempotent": False,  # exp.Expression
        "if_not_exists": False,
    }


class DropObject(exp.Expression):
    """DROP SOURCE [IF EXISTS] <name> [, ...] (the kinds grow with later statements)."""

    arg_types: dict[str, Any] = {"kind": True, "expressions": True, "if_exists": False}


class ShowObjects(exp.Expression):
    """SHOW SOURCES [FROM <schema>]"""

    arg_types: dict[str, Any] = {"kind": True, "schema": False}


class ShowVariable(exp.Expression):
    """SHOW <variable> | SHOW ALL"""

    arg_types: dict[str, Any] = {"this": True}
