"""DDL of webhook sources and secrets: CREATE / ALTER / DROP SOURCE, CREATE / ALTER / DROP SECRET,
SHOW SECRETS. The coordinator dispatches these statements here.

Order of effects, so that a crash at any point leaves something start-up can repair:
- CREATE SOURCE: catalog first (durable), then the resources (table, log, endpoint);
- DROP SOURCE: catalog first, then the resources; the endpoint is gone before the statement ends;
- CREATE SECRET: value file first, then the catalog name (an unnamed value is forgotten at start);
- DROP SECRET: catalog name first, then the value.
Secret values never appear in a message, a notice, SHOW output or the catalog file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sqlglot import exp

from headrace.catalog.catalog import Catalog
from headrace.catalog.items import DEFAULT_SCHEMA, Secret, WebhookSource
from headrace.coordinator.responses import Column, CommandComplete, ExecuteResponse, SendingRows
from headrace.coordinator.sources import SourceResources
from headrace.coordinator.views import ViewDdl
from headrace.errors import (
    DuplicateObject,
    FeatureNotSupported,
    HeadraceError,
    InvalidParameterValue,
    UndefinedObject,
)
from headrace.sql.ast import AlterSourceWindow, CreateSecret, CreateWebhookSource, DropObject, ShowObjects
from headrace.sql.ddl import parse_window, qualified_name, validate_expressions, webhook_source_from_statement, with_window
from headrace.sql.expr import SqlType, compile_expression
from headrace.sql.types import TEXT_OID

SOURCE_STATEMENTS = (CreateWebhookSource, AlterSourceWindow, CreateSecret)
DependentObjectsStillExist = "2BP01"


def handles(ast: exp.Expr) -> bool:
    """Whether this module executes `ast` (DROP SOURCE / SECRET included, SHOW SECRETS)."""
    if isinstance(ast, SOURCE_STATEMENTS):
        return True
    if isinstance(ast, DropObject):
        return ast.args.get("kind") in ("source", "secret")
    return isinstance(ast, ShowObjects) and ast.args.get("kind") == "secret"


class SourceDdl:
    def __init__(self, catalog: Catalog, resources: SourceResources, ddl_lock: asyncio.Lock,
                 on_sources_changed: Callable[[list[WebhookSource]], None]) -> None:
        self.catalog = catalog
        self.resources = resources
        self._ddl_lock = ddl_lock
        self._on_sources_changed = on_sources_changed
        # Materialized views reading sources (coordinator/views.py; set by the coordinator): a name clash at
        # CREATE SOURCE, and DROP SOURCE refused (2BP01) while views read it, unless CASCADE drops them.
        self.views: ViewDdl | None = None
        self.sinks: Any = None  # coordinator/sinks.py: DROP SECRET refused while a sink or connection uses it

    async def execute(self, ast: exp.Expr) -> ExecuteResponse:
        if isinstance(ast, CreateWebhookSource):
            return await self.create_source(ast)
        if isinstance(ast, AlterSourceWindow):
            return await self.alter_source_window(ast)
        if isinstance(ast, CreateSecret):
            return await (self.alter_secret(ast) if ast.args.get("alter") else self.create_secret(ast))
        if isinstance(ast, DropObject) and ast.args.get("kind") == "secret":
            return await self.drop_secrets(ast)
        if isinstance(ast, DropObject):
            return await self.drop_sources(ast)
        if isinstance(ast, ShowObjects):
            return self.show_secrets(ast)
        raise FeatureNotSupported(f"{ast.key.upper()} is not supported yet")

    # ---- sources ----------------------------------------------------------------------------------
    async def create_source(self, ast: CreateWebhookSource) -> CommandComplete:
        async with self._ddl_lock:
            _, schema, name = qualified_name(ast.this)
            holder = self.catalog.kind_of_name(schema, name)
            if holder is not None:
                what = "source" if holder == "source" else "relation"
                if ast.args.get("if_not_exists"):
                    return CommandComplete("CREATE SOURCE", (f'{what} "{name}" already exists, skipping',))
                raise DuplicateObject(f'{what} "{name}" already exists', detail=f'"{name}" is a {holder}')
            source = webhook_source_from_statement("pending", ast)
            for secret_name in source.secret_names():
                if self.catalog.secret_value(secret_name) is None:
                    raise UndefinedObject(f'unknown secret "{secret_name}"', sqlstate="42704")
            validate_expressions(source)  # a bad CHECK or IDEMPOTENT fails here, not per request
            source = webhook_source_from_statement(self.catalog.allocate_id(), ast)
            # Durable first: after a crash, start-up re-creates whatever resources are missing.
            source = self.catalog.add(source)
            await self.resources.ensure(source)
            self._sources_changed()
            return CommandComplete("CREATE SOURCE")

    async def drop_sources(self, ast: DropObject) -> CommandComplete:
        async with self._ddl_lock:
            notices: list[str] = []
            targets: list[WebhookSource] = []
            for table in ast.expressions:
                _, schema, name = qualified_name(table)
                source = self.catalog.find(schema, name)
                if source is None:
                    if ast.args.get("if_exists"):
                        notices.append(f'source "{name}" does not exist, skipping')
                        continue
                    raise UndefinedObject(f'unknown source "{name}"')
                targets.append(source)
            notices.extend(await self._drop(targets, cascade=bool(ast.args.get("cascade"))))
            return CommandComplete("DROP SOURCE", tuple(notices))

    async def _drop(self, sources: list[WebhookSource], cascade: bool = False) -> list[str]:
        notices: list[str] = []
        if self.views is not None:
            for source in sources:  # all refused before anything is dropped
                if not cascade:
                    self.views.refuse_drop_of_input(source.schema, source.name)
            for source in sources:
                notices.extend(await self.views.drop_readers_of(source.schema, source.name))
        for source in sources:
            self.catalog.remove(source.id)
            await self.resources.remove(source)  # the endpoint answers 404 from here on
        if sources:
            self._sources_changed()
        return notices

    async def alter_source_window(self, ast: AlterSourceWindow) -> CommandComplete:
        async with self._ddl_lock:
            _, schema, name = qualified_name(ast.this)
            source = self.catalog.find(schema, name)
            if source is None:
                if ast.args.get("if_exists"):
                    return CommandComplete("ALTER SOURCE", (f'source "{name}" does not exist, skipping',))
                raise UndefinedObject(f'unknown source "{name}"')
            if source.idempotent_expr is None:
                raise FeatureNotSupported(f'source "{name}" has no IDEMPOTENT clause, so no WINDOW to set')
            altered = self.catalog.add(with_window(source, parse_window(ast.args["window"])))
            self.resources.update(altered)
            self._sources_changed()
            return CommandComplete("ALTER SOURCE")

    def _sources_changed(self) -> None:
        self._on_sources_changed(self.catalog.sources())

    # ---- secrets ----------------------------------------------------------------------------------
    async def create_secret(self, ast: CreateSecret) -> CommandComplete:
        async with self._ddl_lock:
            schema, name = _secret_name(ast.this)
            if self.catalog.find_secret(schema, name) is not None:
                if ast.args.get("if_not_exists"):
                    return CommandComplete("CREATE SECRET", (f'secret "{name}" already exists, skipping',))
                raise DuplicateObject(f'secret "{name}" already exists', sqlstate="42710")
            value = secret_value(ast.args["value"])
            self.catalog.add_secret(Secret(id=self.catalog.allocate_id(), name=name, schema=schema), value)
            return CommandComplete("CREATE SECRET")

    async def alter_secret(self, ast: CreateSecret) -> CommandComplete:
        async with self._ddl_lock:
            schema, name = _secret_name(ast.this)
            secret = self.catalog.find_secret(schema, name)
            if secret is None:
                if ast.args.get("if_exists"):
                    return CommandComplete("ALTER SECRET", (f'secret "{name}" does not exist, skipping',))
                raise UndefinedObject(f'unknown secret "{name}"', sqlstate="42704")
            # Sources read secrets by name at each request: the next request sees the new value.
            self.catalog.set_secret_value(secret, secret_value(ast.args["value"]))
            return CommandComplete("ALTER SECRET")

    async def drop_secrets(self, ast: DropObject) -> CommandComplete:
        async with self._ddl_lock:
            notices: list[str] = []
            secrets: list[Secret] = []
            for table in ast.expressions:
                schema, name = _secret_name(table)
                secret = self.catalog.find_secret(schema, name)
                if secret is None:
                    if ast.args.get("if_exists"):
                        notices.append(f'secret "{name}" does not exist, skipping')
                        continue
                    raise UndefinedObject(f'unknown secret "{name}"', sqlstate="42704")
                secrets.append(secret)
            dependents: list[WebhookSource] = []
            for secret in secrets:
                sink_users = self.sinks.secret_users(secret.name) if self.sinks is not None else []
                if sink_users:
                    raise HeadraceError(f'cannot drop secret "{secret.name}": {sink_users[0]} depends on it',
                                        hint="drop the sinks and connections using it first",
                                        sqlstate=DependentObjectsStillExist, http_status=400)
                users = self.catalog.sources_using_secret(secret)
                if users and not ast.args.get("cascade"):
                    raise HeadraceError(f'cannot drop secret "{secret.name}": source "{users[0].name}" depends on it',
                                        hint="DROP SECRET ... CASCADE drops the sources too",
                                        sqlstate=DependentObjectsStillExist, http_status=400)
                dependents.extend(user for user in users if user not in dependents)
            for source in dependents:
                notices.append(f'drop cascades to source "{source.name}"')
            notices.extend(await self._drop(dependents, cascade=True))
            for secret in secrets:
                self.catalog.remove_secret(secret.id)
            return CommandComplete("DROP SECRET", tuple(notices))

    def show_secrets(self, ast: ShowObjects) -> SendingRows:
        schema = ast.args.get("schema")
        rows = [(secret.name,) for secret in self.catalog.secrets() if schema in (None, secret.schema)]
        return SendingRows((Column("name", TEXT_OID),), rows, tag_verb="SHOW")


def _secret_name(table: exp.Table) -> tuple[str, str]:
    database, schema, name = qualified_name(table)
    if schema != DEFAULT_SCHEMA:
        raise FeatureNotSupported(f"secrets live in schema {DEFAULT_SCHEMA} for now, not {schema}")
    return schema, name


def secret_value(value_sql: str) -> bytes:
    """Evaluate a secret's value: a constant text (stored as its UTF-8 bytes) or bytea expression,
    e.g. 'whsec_...', decode('c2VjcmV0', 'base64'). Errors never quote the value."""
    try:
        expression = compile_expression(value_sql, {})
        value = expression({})
    except HeadraceError as error:
        raise InvalidParameterValue("invalid secret value: it must be a constant text or bytea expression",
                                    detail=f"SQLSTATE {error.sqlstate}") from None
    if value is None:
        raise InvalidParameterValue("a secret's value cannot be NULL")
    if expression.result_type is SqlType.BYTEA:
        return bytes(value)
    if expression.result_type is SqlType.TEXT:
        return str(value).encode("utf-8")
    raise InvalidParameterValue(f"a secret's value must be text or bytea, not {expression.result_type.value}")
