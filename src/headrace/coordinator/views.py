"""CREATE / DROP MATERIALIZED VIEW, SHOW MATERIALIZED VIEWS, SHOW CREATE MATERIALIZED VIEW.

CREATE compiles the statement (sql/views.py refuses what cannot be maintained incrementally), records the
view in the catalog, then makes its serving-store resources: the view's table (the binding the pipeline
materializes into), the public relation over it, and its row of headrace_internal.view_schemas (the
generated schema with its reduce annotations). `ensure` is idempotent, so start-up repairs whatever a crash
left half-made. The dependency graph (view -> the relation it reads) orders start-up and guards DROP."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlglot import exp

from headrace.catalog.catalog import Catalog
from headrace.catalog.items import WebhookSource
from headrace.catalog.views import MaterializedView
from headrace.coordinator.responses import Column, CommandComplete, ExecuteResponse, SendingRows
from headrace.errors import DuplicateObject, HeadraceError, InternalError, UndefinedObject
from headrace.materialize.sources import source_relation
from headrace.sql.ast import ShowCreateObject, ShowObjects
from headrace.sql.ddl import qualified_name
from headrace.sql.parser import parse_statement
from headrace.sql.types import TEXT_OID
from headrace.sql.view_chain import chain_refusal
from headrace.sql.view_serving import (
    INTERNAL_SCHEMA,
    VIEW_SCHEMAS_DDL,
    VIEW_SCHEMAS_TABLE,
    VIEW_SCHEMAS_UPDATE,
    public_relation_sql,
    view_binding,
    view_schema_row,
)
from headrace.sql.views import (
    InputRelation,
    ViewPlan,
    ViewRefused,
    compile_view,
    is_create_materialized_view,
    view_name,
)
from headrace.store import view_errors
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import CHECKPOINTS_TABLE, ServingStore
from headrace.store.view_errors import (
    delete_view_errors_sql,
    erroring_view_ids_sql,
    first_error_sql,
)

log = logging.getLogger(__name__)

KIND = "materialized view"
SHOW_COLUMNS = (Column("name", TEXT_OID), Column("type", TEXT_OID))
SHOW_CREATE_COLUMNS = (Column("name", TEXT_OID), Column("create_sql", TEXT_OID), Column("reduce_schema", TEXT_OID))
DependentObjectsStillExist = "2BP01"


def handles(ast: exp.Expr) -> bool:
    """Whether this module executes `ast`."""
    if is_create_materialized_view(ast) or isinstance(ast, ShowCreateObject):
        return True
    if isinstance(ast, exp.Drop):
        return bool(ast.args.get("materialized")) and str(ast.args.get("kind") or "").upper() == "VIEW"
    return isinstance(ast, ShowObjects) and ast.args.get("kind") == KIND


class ViewDdl:
    def __init__(self, catalog: Catalog, store: ServingStore | PostgresServingStore, executor: ThreadPoolExecutor, ddl_lock: asyncio.Lock,
                 pipeline_checkpoints: Path | None = None,
                 on_views_changed: Callable[[list[MaterializedView]], None] | None = None) -> None:
        self.catalog = catalog
        self.store = store
        self.executor = executor
        self._ddl_lock = ddl_lock
        self._pipeline_checkpoints = pipeline_checkpoints  # <data>/pipeline/checkpoints
        self._on_views_changed = on_views_changed
        self._plans: dict[str, ViewPlan] = {}
        # Sinks reading relations (coordinator/sinks.py): DROP refuses, or drops them with CASCADE.
        self.sinks: Any = None
        store.execute(VIEW_SCHEMAS_DDL)
        view_errors.serve_relation_from(store)  # headrace_internal.view_errors

    # ---- the dependency graph -----------------------------------------------------------------
    def lookup(self, schema: str, name: str) -> InputRelation | None:
        """The relation a view may read: a source or another view (tables come with the tables issue)."""
        source = self.catalog.find(schema, name)
        if isinstance(source, WebhookSource):
            return source_relation(source)
        view = self.catalog.find_view(schema, name)
        if view is not None:
            plan = self.plan(view)
            columns = {o.name: o.pg_type for o in plan.outputs}
            return InputRelation(kind="view", item_id=view.id, name=view.name, columns=columns, key=("hr_key",),
                                 append_only=plan.append_only)
        return None

    def plan(self, view: MaterializedView) -> ViewPlan:
        plan = self._plans.get(view.id)
        if plan is None:
            statement = parse_statement(view.create_sql)
            assert isinstance(statement, exp.Create)
            plan = self._plans[view.id] = compile_view(statement, self.lookup)
        return plan

    def dependents(self, schema: str, name: str) -> list[MaterializedView]:
        """Views reading the relation schema.name (directly)."""
        return [v for v in self.catalog.views() if (v.input_schema, v.input_name) == (schema, name)]

    def in_dependency_order(self) -> list[MaterializedView]:
        """Every view after the views it reads (creation order is one, since a view's input exists first)."""
        return sorted(self.catalog.views(), key=lambda v: int(v.id[1:]))

    def is_system_relation(self, schema: str, name: str) -> bool:
        return f"{schema}.{name}" == VIEW_SCHEMAS_TABLE

    # ---- statements ---------------------------------------------------------------------------
    def columns(self, ast: exp.Expr) -> tuple[Column, ...] | None:
        if isinstance(ast, ShowCreateObject):
            return SHOW_CREATE_COLUMNS
        if isinstance(ast, ShowObjects):
            return SHOW_COLUMNS
        return None

    async def execute(self, ast: exp.Expr, sql: str) -> ExecuteResponse:
        if isinstance(ast, ShowObjects):
            rows = [(v.name, KIND) for v in self.in_dependency_order() if ast.args.get("schema") in (None, v.schema)]
            return SendingRows(SHOW_COLUMNS, rows, tag_verb="SHOW")
        if isinstance(ast, ShowCreateObject):
            _, schema, name = qualified_name(ast.this)
            view = self.catalog.find_view(schema, name)
            if view is None:
                raise UndefinedObject(f'unknown materialized view "{name}"')
            schema_json = json.dumps(self.plan(view).reduce_schema, indent=1)
            return SendingRows(SHOW_CREATE_COLUMNS, [(view.name, view.create_sql, schema_json)], tag_verb="SHOW")
        if isinstance(ast, exp.Drop):
            return await self._drop(ast)
        assert isinstance(ast, exp.Create)
        return await self._create(ast, sql)

    async def _create(self, ast: exp.Create, sql: str) -> CommandComplete:
        async with self._ddl_lock:
            schema, name = view_name(ast)
            holder = self.catalog.kind_of_name(schema, name)
            if holder is not None:
                if ast.args.get("exists"):
                    return CommandComplete("CREATE MATERIALIZED VIEW", (f'relation "{name}" already exists, skipping',))
                raise DuplicateObject(f'relation "{name}" already exists', detail=f'"{name}" is a {holder}')
            plan = compile_view(ast, self.lookup)  # refuses here, before anything is recorded
            if plan.input.kind == "view":
                self._check_chain(name, plan)
            view = MaterializedView(id=self.catalog.allocate_id(), name=name, create_sql=sql.strip().rstrip(";").strip(),
                                    input_schema=_input_schema(ast), input_name=plan.input.name)
            self._plans[view.id] = plan
            self.catalog.add_view(view)  # durable first: start-up re-creates missing resources
            await self._run(self.ensure, view)
            self._views_changed()
            return CommandComplete("CREATE MATERIALIZED VIEW")

    def _check_chain(self, name: str, plan: ViewPlan) -> None:
        """A view over a view is maintained in its root source's transactions, from the upstream's stored rows
        (sql/view_chain.py): the upstream must store its public rows as shown, and the chain must start at a
        webhook source."""
        upstream = next(v for v in self.catalog.views() if v.id == plan.input.item_id)
        reason = chain_refusal(self.plan(upstream))
        if reason is not None:
            raise ViewRefused(f'materialized view "{name}" cannot read materialized view "{upstream.name}": '
                              f"{reason}",
                              hint="define the inner view without it (HAVING and expressions over aggregates can "
                                   "go in the outer view), or define the view over the source directly")
        # a view over a view is not backfilled (docs/views.md): refuse, not miss
        holds_rows = self.store.execute(f'SELECT count(*) > 0 FROM {INTERNAL_SCHEMA}."{upstream.materialization}"')
        if holds_rows and holds_rows[0][0]:
            raise ViewRefused(f'materialized view "{name}" cannot read materialized view "{upstream.name}" '
                              "once it holds rows: a view over a view is not backfilled yet",
                              hint="create the outer view before data arrives, or define it over the source")
        root: MaterializedView | None = upstream
        while root is not None:
            inner = self.lookup(root.input_schema, root.input_name)
            if inner is None or inner.kind == "source":
                return
            if inner.kind != "view":
                raise ViewRefused(f'materialized view "{name}" reads a chain of views over {inner.kind} '
                                  f'"{inner.name}": views over views are maintained over webhook sources only')
            root = next(v for v in self.catalog.views() if v.id == inner.item_id)

    async def _drop(self, ast: exp.Drop) -> CommandComplete:
        async with self._ddl_lock:
            notices: list[str] = []
            targets: list[MaterializedView] = []
            for table in ast.args.get("tables") or ast.expressions:
                _, schema, name = qualified_name(table)
                view = self.catalog.find_view(schema, name)
                if view is None:
                    if ast.args.get("exists"):
                        notices.append(f'materialized view "{name}" does not exist, skipping')
                        continue
                    raise UndefinedObject(f'materialized view "{name}" does not exist')
                targets.append(view)
            cascade = bool(ast.args.get("cascade"))
            ordered: list[MaterializedView] = []
            for view in targets:
                self._collect_dependents(view, cascade, ordered)
            notices.extend(await self._drop_sinks_reading(ordered))
            for view in ordered:
                self.catalog.remove_view(view.id)
                await self._run(self.remove_resources, view)
                self._plans.pop(view.id, None)
            if ordered:
                self._views_changed()
            return CommandComplete("DROP MATERIALIZED VIEW", tuple(notices))

    def _collect_dependents(self, view: MaterializedView, cascade: bool, ordered: list[MaterializedView]) -> None:
        """Dependents first (a view is dropped after every view reading it); without CASCADE, refuse."""
        for dependent in self.dependents(view.schema, view.name):
            if not cascade:
                raise HeadraceError(f'cannot drop materialized view "{view.name}" because other objects depend on it',
                                    sqlstate=DependentObjectsStillExist,
                                    detail=f'materialized view "{dependent.name}" depends on materialized view "{view.name}"',
                                    hint="Use DROP ... CASCADE to drop the dependent objects too.")
            self._collect_dependents(dependent, cascade, ordered)
        if not cascade and self.sinks is not None:
            self.sinks.refuse_drop_of_input(view.schema, view.name, "materialized view")
        if view not in ordered:
            ordered.append(view)

    async def drop_readers_of(self, schema: str, name: str) -> list[str]:
        """For DROP SOURCE ... CASCADE: drop every view reading schema.name (readers of readers first).
        The caller holds the DDL lock. Returns the notices."""
        ordered: list[MaterializedView] = []
        for view in self.dependents(schema, name):
            self._collect_dependents(view, True, ordered)
        notices = await self._drop_sinks_reading(ordered)
        if self.sinks is not None:
            notices += await self.sinks.drop_readers_of(schema, name)
        for view in ordered:
            self.catalog.remove_view(view.id)
            await self._run(self.remove_resources, view)
            self._plans.pop(view.id, None)
        if ordered:
            self._views_changed()
        return notices + [f'drop cascades to materialized view "{view.name}"' for view in ordered]

    async def _drop_sinks_reading(self, views: list[MaterializedView]) -> list[str]:
        notices: list[str] = []
        if self.sinks is not None:
            for view in views:
                notices += await self.sinks.drop_readers_of(view.schema, view.name)
        return notices

    def refuse_drop_of_input(self, schema: str, name: str, kind: str = "source") -> None:
        """For DROP SOURCE (and later DROP TABLE): refuse while views read the relation."""
        dependents = self.dependents(schema, name)
        if self.sinks is not None:
            self.sinks.refuse_drop_of_input(schema, name, kind)
        if dependents:
            raise HeadraceError(f'cannot drop {kind} "{name}" because other objects depend on it',
                                sqlstate=DependentObjectsStillExist,
                                detail="\n".join(f'materialized view "{v.name}" depends on {kind} "{name}"' for v in dependents),
                                hint="DROP the materialized views first.")

    # ---- resources (blocking; run in the executor) --------------------------------------------
    def ensure(self, view: MaterializedView) -> None:
        """Create the view's table, public relation and schema row if missing (idempotent)."""
        plan = self.plan(view)
        self.store.apply(view_binding(plan, view.id))
        self.store.execute(public_relation_sql(plan, view.id, dialect=self.store.dialect),
                           (f"INSERT INTO {VIEW_SCHEMAS_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE "
                            f"SET {VIEW_SCHEMAS_UPDATE}", view_schema_row(plan, view.id)))

    def ensure_all(self) -> None:
        """Start-up: every view's resources, inputs before the views reading them."""
        for view in self.in_dependency_order():
            try:
                self.ensure(view)
            except HeadraceError as exc:  # one broken view must not keep the server from starting
                log.error("materialized view %s: cannot restore its resources: %s", view.name, exc.message)

    def remove_resources(self, view: MaterializedView) -> None:
        self.store.execute(f'DROP VIEW IF EXISTS {view.schema}."{view.name}"',
                           (f"DELETE FROM {VIEW_SCHEMAS_TABLE} WHERE id = ?", [view.id]),
                           (f"DELETE FROM {CHECKPOINTS_TABLE} WHERE materialization = ?", [view.materialization]),
                           (delete_view_errors_sql(), [view.id]))
        self.store.drop((INTERNAL_SCHEMA, view.materialization))
        if self._pipeline_checkpoints is not None:
            shutil.rmtree(self._pipeline_checkpoints / view.materialization, ignore_errors=True)

    # ---- plumbing -----------------------------------------------------------------------------
    def _views_changed(self) -> None:
        if self._on_views_changed is not None:
            self._on_views_changed(self.in_dependency_order())

    async def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)


