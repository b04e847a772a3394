"""DDL of connections and sinks: CREATE / DROP CONNECTION, CREATE / DROP SINK, SHOW CONNECTIONS / SINKS.

CREATE SINK checks everything it can before it records the sink: the relation, the connection, the secrets, the
column types, and then the driver itself (Validate and Apply over the protocol: the PostgreSQL table is created,
an unreachable endpoint is an error now rather than a background retry). Then the catalog (durable), then the
runner. DROP SINK: the catalog first, then the runner and its state; the target keeps what was written.
A relation with sinks cannot be dropped without CASCADE (which drops the sinks); nor can a connection or secret a
sink uses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sqlglot import exp

from headrace.catalog.catalog import Catalog
from headrace.catalog.sinks import Connection, SecretRef, Sink
from headrace.coordinator.responses import Column, CommandComplete, ExecuteResponse, SendingRows
from headrace.errors import DuplicateObject, FeatureNotSupported, HeadraceError, UndefinedObject
from headrace.sink.manager import SinkManager
from headrace.sink.runner import SinkRunner
from headrace.sql.ast import CreateConnection, CreateSink, DropObject, ShowObjects
from headrace.sql.ddl import qualified_name
from headrace.sql.sink_statements import connection_from_statement, sink_from_statement
from headrace.sql.types import TEXT_OID

DependentObjectsStillExist = "2BP01"
SHOW_SINKS_COLUMNS = (Column("name", TEXT_OID), Column("type", TEXT_OID), Column("relation", TEXT_OID),
                      Column("state", TEXT_OID), Column("guarantee", TEXT_OID))
SHOW_CONNECTIONS_COLUMNS = (Column("name", TEXT_OID), Column("type", TEXT_OID))
AT_LEAST_ONCE_NOTICE = (
    "REDIS sinks are at least once: after a crash, the transactions since the last recovery-log commit are "
    "written again. Keys end equal to the view (each write is the full row, so a sum or count is never added "
    "twice), but meanwhile readers may see a transaction half applied, and appended stream entries (DELTA "
    "UPDATES) may appear twice: a consumer adding them up could count a change twice.")


def handles(ast: exp.Expr) -> bool:
    if isinstance(ast, (CreateConnection, CreateSink)):
        return True
    return isinstance(ast, (DropObject, ShowObjects)) and ast.args.get("kind") in ("sink", "connection")


def show_columns(ast: exp.Expr) -> tuple[Column, ...] | None:
    if isinstance(ast, ShowObjects) and ast.args.get("kind") == "sink":
        return SHOW_SINKS_COLUMNS
    if isinstance(ast, ShowObjects) and ast.args.get("kind") == "connection":
        return SHOW_CONNECTIONS_COLUMNS
    return None


class SinkDdl:
    def __init__(self, catalog: Catalog, manager: SinkManager, ddl_lock: asyncio.Lock,
                 relation_exists: Callable[[str, str], bool]) -> None:
        self.catalog = catalog
        self.manager = manager
        self._ddl_lock = ddl_lock
        self._relation_exists = relation_exists

    async def execute(self, ast: exp.Expr, sql: str) -> ExecuteResponse:
        if isinstance(ast, CreateConnection):
            return await self.create_connection(ast, sql)
        if isinstance(ast, CreateSink):
            return await self.create_sink(ast, sql)
        if isinstance(ast, DropObject) and ast.args["kind"] == "sink":
            return await self.drop_sinks(ast)
        if isinstance(ast, DropObject):
            return await self.drop_connections(ast)
        assert isinstance(ast, ShowObjects)
        schema = ast.args.get("schema")
        if ast.args["kind"] == "sink":
            rows = [(name, driver, relation, state, guarantee) for name, sink_schema, relation, driver, guarantee,
                    state, *_ in self.manager.status_rows() if schema in (None, sink_schema)]
            return SendingRows(SHOW_SINKS_COLUMNS, rows, tag_verb="SHOW")
        rows = [(c.name, c.driver) for c in self.catalog.connections() if schema in (None, c.schema)]
        return SendingRows(SHOW_CONNECTIONS_COLUMNS, rows, tag_verb="SHOW")

    # ---- connections ------------------------------------------------------------------------------
    async def create_connection(self, ast: CreateConnection, sql: str) -> CommandComplete:
        async with self._ddl_lock:
            _, schema, name = qualified_name(ast.this)
            if self.catalog.find_connection(schema, name) is not None:
                if ast.args.get("if_not_exists"):
                    return CommandComplete("CREATE CONNECTION", (f'connection "{name}" already exists, skipping',))
                raise DuplicateObject(f'connection "{name}" already exists', sqlstate="42710")
            connection = connection_from_statement(self.catalog.allocate_id(), ast, sql)
            if isinstance(connection.url, SecretRef):
                self._check_secret(connection.url.name)
            self.catalog.add_connection(connection)
            return CommandComplete("CREATE CONNECTION")

    async def drop_connections(self, ast: DropObject) -> CommandComplete:
        async with self._ddl_lock:
            notices: list[str] = []
            targets: list[Connection] = []
            for table in ast.expressions:
                _, schema, name = qualified_name(table)
                connection = self.catalog.find_connection(schema, name)
                if connection is None:
                    if ast.args.get("if_exists"):
                        notices.append(f'connection "{name}" does not exist, skipping')
                        continue
                    raise UndefinedObject(f'connection "{name}" does not exist', sqlstate="42704")
                targets.append(connection)
            users = [sink for sink in self.catalog.sinks() for connection in targets if _uses(sink, connection)]
            if users and not ast.args.get("cascade"):
                raise HeadraceError(f'cannot drop connection "{targets[0].name}" because other objects depend on it',
                                    sqlstate=DependentObjectsStillExist,
                                    detail="\n".join(f'sink "{sink.name}" depends on it' for sink in users),
                                    hint="Use DROP ... CASCADE to drop the dependent objects too.")
            notices.extend(await self._drop(users, cascaded=True))
            for connection in targets:
                self.catalog.remove_connection(connection.id)
            return CommandComplete("DROP CONNECTION", tuple(notices))

    # ---- sinks ------------------------------------------------------------------------------------
    async def create_sink(self, ast: CreateSink, sql: str) -> CommandComplete:
        async with self._ddl_lock:
            _, schema, name = qualified_name(ast.this)
            if self.catalog.find_sink(schema, name) is not None:
                if ast.args.get("if_not_exists"):
                    return CommandComplete("CREATE SINK", (f'sink "{name}" already exists, skipping',))
                raise DuplicateObject(f'sink "{name}" already exists', sqlstate="42710")
            if self._relation_exists(schema, name):
                raise DuplicateObject(f'a relation named "{name}" already exists',
                                      hint="sinks share the namespace of sources, tables and views")
            sink = sink_from_statement(self.catalog.allocate_id(), ast, sql)
            for secret in sink.secret_names():
                self._check_secret(secret)
            notices = self._check_guarantee(sink)
            loop = asyncio.get_running_loop()
            runner = await loop.run_in_executor(None, self._check_with_driver, sink)
            self.catalog.add_sink(sink)
            self.manager.launch(runner)
            return CommandComplete("CREATE SINK", notices)

    def _check_guarantee(self, sink: Sink) -> tuple[str, ...]:
        if sink.driver != "redis":
            return ()
        sink_input = self.manager.sink_input(sink)
        reduced = sink_input.kind == "view" and self.manager.view_aggregates(sink)
        if (reduced or sink.delta_updates) and not sink.at_least_once:
            what = "appends each change to a stream" if sink.delta_updates else \
                f"writes {sink_input.relation}, whose aggregates are not last-write-wins,"
            raise FeatureNotSupported(f"a REDIS sink {what} at least once", detail=AT_LEAST_ONCE_NOTICE,
                                      hint="add WITH (AT LEAST ONCE) to accept this")
        return (AT_LEAST_ONCE_NOTICE,)

    def _check_with_driver(self, sink: Sink) -> SinkRunner:
        """Validate and Apply with the driver (creates the target), so a sink that cannot work is refused."""
        runner = self.manager.prepare(sink)
        try:
            runner.check()
        except BaseException:
            self.manager.stop_sink(sink, remove_state=True)
            raise
        return runner

    async def drop_sinks(self, ast: DropObject) -> CommandComplete:
        async with self._ddl_lock:
            notices: list[str] = []
            targets: list[Sink] = []
            for table in ast.expressions:
                _, schema, name = qualified_name(table)
                sink = self.catalog.find_sink(schema, name)
                if sink is None:
                    if ast.args.get("if_exists"):
                        notices.append(f'sink "{name}" does not exist, skipping')
                        continue
                    raise UndefinedObject(f'sink "{name}" does not exist', sqlstate="42704")
                targets.append(sink)
            await self._drop(targets)
            return CommandComplete("DROP SINK", tuple(notices))

    async def _drop(self, sinks: list[Sink], cascaded: bool = False) -> list[str]:
        loop = asyncio.get_running_loop()
        for sink in sinks:
            self.catalog.remove_sink(sink.id)
            await loop.run_in_executor(None, lambda s=sink: self.manager.stop_sink(s, remove_state=True))
        return [f'drop cascades to sink "{sink.name}"' for sink in sinks] if cascaded else []

    # ---- dependencies (called by DROP of relations, under the DDL lock) ---------------------------------
    def readers_of(self, schema: str, name: str) -> list[Sink]:
        return [sink for sink in self.catalog.sinks()
                if (sink.relation_schema, sink.relation_name) == (schema, name)]

    def refuse_drop_of_input(self, schema: str, name: str, kind: str) -> None:
        readers = self.readers_of(schema, name)
        if readers:
            raise HeadraceError(f'cannot drop {kind} "{name}" because other objects depend on it',
                                sqlstate=DependentObjectsStillExist,
                                detail="\n".join(f'sink "{s.name}" depends on {kind} "{name}"' for s in readers),
                                hint="Use DROP ... CASCADE to drop the dependent objects too.")

    async def drop_readers_of(self, schema: str, name: str) -> list[str]:
        return await self._drop(self.readers_of(schema, name), cascaded=True)

    def secret_users(self, secret_name: str) -> list[str]:
        """What uses secret `secret_name`: 'sink "x"' / 'connection "y"' (DROP SECRET refuses while any does)."""
        users = [f'connection "{c.name}"' for c in self.catalog.connections()
                 if isinstance(c.url, SecretRef) and c.url.name.rpartition(".")[2] == secret_name]
        users += [f'sink "{s.name}"' for s in self.catalog.sinks()
                  if any(n.rpartition(".")[2] == secret_name for n in s.secret_names())]
        return users

    def _check_secret(self, name: str) -> None:
        if self.catalog.secret_value(name) is None:
            raise UndefinedObject(f'unknown secret "{name}"', sqlstate="42704")


def _uses(sink: Sink, connection: Connection) -> bool:
    name: Any = sink.connection
    if not isinstance(name, str):
        return False
    schema, _, bare = name.rpartition(".")
    return (schema or sink.schema, bare) == (connection.schema, connection.name)
