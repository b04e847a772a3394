"""The coordinator: plans and executes statements for sessions (seed 004).

It owns the catalog and decides what each statement does: SELECTs run against the serving store,
DDL changes the catalog and the resources behind each item (log, store table, pipeline query)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlglot import exp

from headrace.catalog.catalog import Catalog
from headrace.catalog.items import WebhookSource
from headrace.coordinator.responses import (
    Column,
    CommandComplete,
    EmptyQuery,
    ExecuteResponse,
    SendingRows,
    StatementDescription,
)
from headrace.coordinator.session import (
    Portal,
    PreparedStatement,
    Session,
    TransactionStatus,
)
from headrace.coordinator.sources import SourceResources
from headrace.errors import (
    DuplicateObject,
    FeatureNotSupported,
    HeadraceError,
    QueryCanceled,
    UndefinedObject,
)
from headrace.sql.ast import CreateWebhookSource, DropObject, ShowObjects, ShowVariable
from headrace.sql.ddl import qualified_name, webhook_source_from_statement
from headrace.sql.expr import compile_expression
from headrace.sql.parser import parse_statement
from headrace.sql.select import is_query, plan_select
from headrace.sql.types import TEXT_OID
from headrace.store.query import describe_query, run_query

log = logging.getLogger(__name__)

TEXT = TEXT_OID
AbortedTransaction = "25P02"


class Coordinator:
    def __init__(self, catalog: Catalog, resources: SourceResources, executor: ThreadPoolExecutor,
                 on_sources_changed: Callable[[list[WebhookSource]], None]) -> None:
        self.catalog = catalog
        self.resources = resources
        self.executor = executor
        self._on_sources_changed = on_sources_changed
        self._ddl_lock = asyncio.Lock()

    # ---- prepare ------------------------------------------------------------------------------
    async def prepare(self, session: Session, name: str, sql: str, param_types: Sequence[int]) -> PreparedStatement:
        if not sql.strip().strip(";").strip():
            return PreparedStatement(sql=sql, ast=None, description=StatementDescription((), None))
        ast = parse_statement(sql)
        if is_query(ast):
            plan = plan_select(ast, self._relation_exists, param_types)
            columns = await self._run(describe_query, self.resources.store, plan)
            return PreparedStatement(sql, ast, StatementDescription(plan.param_types, columns), plan)
        return PreparedStatement(sql, ast, StatementDescription(tuple(param_types), self._static_columns(ast)))

    def _static_columns(self, ast: exp.Expr) -> tuple[Column, ...] | None:
        if isinstance(ast, ShowVariable):
            name = ast.this
            if name == "all":
                return (Column("name", TEXT), Column("setting", TEXT), Column("description", TEXT))
            return (Column(name.split()[-1] if name.startswith("transaction") else name, TEXT),)
        if isinstance(ast, ShowObjects):
            return (Column("name", TEXT), Column("type", TEXT))
        return None

    # ---- execute ------------------------------------------------------------------------------
    async def execute(self, session: Session, portal: Portal, max_rows: int, cancel: asyncio.Event) -> ExecuteResponse:
        if portal.pending_rows is not None:
            return _next_rows(portal, max_rows)
        statement = portal.statement
        ast = statement.ast
        if ast is None:
            return EmptyQuery()
        if session.transaction is TransactionStatus.FAILED and not isinstance(ast, (exp.Commit, exp.Rollback)):
            raise HeadraceError("current transaction is aborted, commands ignored until end of transaction block",
                                sqlstate=AbortedTransaction)
        if statement.plan is not None:
            columns, rows = await self._run_cancellable(cancel, statement.plan, portal.params)
            portal.columns = columns
            portal.pending_rows = rows
            return _next_rows(portal, max_rows)
        response = await self._execute_command(session, ast, statement.sql)
        if isinstance(response, SendingRows):
            portal.columns, portal.pending_rows = response.columns, list(response.rows)
            return _next_rows(portal, max_rows, tag_verb=response.tag_verb)
        portal.finished = True
        return response

    async def _execute_command(self, session: Session, ast: exp.Expr, sql: str) -> ExecuteResponse:
        if isinstance(ast, exp.Transaction):
            notices = ("there is already a transaction in progress",) if session.transaction is not TransactionStatus.IDLE else ()
            session.transaction = TransactionStatus.IN_BLOCK
            return CommandComplete("BEGIN", notices)
        if isinstance(ast, exp.Commit):
            failed = session.transaction is TransactionStatus.FAILED
            notices = ("there is no transaction in progress",) if session.transaction is TransactionStatus.IDLE else ()
            session.transaction = TransactionStatus.IDLE
            return CommandComplete("ROLLBACK" if failed else "COMMIT", notices)
        if isinstance(ast, exp.Rollback):
            notices = ("there is no transaction in progress",) if session.transaction is TransactionStatus.IDLE else ()
            session.transaction = TransactionStatus.IDLE
            return CommandComplete("ROLLBACK", notices)
        if isinstance(ast, exp.Set):
            return self._set_variables(session, ast)
        if isinstance(ast, ShowVariable):
            return self._show_variable(session, ast.this)
        if isinstance(ast, ShowObjects):
            rows = [(source.name, "webhook") for source in self.catalog.sources()
                    if ast.args.get("schema") in (None, source.schema)]
            return SendingRows(self._static_columns(ast) or (), rows, tag_verb="SHOW")
        if isinstance(ast, CreateWebhookSource):
            return await self._create_source(ast, sql)
        if isinstance(ast, DropObject):
            return await self._drop_sources(ast)
        raise FeatureNotSupported(f"{ast.key.upper()} is not supported yet")

    # ---- session variables --------------------------------------------------------------------
    def _set_variables(self, session: Session, ast: exp.Set) -> CommandComplete:
        for item in ast.expressions:
            assignment = item.this
            if isinstance(assignment, exp.EQ):
                name = assignment.this.sql(dialect="postgres").lower()
                value = assignment.expression
                text = value.name if isinstance(value, (exp.Literal, exp.Column, exp.Identifier, exp.Var)) else value.sql()
                if name == "time zone" or name == "timezone":
                    name = "timezone"
                session.variables[name] = "UTC" if name == "timezone" and text.lower() in ("utc", "'utc'") else text
            else:
                raise FeatureNotSupported(f"SET {item.sql(dialect='postgres')} is not supported")
        return CommandComplete("SET")

    def _show_variable(self, session: Session, name: str) -> SendingRows:
        if name == "all":
            rows = [(key, value, "") for key, value in sorted(session.variables.items())]
            return SendingRows((Column("name", TEXT), Column("setting", TEXT), Column("description", TEXT)), rows, "SHOW")
        key = {"transaction isolation level": "transaction_isolation", "time zone": "timezone"}.get(name, name)
        if key not in session.variables:
            raise HeadraceError(f'unrecognized configuration parameter "{name}"', sqlstate="42704")
        column = Column(name.split()[-1] if name.startswith("transaction") else name, TEXT)
        return SendingRows((column,), [(session.variables[key],)], "SHOW")

    # ---- DDL ----------------------------------------------------------------------------------
    async def _create_source(self, ast: CreateWebhookSource, sql: str) -> CommandComplete:
        async with self._ddl_lock:
            database, schema, name = qualified_name(ast.this)
            if self.catalog.find(schema, name) is not None:
                if ast.args.get("if_not_exists"):
                    return CommandComplete("CREATE SOURCE", (f'source "{name}" already exists, skipping',))
                raise DuplicateObject(f'source "{name}" already exists')
            source = webhook_source_from_statement("pending", ast, sql.strip())
            if source.idempotent_expr is not None:
                compile_expression(source.idempotent_expr, ("body", "headers"))  # reject bad expressions now
            source = webhook_source_from_statement(self.catalog.allocate_id(), ast, source.create_sql)
            # Durable first: after a crash, start-up re-creates whatever resources are missing.
            self.catalog.add(source)
            await self.resources.ensure(source)
            self._sources_changed()
            return CommandComplete("CREATE SOURCE")

    async def _drop_sources(self, ast: DropObject) -> CommandComplete:
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
            for source in targets:
                self.catalog.remove(source.id)
                await self.resources.remove(source)
            if targets:
                self._sources_changed()
            return CommandComplete("DROP SOURCE", tuple(notices))

    def _sources_changed(self) -> None:
        self._on_sources_changed(self.catalog.sources())

    # ---- helpers ------------------------------------------------------------------------------
    def _relation_exists(self, schema: str, name: str) -> bool:
        return self.catalog.find(schema, name) is not None

    async def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def _run_cancellable(self, cancel: asyncio.Event, plan: Any, params: Sequence[Any]) -> tuple[Any, Any]:
        cursor = self.resources.store.cursor()
        query = asyncio.ensure_future(self._run(run_query, cursor, plan, params))
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            done, _ = await asyncio.wait({query, cancelled}, return_when=asyncio.FIRST_COMPLETED)
            if query in done:
                return query.result()
            cursor.interrupt()
            try:
                await query
            except Exception:  # noqa: BLE001 - the interrupt's own error is replaced by 57014
                pass
            raise QueryCanceled("canceling statement due to user request")
        finally:
            cancelled.cancel()
            cursor.close()


def _next_rows(portal: Portal, max_rows: int, tag_verb: str = "SELECT") -> SendingRows:
    assert portal.pending_rows is not None and portal.columns is not None
    if max_rows > 0 and len(portal.pending_rows) > max_rows:
        batch, portal.pending_rows = portal.pending_rows[:max_rows], portal.pending_rows[max_rows:]
        portal.rows_sent += len(batch)
        return SendingRows(portal.columns, batch, tag_verb, suspended=True)
    batch, portal.pending_rows = portal.pending_rows, []
    portal.rows_sent += len(batch)
    portal.finished = True
    return SendingRows(portal.columns, batch, tag_verb)