def _input_schema(ast: exp.Create) -> str:
    from_ = ast.expression.args.get("from_") or ast.expression.args.get("from")
    if from_ is None or not isinstance(from_.this, exp.Table):
        raise InternalError("a compiled view has one input table")
    return from_.this.db or "public"


# ---- errors as data: a read of a view holding an error fails with it (pipeline/view_errors.py) ----------------------

# store -> (store/view_errors.changed_generation when read, ids of the views holding errors then)
_erroring: weakref.WeakKeyDictionary[Any, tuple[int, frozenset[str]]] = weakref.WeakKeyDictionary()
_STRING_LITERAL = re.compile(r"'(?:[^']|'')*'")


def _erroring_view_ids(store: ServingStore | PostgresServingStore) -> frozenset[str]:
    return frozenset(str(row[0]) for row in store.execute(erroring_view_ids_sql()))


def may_hold_errors(store: ServingStore | PostgresServingStore) -> bool:
    """False only when the last look (still current) found no view holding an error: then a read needs no check (the
    pgwire direct lane answers it at once; otherwise it takes the general path, which checks)."""
    key = view_errors.cache_key()
    cached = _erroring.get(store)
    return not (key is not None and cached is not None and cached[0] == key and not cached[1])


async def refuse_view_errors(catalog: Catalog, store: ServingStore | PostgresServingStore,
                             run: Callable[..., Awaitable[Any]], statement_sql: str | None) -> None:
    """Raise the first error of a view the statement names (or of a view it reads, directly or through views) while
    the view holds one, as Materialize answers a read of a view whose dataflow holds an error: its SQLSTATE and
    PostgreSQL's message. No store query unless a commit changed views' errors since the last look."""
    if statement_sql is None:
        return
    key = view_errors.cache_key()
    cached = _erroring.get(store)
    if key is not None and cached is not None and cached[0] == key:
        erroring = cached[1]
    else:
        erroring = await run(_erroring_view_ids, store)
        if key is not None and view_errors.cache_key() == key:  # no commit of errors meanwhile (store/view_errors.py)
            _erroring[store] = (key, erroring)
    if not erroring:
        return
    views = {view.id: view for view in catalog.views()}
    by_name = {(view.schema, view.name): view for view in views.values()}
    lowered: str | None = None
    for view in views.values():
        chain: list[str] = []  # the view and the views it reads
        current: MaterializedView | None = view
        while current is not None and current.id not in chain:
            chain.append(current.id)
            current = by_name.get((current.input_schema, current.input_name))
        failing = [view_id for view_id in chain if view_id in erroring]
        if not failing:
            continue
        if lowered is None:  # a name inside a string literal is no read of the view
            lowered = _STRING_LITERAL.sub("''", statement_sql).lower()
        if not re.search(rf"(?<![\w$]){re.escape(view.name.lower())}(?![\w$])", lowered):
            continue
        rows = await run(lambda: store.execute((first_error_sql(len(failing)), failing)))
        if not rows:
            continue
        view_id, row_key, sqlstate, message = rows[0]
        culprit = views.get(str(view_id), view)
        raise HeadraceError(str(message), sqlstate=str(sqlstate),
                            detail=f'materialized view "{culprit.name}" cannot compute input row {row_key}',
                            hint="SELECT * FROM headrace_internal.view_errors lists the failing rows; the view "
                                 "answers again once they are deleted or updated to values it can compute")
