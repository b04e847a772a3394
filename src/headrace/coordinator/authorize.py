"""The privilege check of each DDL statement, before the coordinator runs it (coordinator/privileges.py has the
rules). Existence is left to the statement itself: a name that is not found passes here and the statement gives
its own error (42P01, 42704), as it would for a superuser.

Sinks that touch the host (EXTERNAL, PARQUET) need a superuser and the server's allow-lists
(catalog/host_access.py): both are checked here, so CREATE SINK fails with 42501 before anything is recorded; the
drivers check the allow-lists again before they touch the host."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from headrace.catalog.host_access import HostAccess
from headrace.catalog.indexes import IndexDefinition
from headrace.catalog.sinks import SecretRef
from headrace.coordinator.privileges import InsufficientPrivilege, Privileges, referenced_tables
from headrace.sql.ast import AlterSourceWindow, CreateConnection, CreateSecret, CreateSink, CreateWebhookSource, \
    DropObject
from headrace.sql.ddl import qualified_name
from headrace.sql.sink_statements import connection_from_statement, sink_from_statement
from headrace.sql.table_statements import is_create_table, is_drop_table
from headrace.sql.views import is_create_materialized_view

IndexLookup = Callable[[str, str], IndexDefinition | None]  # (schema, name) -> CREATE INDEX definition
HOST_SINKS = ("external", "parquet")
_DROP_KINDS = {"source": "source", "secret": "secret", "sink": "sink", "connection": "connection"}


def authorize_command(privileges: Privileges, user: str, ast: exp.Expr, sql: str, find_index: IndexLookup,
                      host_access: HostAccess) -> None:
    """42501 unless `user` may run this DDL statement (other statements pass: checked where they run)."""
    if privileges.is_superuser(user):
        if isinstance(ast, CreateSink):
            _check_host_sink(ast, sql, host_access)
        return
    if isinstance(ast, CreateWebhookSource):
        privileges.require_create(user)
        for option in ast.args.get("check_options") or ():
            if option[3] is not None:
                privileges.require_usage(user, "secret", option[3])
    elif isinstance(ast, CreateSecret):
        if ast.args.get("alter"):
            _, schema, name = qualified_name(ast.this)
            privileges.require_owner_of(user, "secret", schema, name)
        else:
            privileges.require_create(user)
    elif isinstance(ast, AlterSourceWindow):
        _, schema, name = qualified_name(ast.this)
        privileges.require_owner_of(user, "source", schema, name)
    elif isinstance(ast, DropObject) and ast.args.get("kind") in _DROP_KINDS:
        for table in ast.expressions:
            _, schema, name = qualified_name(table)
            privileges.require_owner_of(user, _DROP_KINDS[ast.args["kind"]], schema, name)
    elif isinstance(ast, CreateConnection):
        privileges.require_create(user)
        connection = connection_from_statement("u0", ast, sql)
        if isinstance(connection.url, SecretRef):
            privileges.require_usage(user, "secret", connection.url.name)
    elif isinstance(ast, CreateSink):
        sink = sink_from_statement("u0", ast, sql)
        if sink.driver in HOST_SINKS:
            privileges.require_superuser(
                user, f"permission denied to create {sink.driver.upper()} sinks",
                hint="Only superusers may create sinks that run processes or write files on the server's host.")
        privileges.require_create(user)
        privileges.require_relations(user, [(sink.relation_schema, sink.relation_name)])
        if sink.connection is not None:
            privileges.require_usage(user, "connection", sink.connection)
        for secret in sink.secret_names():
            privileges.require_usage(user, "secret", secret)
    elif is_create_table(ast):
        privileges.require_create(user)
    elif is_create_materialized_view(ast):
        privileges.require_create(user)
        query = ast.expression
        if query is not None:
            privileges.require_relations(user, [(t.db or None, t.name) for t in referenced_tables(query)])
    elif isinstance(ast, exp.Create) and str(ast.args.get("kind") or "").upper() == "INDEX":
        table = ast.this.args.get("table") if isinstance(ast.this, exp.Index) else None
        if isinstance(table, exp.Table):  # PostgreSQL: only the relation's owner indexes it
            _require_relation_owner(privileges, user, table.db or None, table.name)
    elif isinstance(ast, exp.Drop):
        kind = str(ast.args.get("kind") or "").upper()
        for table in ast.args.get("tables") or ():
            schema = table.db or None
            if kind == "INDEX":
                index = find_index(schema or "public", table.name)
                if index is not None:
                    target = privileges.relation(index.on_schema, index.on_name)
                    if target is not None and not privileges.is_superuser(user) \
                            and privileges.catalog.owner_of(target.item_id) != user:
                        raise _not_owner("index", index.name)
            elif is_drop_table(ast):
                privileges.require_owner_of(user, "table", schema, table.name)
            elif kind == "VIEW" and ast.args.get("materialized"):
                privileges.require_owner_of(user, "materialized view", schema, table.name)


def _require_relation_owner(privileges: Privileges, user: str, schema: str | None, name: str) -> None:
    target = privileges.relation(schema, name)
    if target is not None:
        privileges.require_owner(user, target)


def _not_owner(kind: str, name: str) -> Exception:
    return InsufficientPrivilege(f"must be owner of {kind} {name}")


def _check_host_sink(ast: CreateSink, sql: str, host_access: HostAccess) -> None:
    """The allow-lists, at CREATE: a clear 42501 now rather than a sink failing in the background."""
    sink = sink_from_statement("u0", ast, sql)
    command = sink.options.get("command")
    if sink.driver == "external" and isinstance(command, str):
        host_access.check_command(command)
    path = sink.options.get("path")
    if sink.driver == "parquet" and isinstance(path, str):
        host_access.confine_directory(path)
