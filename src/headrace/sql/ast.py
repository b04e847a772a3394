"""headrace's own statements, as sqlglot expression nodes so they live in the same tree as SELECT."""

from __future__ import annotations

from typing import Any

from sqlglot import exp


class CreateWebhookSource(exp.Expression):
    """CREATE SOURCE <name> FROM WEBHOOK BODY FORMAT <fmt> [INCLUDE ...] [CHECK (...)] [IDEMPOTENT (<expr>) [WINDOW '<interval>']]
    Parsed by headrace.sql.source_grammar; expressions are kept as the text the user wrote."""

    arg_types: dict[str, Any] = {
        "this": True,  # exp.Table: the source's (possibly qualified) name
        "body_format": True,  # str: text | json | json_array | bytes
        "include_headers": False,  # bool
        "headers_allowed": False,  # list[str]: INCLUDE HEADERS ('a', ...)
        "headers_excluded": False,  # list[str]: INCLUDE HEADERS (NOT 'a', ...)
        "header_columns": False,  # list[(header, column, as_bytes)]
        "check": False,  # str: the CHECK expression
        "check_options": False,  # list[(kind, alias, as_bytes, secret name or None)]
        "idempotent": False,  # str: the IDEMPOTENT expression
        "window": False,  # str: the WINDOW interval literal
        "if_not_exists": False,
    }


class CreateSecret(exp.Expression):
    """CREATE SECRET [IF NOT EXISTS] <name> AS <value> (`value`: the expression's text) and
    ALTER SECRET [IF EXISTS] <name> AS <value> (`alter`: True)."""

    arg_types: dict[str, Any] = {"this": True, "value": True, "if_not_exists": False, "if_exists": False,
                                 "alter": False}


class AlterSourceWindow(exp.Expression):
    """ALTER SOURCE [IF EXISTS] <name> SET (WINDOW = '<interval>')"""

    arg_types: dict[str, Any] = {"this": True, "window": True, "if_exists": False}


class DropObject(exp.Expression):
    """DROP SOURCE | SECRET [IF EXISTS] <name> [, ...] [CASCADE | RESTRICT] (the kinds grow with later statements)."""

    arg_types: dict[str, Any] = {"kind": True, "expressions": True, "if_exists": False, "cascade": False}


class ShowObjects(exp.Expression):
    """SHOW SOURCES | SECRETS [FROM <schema>]"""

    arg_types: dict[str, Any] = {"kind": True, "schema": False}


class ShowVariable(exp.Expression):
    """SHOW <variable> | SHOW ALL"""

    arg_types: dict[str, Any] = {"this": True}


# --- session-level statements (seed 004: prepared statements, cursors, COPY, variables) --------
# Parsed by headrace.sql.session_statements; executed by headrace.coordinator.session_sql.


class PrepareStatement(exp.Expression):
    """PREPARE <name> [(<type>, ...)] AS <statement>"""

    arg_types: dict[str, Any] = {"this": True, "param_types": True, "statement": True, "statement_sql": True}


class ExecuteStatement(exp.Expression):
    """EXECUTE <name> [(<expr>, ...)]"""

    arg_types: dict[str, Any] = {"this": True, "params": True}


class DeallocateStatement(exp.Expression):
    """DEALLOCATE [PREPARE] <name> | ALL (`this` is None for ALL)"""

    arg_types: dict[str, Any] = {"this": False}


class DeclareCursor(exp.Expression):
    """DECLARE <name> [BINARY] [NO SCROLL] CURSOR [WITH[OUT] HOLD] FOR <query>"""

    arg_types: dict[str, Any] = {"this": True, "hold": True, "binary": True, "statement": True,
                                 "statement_sql": True, "scroll": False}


class FetchCursor(exp.Expression):
    """FETCH | MOVE [direction] [FROM | IN] <name> [WITH (timeout = '1s')]: `direction` "forward" (the default),
    "backward", "absolute" or "relative" with its `count` (None means ALL); `move` for MOVE; `timeout` is the
    option's text or None."""

    arg_types: dict[str, Any] = {"this": True, "count": False, "timeout": False, "direction": False, "move": False}


class CloseCursor(exp.Expression):
    """CLOSE <name> | ALL (`this` is None for ALL)"""

    arg_types: dict[str, Any] = {"this": False}


class SetVariable(exp.Expression):
    """SET [SESSION | LOCAL] <name> {TO | =} <value> [, ...] | DEFAULT; SET TIME ZONE <value>.
    `values` is None for DEFAULT."""

    arg_types: dict[str, Any] = {"this": True, "values": False, "local": False}


class SetTransaction(exp.Expression):
    """SET TRANSACTION ... / SET SESSION CHARACTERISTICS AS TRANSACTION ... (modes as text)."""

    arg_types: dict[str, Any] = {"modes": True, "session": False}


class ResetVariable(exp.Expression):
    """RESET <name> | ALL (`this` is "all" for ALL)"""

    arg_types: dict[str, Any] = {"this": True}


class DiscardStatement(exp.Expression):
    """DISCARD ALL | PLANS | SEQUENCES | TEMP"""

    arg_types: dict[str, Any] = {"this": True}


class CopyStatement(exp.Expression):
    """COPY {(<query>) | <table> [(<column>, ...)]} {TO STDOUT | FROM STDIN} [[WITH] (<option>, ...)]

    `query`/`query_sql` for COPY (query) TO; `table` (schema, name) and `columns` otherwise;
    `direction` "to" | "from"; `options` {name: value text or True}, names lowercased."""

    arg_types: dict[str, Any] = {"query": False, "query_sql": False, "table": False, "columns": False,
                                 "direction": True, "options": True}


# --- roles: parsed by headrace.sql.role_statements, executed by headrace.coordinator.roles -------


class CreateRole(exp.Expression):
    """CREATE ROLE|USER <name> [[WITH] option ...]; options: dict of login / superuser (bool) and
    password (str, or None for PASSWORD NULL). CREATE USER implies LOGIN."""

    arg_types: dict[str, Any] = {"this": True, "options": True}


class AlterRole(exp.Expression):
    """ALTER ROLE|USER <name> [WITH] option ... (options as CreateRole's)."""

    arg_types: dict[str, Any] = {"this": True, "options": True}


class DropRole(exp.Expression):
    """DROP ROLE|USER [IF EXISTS] <name> [, ...] (`names`: a list of str)."""

    arg_types: dict[str, Any] = {"names": True, "if_exists": False}


class GrantPrivileges(exp.Expression):
    """GRANT / REVOKE privileges ON objects TO / FROM grantees (executed by coordinator/grants.py).

    `revoke`: bool; `privileges`: list of upper-case names, or ["ALL"]; `kind`: "table" | "all tables" |
    "schema" | "database" | "secret" | "connection"; `objects`: list of (schema or None, name) (for "all tables",
    "schema" and "database": (None, name)); `grantees`: role names, "" for PUBLIC; `grant_option`: WITH GRANT
    OPTION / GRANT OPTION FOR was written (refused: headrace has no grant options)."""

    arg_types: dict[str, Any] = {"revoke": True, "privileges": True, "kind": True, "objects": True,
                                 "grantees": True, "grant_option": False}


# --- materialized views: CREATE/DROP are sqlglot's exp.Create/exp.Drop; executed by coordinator/views.py ---


class ShowCreateObject(exp.Expression):
    """SHOW CREATE MATERIALIZED VIEW <name> (`kind` "materialized view", `this` exp.Table)."""

    arg_types: dict[str, Any] = {"kind": True, "this": True}


# --- SUBSCRIBE and savepoints: executed by coordinator/subscribe.py and coordinator/session_sql.py ---


class SubscribeStatement(exp.Expression):
    """SUBSCRIBE [TO] <object | (SELECT ...)> [WITH (SNAPSHOT [= bool], PROGRESS [= bool])] [AS OF <ts>]
    [UP TO <ts>]. `this`: (schema or "", name) of the object, or None with `query` (the SELECT's AST)
    and `query_sql`; `snapshot` / `progress`: bool; `as_of` / `up_to`: int ms or None."""

    arg_types: dict[str, Any] = {"this": False, "query": False, "query_sql": False, "snapshot": False,
                                 "progress": False, "as_of": False, "up_to": False}


class SavepointStatement(exp.Expression):
    """SAVEPOINT name / RELEASE [SAVEPOINT] name / ROLLBACK TO [SAVEPOINT] name (`action`: "savepoint",
    "release" or "rollback_to"; `this`: the name)."""

    arg_types: dict[str, Any] = {"this": True, "action": True}


class CreateConnection(exp.Expression):
    """CREATE CONNECTION [IF NOT EXISTS] <name> TO POSTGRES | REDIS (<option> [=] <value>, ...)
    (`options`: list of SinkOption)."""

    arg_types: dict[str, Any] = {"this": True, "driver": True, "options": True, "if_not_exists": False}


class CreateSink(exp.Expression):
    """CREATE SINK [IF NOT EXISTS] <name> FROM <relation> INTO <driver> [(<option> [=] <value>, ...)]
    [WITH (<option> [=] <value>, ...)] (`options` / `with_options`: lists of SinkOption)."""

    arg_types: dict[str, Any] = {"this": True, "relation": True, "driver": True, "options": True,
                                 "with_options": False, "if_not_exists": False}


class SinkOption(exp.Expression):
    """One `<NAME WORDS> [=] <value>` of CREATE CONNECTION / SINK. `name`: the words upper-cased and joined
    by one space; `kind`: "string" | "number" | "bool" | "secret" | "name" | "list" (a parenthesized list of
    SinkOption, e.g. HEADERS ('Authorization' = SECRET token)); `value`: the Python value (a secret's or an
    object's name for "secret" / "name")."""

    arg_types: dict[str, Any] = {"name": True, "kind": True, "value": False}
