"""The coordinator: plans and executes statements for sessions (seed 004).

It owns the catalog and decides what each statement does: SELECTs run against the serving store,
DDL changes the catalog and the resources behind each item (log, store table, pipeline query)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlglot import exp

from headrace.catalog.catalog import CREATING_ROLE, Catalog
from headrace.catalog.host_access import HostAccess
from headrace.catalog.roles import RoleCatalog
from headrace.catalog.system import SystemCatalog
from headrace.catalog.items import WebhookSource
from headrace.catalog.views import MaterializedView
from headrace.coordinator.row_streams import (STREAM_CHUNK_ROWS, StoreRowStream, continue_stream, interruptible,
                                              next_rows)
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
from headrace.coordinator.plan_cache import CursorPool, PlanCache, reusable_cursor, runs_inline
from headrace.coordinator.authorize import authorize_command
from headrace.coordinator.grants import execute_grant, role_dependents
from headrace.coordinator.privileges import Privileges, referenced_tables
from headrace.coordinator.roles import ROLE_STATEMENTS, execute_role_statement
from headrace.coordinator.session_sql import SESSION_STATEMENTS, SessionStatements
from headrace.coordinator.passthrough import (
    Passthrough,
    calls_session_function,
    is_temporary_table,
    mentions_headrace,
    reads_catalog,
    reads_headrace_only,
    store_setting,
    takes_unparsed,
)
from headrace.coordinator.store_grants import StoreGrants
from headrace.store.quarantine import COLUMNS as QUARANTINE_COLUMNS
from headrace.store.quarantine import postgres_quarantine_rows
from headrace.coordinator.temp_relations import refuse_mixed_with_temporary
from headrace.coordinator.subscribe import Subscriptions
from headrace.coordinator.fast_path import FastPath, FastStatement
from headrace.coordinator import indexes as index_ddl
from headrace.coordinator.ddl_sources import SourceDdl, handles as is_source_ddl
from headrace.coordinator.sources import SourceResources
from headrace.coordinator import views as view_ddl
from headrace.coordinator import table_blocks
from headrace.coordinator import tables as table_ddl
from headrace.coordinator import sinks as sink_ddl
from headrace.sink.manager import STATUS_COLUMNS, SinkManager
from headrace.pipeline.table_views import table_relation
from headrace.errors import (
    DuplicateObject,
    FeatureNotSupported,
    HeadraceError,
    QueryCanceled,
    SyntaxError_,
    UndefinedObject,
)
from headrace.sql.ast import CopyStatement, GrantPrivileges, SavepointStatement, ShowObjects, SubscribeStatement
from headrace.sql.limits import off_loop
from headrace.sql.parser import parse_client_statement, parse_statement
from headrace.sql.table_statements import is_create_table, is_drop_table, is_write, table_from_create, write_target
from headrace.sql.select import is_query, plan_select, refuse_store_only_functions
from headrace.sql.types import TEXT_OID
from headrace.store.postgres_server import PostgresStore
from headrace.store.query import describe_query, probe_parameter_types, run_query_chunk, session_parameters
from headrace.store.system_relations_postgres import SystemRelationsMirror
from headrace.store.system_tables import SystemRelation, SystemTables

log = logging.getLogger(__name__)

TEXT = TEXT_OID
AbortedTransaction = "25P02"


class Coordinator:
    def __init__(self, catalog: Catalog, resources: SourceResources, executor: ThreadPoolExecutor,
                 on_sources_changed: Callable[[list[WebhookSource]], None],
                 roles: RoleCatalog | None = None, system_tables: SystemTables | None = None,
                 on_views_changed: Callable[[list[MaterializedView]], None] | None = None,
                 host_access: HostAccess | None = None, postgres: PostgresStore | None = None) -> None:
        self.catalog = catalog
        self.system_tables = system_tables  # headrace_internal.webhook_counters, ... (in-memory relations)
        self.roles = roles if roles is not None else RoleCatalog(None)  # CREATE ROLE; pg_roles reads list_roles()
        # owners, GRANT / REVOKE, and every check (coordinator/privileges.py); what sinks may do on the host
        self.privileges = Privileges(catalog, self.roles)
        self.host_access = host_access if host_access is not None else HostAccess(data_dir=resources.layout.root)
        self.resources = resources
        self.executor = executor
        # The pipeline's control message carries tables beside sources (items with id and create_sql).
        self._on_sources_changed = lambda sources: on_sources_changed([*sources, *catalog.tables()])  # type: ignore[list-item]
        self._ddl_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()  # rollbacks of sessions gone mid-block
        # CREATE/ALTER/DROP SOURCE and SECRET, SHOW SECRETS (coordinator/ddl_sources.py)
        self.source_ddl = SourceDdl(catalog, resources, self._ddl_lock, self._on_sources_changed)
        # CREATE / DROP / SHOW [CREATE] MATERIALIZED VIEW[S] (coordinator/views.py)
        self.views = view_ddl.ViewDdl(catalog, resources.store, executor, self._ddl_lock,
                                      resources.layout.root / "pipeline" / "checkpoints", on_views_changed)
        self.source_ddl.views = self.views  # DROP SOURCE refused / CASCADE while views read it
        # PREPARE / DECLARE / FETCH / COPY / SET / BEGIN ... (coordinator/session_sql.py)
        # CREATE / DROP TABLE, INSERT / UPDATE / DELETE / COPY FROM, read-your-writes (coordinator/tables.py)
        self.tables = table_ddl.Tables(catalog, resources.store, executor, resources.layout.root, self._ddl_lock,
                                       lambda: self._on_sources_changed(catalog.sources()), self._relation_exists)
        self.tables.views = self.views
        view_lookup = self.views.lookup  # materialized views may read tables too (pipeline/table_views.py)
        self.views.lookup = lambda schema, name: (  # type: ignore[method-assign]
            table_relation(table) if (table := catalog.find_table(schema, name)) is not None
            else view_lookup(schema, name))
        self.session_sql = SessionStatements(self, self.tables)
        # pg_catalog / information_schema generated from the catalog and roles (catalog/system)
        self.system_catalog = SystemCatalog(resources.query_store, lambda: [*catalog.sources(), *catalog.tables(), *catalog.views()],
                                            roles=self.roles.list_roles)
        # SELECT fast path: plans by text (valid while the catalog is unchanged), pooled cursors
        self.plan_cache = PlanCache(lambda: catalog.generation)  # every catalog change invalidates cached plans
        self.cursors = CursorPool(resources.query_store)
        # SUBSCRIBE over the serving store's changelogs (coordinator/subscribe.py)
        self.subscriptions = Subscriptions(resources.store, executor, catalog, self.views.plan)
        # CREATE / DROP / SHOW INDEX[ES]: in-memory arrangements answering point lookups (coordinator/fast_path.py)
        self.indexes = index_ddl.IndexDdl(catalog, resources.store, executor, self.subscriptions, resources.layout.root)
        self.fast_path = FastPath(self.indexes)
        self.system_catalog.indexes = self.indexes.catalog.all  # pg_index / pg_indexes list them (psql: \d)
        self.system_catalog.privileges = catalog  # relowner, relacl, has_*_privilege (psql: \dp)
        self.plan_cache.also_keyed_by = self.fast_path.generation
        # CREATE / DROP / SHOW CONNECTION(S) and SINK(S), each sink run by a runner thread (sink/, coordinator/sinks.py)
        self.sink_manager = SinkManager(catalog, resources.store, resources.layout.root, self.views.plan,
                                        self.host_access)
        self.sinks = sink_ddl.SinkDdl(catalog, self.sink_manager, self._ddl_lock, self._relation_exists)
        self.views.sinks = self.sinks
        self.source_ddl.sinks = self.sinks
        if system_tables is not None:
            system_tables.add("sink_status", SystemRelation(STATUS_COLUMNS, self.sink_manager.status_rows))
            if resources.store.dialect == "postgres":  # its driver quarantines into the store PostgreSQL
                store = resources.store
                system_tables.add("quarantined_records", SystemRelation(
                    QUARANTINE_COLUMNS, lambda: postgres_quarantine_rows(store)))
        # PostgreSQL's statements (not headrace's own) run on the store PostgreSQL (coordinator/passthrough.py)
        self.postgres = postgres
        self.passthrough = Passthrough(postgres, self.privileges.is_superuser) if postgres is not None else None
        # Sources', tables' and views' rows in the store PostgreSQL: queries over them run there (docs/store.md)
        self.serving_on_postgres = resources.store.dialect == "postgres"
        # ... where its system relations are tables too, refreshed before a statement reads them
        # (store/system_relations_postgres.py), so they join with everything else
        self.system_mirror = (SystemRelationsMirror(resources.store, system_tables)  # type: ignore[arg-type]
                              if self.serving_on_postgres and system_tables is not None else None)
        if self.system_mirror is not None:
            self.system_mirror.create_all()
        # ... where PostgreSQL enforces headrace's SELECT privileges on them too (coordinator/store_grants.py)
        self.store_grants = (StoreGrants(catalog, self.roles, resources.store,  # type: ignore[arg-type]
                                         lambda role, superuser: postgres.ensure_role(role, superuser=superuser))
                             if self.serving_on_postgres and postgres is not None else None)

    # ---- prepare ------------------------------------------------------------------------------
    async def prepare(self, session: Session, name: str, sql: str, param_types: Sequence[int],
                      ast: exp.Expr | None = None, describe: bool = True) -> PreparedStatement:
        """`ast`: `sql` parsed already (a large statement, parsed off the event loop by coordinator/client.py).
        `describe` False: the columns are not needed before execution (see SessionClient.prepare)."""
        if not sql.strip().strip(";").strip():
            return PreparedStatement(sql=sql, ast=None, description=StatementDescription((), None))
        fingerprint = self.plan_cache.fingerprint()
        shortcuts = self.shortcuts_allowed(session)
        cached = self.prepare_cached(sql, param_types, fingerprint) if shortcuts else None
        if cached is not None:
            return cached
        parsed_off_loop = ast is not None
        known_reads = None if self.passthrough is None or not shortcuts \
            else self.passthrough.routes.store_reads(fingerprint, sql)
        if known_reads is not None:
            # a statement of this shape went to the store before: no parse, no planning (coordinator/passthrough.py);
            # headrace's relations it reads are checked at execute, as the first time
            assert self.passthrough is not None
            statement = await self.passthrough.prepare(session, sql, param_types, None, describe=describe)
            statement.store_reads = known_reads
            return statement
        if ast is None:
            try:
                ast = parse_client_statement(sql)
            except SyntaxError_ as refused:
                if self.passthrough is None or refused.sqlstate != "42601" or not takes_unparsed(sql):
                    raise
                # syntax headrace does not know: PostgreSQL's to run or to refuse with its own error
                self.passthrough.routes.remember(fingerprint, sql)
                return await self.passthrough.prepare(session, sql, param_types, None, describe=describe)
        if self.passthrough is not None and (shadowed := await self._shadowed_by_temporary(session, ast)):
            # names the session's temporary relations on the store, which PostgreSQL finds before headrace's
            statement = await self.passthrough.prepare(session, sql, param_types, ast, describe=describe)
            statement.store_reads = tuple(r for r in self._headrace_relations_read(ast)
                                          if r[0] is not None or r[1].lower() not in shadowed)
            return statement
        if self.passthrough is not None and self._is_postgres_statement(ast):
            # Over headrace's relations (kept in the store PostgreSQL): headrace checks them at execute; the shape is
            # remembered with them, so the next statement of the shape skips the parser but not the checks. A point
            # lookup an index could answer is not: it is described now (PostgreSQL's columns) and answered from the
            # index, and its shape known to the fast path.
            reads = self._headrace_relations_read(ast) if self.serving_on_postgres else ()
            lookup = bool(reads) and not parsed_off_loop and self.fast_path.could_answer(ast, param_types)
            if not lookup:
                self.passthrough.routes.remember(fingerprint, sql, reads)
            statement = await self.passthrough.prepare(session, sql, param_types, ast, describe=describe or lookup)
            statement.store_reads = reads
            if lookup:
                statement = self.fast_path.learn(sql, param_types, ast, statement, fingerprint)
                if isinstance(statement, FastStatement):  # known by its text from now on, as a planned one
                    self.plan_cache.put(sql, param_types, statement)
                else:  # no index answers it after all
                    self.passthrough.routes.remember(fingerprint, sql, reads)
            return statement
        if self.passthrough is not None and store_setting(session, ast):
            return await self.passthrough.prepare(session, sql, param_types, ast, describe=describe)
        if self.passthrough is not None and (refusal := self._table_only_the_store_keeps(ast, sql)) is not None:
            statement = await self.passthrough.prepare(session, sql, param_types, ast, describe=describe)
            statement.notice = refusal
            return statement
        if self.passthrough is not None and self._copies_into_store(ast):
            # COPY FROM STDIN into a relation only the store keeps: PostgreSQL's COPY takes the client's data as sent
            return await self.passthrough.prepare(session, sql, param_types, ast, describe=False)
        if isinstance(ast, SESSION_STATEMENTS):
            return PreparedStatement(sql, ast, self.session_sql.describe(session, ast, param_types))
        if self.passthrough is not None and (is_query(ast) or is_write(ast) or isinstance(ast, SubscribeStatement)
                                             or view_ddl.is_create_materialized_view(ast)):
            # over headrace's relations, and naming the store's too
            await self.passthrough.refuse_mixed(session, ast, self._relation_named)
        if is_query(ast):
            # A large statement is planned off the event loop too: planning costs about what parsing did.
            plan = (await off_loop(plan_select, ast, self._relation_exists, param_types) if parsed_off_loop
                    else plan_select(ast, self._relation_exists, param_types))
            if plan.param_probe is not None:  # `k = $1`: $1 takes k's type, as in PostgreSQL
                inferred = await self._run(probe_parameter_types, self.resources.query_store, plan, param_types)
                if inferred is not None:
                    plan = plan_select(ast, self._relation_exists, inferred)
            if plan.reads_system_catalog:
                await self._run(self.system_catalog.refresh)
            unbound = plan
            if self.system_tables is not None:
                plan = self.system_tables.bind(plan)
                columns = await self._run(self.system_tables.describe, self.resources.query_store, plan)
            else:
                columns = await self._run(describe_query, self.resources.query_store, plan)
            statement = PreparedStatement(sql, ast, StatementDescription(plan.param_types, columns), plan)
            # A large statement (parsed off the loop) is neither a point lookup nor worth a cache entry's memory, and
            # learning its shape would walk its whole tree on the event loop.
            if plan is unbound and not parsed_off_loop:
                statement = self.fast_path.learn(sql, param_types, ast, statement, fingerprint)
                self.plan_cache.put(sql, param_types, statement)
            return statement
        if table_ddl.handles(ast):
            return PreparedStatement(sql, ast, await self.tables.describe(ast, param_types))
        if isinstance(ast, SubscribeStatement):
            return PreparedStatement(sql, ast, StatementDescription(tuple(param_types),
                                                                    await self.subscriptions.describe(ast)))
        return PreparedStatement(sql, ast, StatementDescription(tuple(param_types), self._static_columns(ast)))

    def shortcuts_allowed(self, session: Session) -> bool:
        """Whether a statement may be taken by its text or shape (prepare_cached): not while temporary relations of
        the session's store backend may shadow headrace's (coordinator/temp_relations.py)."""
        return self.passthrough is None or not self.passthrough.may_shadow(session)

    def prepare_cached(self, sql: str, param_types: Sequence[int], fingerprint: Any = None, *,
                       copy: bool = True) -> PreparedStatement | None:
        """The statement from the plan cache (coordinator/plan_cache.py) or as a known index lookup shape with
        other literals (coordinator/fast_path.py); None when it must be planned. `copy=False`: possibly the
        cache's own object, to be read only (copy_statement before keeping it in a session)."""
        if fingerprint is None:
            fingerprint = self.plan_cache.fingerprint()
        cached = self.plan_cache.get(sql, param_types, fingerprint, copy=copy)
        if cached is not None:
            return cached
        return self.fast_path.prepare(sql, param_types, fingerprint)

    def answer_now(self, session: Session, statement: PreparedStatement, params: Sequence[Any]) -> list[Any] | None:
        """A point query's rows without waiting for anything, or None when execute() must run: not an index
        lookup, a failed transaction block, a table write not yet visible (read-your-writes), or an index that
        has changes to catch up with. Nothing else differs from execute(): the same index, the same rows."""
        if not isinstance(statement, FastStatement) or session.transaction is TransactionStatus.FAILED:
            return None
        if session.in_block and self.tables.has_pending_writes(session):
            return None  # execute() decides whether the read must be refused
        if self.tables.behind(statement.shape_sql or statement.sql):
            return None
        if view_ddl.may_hold_errors(self.tables.store):
            return None  # execute() fails the read if it names a view holding an error (coordinator/views.py)
        relations = statement.plan.relations if statement.plan is not None else statement.store_reads
        if not self.privileges.may_read(session.user, relations):
            return None  # execute() raises the 42501
        if statement.store_reads and session.in_block:
            return None  # execute() has PostgreSQL answer: its snapshot, as the transaction's isolation says
        return self.fast_path.answer_now(statement, params)

    def _is_postgres_statement(self, ast: exp.Expr) -> bool:
        """Whether `ast` is PostgreSQL's to run on the store (coordinator/passthrough.py) rather than headrace's."""
        if isinstance(ast, (*SESSION_STATEMENTS, SubscribeStatement, ShowObjects, GrantPrivileges, *ROLE_STATEMENTS)):
            return False
        if view_ddl.handles(ast) or is_source_ddl(ast) or sink_ddl.handles(ast):
            return False
        if index_ddl.handles(ast):
            if isinstance(ast, exp.Drop):  # an index headrace keeps, or one of the store's
                return all(self.indexes.catalog.find(t.db or "public", t.name) is None
                           for t in ast.find_all(exp.Table))
            return isinstance(ast, exp.Create) and not mentions_headrace(ast, self._relation_named)
        if is_create_table(ast) and ast.expression is None:
            # a headrace table (its writes feed the pipeline), or a temporary one: the store's, even when it shadows
            # a headrace relation of the same name (coordinator/temp_relations.py)
            return is_temporary_table(ast)
        if is_drop_table(ast) and any(self._relation_named(t.db or "public", t.name) for t in ast.find_all(exp.Table)):
            # a headrace table: its log, storage and views go with it (coordinator/tables.py); a source or a
            # materialized view: headrace's 42809, as PostgreSQL answers DROP TABLE of a view
            return False
        if self.serving_on_postgres:
            return self._store_answers(ast)
        return not mentions_headrace(ast, self._relation_named)

    async def _shadowed_by_temporary(self, session: Session, ast: exp.Expr) -> frozenset[str]:
        """The names in `ast` that are the session's temporary relations on the store (coordinator/temp_relations.py),
        unless `ast` is headrace's own kind of statement; 0A000 for a statement that cannot run on the store whole (a
        write to one of headrace's tables, or, with the DuckDB serving store, a read of its relations too)."""
        assert self.passthrough is not None
        if isinstance(ast, (*SESSION_STATEMENTS, SubscribeStatement, ShowObjects, GrantPrivileges, *ROLE_STATEMENTS)) \
                or view_ddl.handles(ast) or is_source_ddl(ast) or sink_ddl.handles(ast):
            return frozenset()
        shadowed = await self.passthrough.temporary_names(session, ast)
        if shadowed:
            refuse_mixed_with_temporary(ast, shadowed, self._headrace_relations_read(ast), self.serving_on_postgres,
                                        self._relation_named)
        return shadowed

    def _store_answers(self, ast: exp.Expr) -> bool:
        """With the PostgreSQL serving store (headrace's relations are real relations there), whether PostgreSQL
        runs `ast` (not one of headrace's own statements): anything but a write to headrace's relations (headrace's:
        a table's writes feed the pipeline) and a statement over headrace's system relations (headrace_internal,
        mz_*); pg_catalog and information_schema are PostgreSQL's own, describing the real relations. A statement
        that calls a function of headrace's session or process (`SELECT pg_backend_pid()`, `current_setting(...)`)
        stays headrace's, as without the PostgreSQL serving store."""
        if is_write(ast):
            try:
                target = write_target(ast)
            except HeadraceError:
                target = None  # not a plain table name: PostgreSQL's to judge
            if target is not None and self._relation_named(target.schema or "public", target.name):
                return False
        if reads_headrace_only(ast, self.system_mirror.mirrors if self.system_mirror is not None else None):
            return False
        if reads_catalog(ast) or self._headrace_relations_read(ast):
            return True
        return not calls_session_function(ast, database_is_the_stores=True)

    def _copies_into_store(self, ast: exp.Expr) -> bool:
        if not isinstance(ast, CopyStatement) or ast.args.get("direction") != "from" or not ast.args.get("table"):
            return False
        schema, name = ast.args["table"]
        return not self._relation_named(schema or "public", name)

    def _headrace_relations_read(self, ast: exp.Expr) -> tuple[tuple[str | None, str], ...]:
        ctes = {cte.alias_or_name.lower() for cte in ast.find_all(exp.CTE)}
        return tuple(dict.fromkeys(
            (table.db or None, table.name) for table in referenced_tables(ast)
            if not (not table.db and table.name.lower() in ctes)
            and self._relation_exists(table.db or "public", table.name)))

    def _table_only_the_store_keeps(self, ast: exp.Expr, sql: str) -> str | None:
        """A CREATE TABLE headrace's tables cannot keep (SERIAL, UNIQUE, CHECK, a DEFAULT it cannot evaluate, ...)
        is created by the store PostgreSQL alone, as a plain PostgreSQL table with all of PostgreSQL's semantics:
        the notice says so, and why materialized views, SUBSCRIBE and sinks cannot read it. None: headrace's."""
        if not is_create_table(ast) or is_temporary_table(ast) or ast.expression is not None:
            return None
        target = ast.this.this if isinstance(ast.this, exp.Schema) else ast.this
        if isinstance(target, exp.Table) and self._relation_named(target.db or "public", target.name):
            return None  # headrace says 42P07
        try:
            table_from_create("pending", ast, sql)
        except FeatureNotSupported as refused:
            return (f"the table is kept by the store PostgreSQL only ({refused.message}): queries see it, "
                    "materialized views, SUBSCRIBE and sinks cannot read it")
        except HeadraceError:
            return None  # a bad definition: headrace's error
        return None

    def close_session(self, session: Session) -> None:
        if self.passthrough is not None:
            self.passthrough.close(session)
        if session.in_block and table_blocks.created_any(session):  # gone mid-block: its tables are rolled back
            try:
                task = asyncio.get_running_loop().create_task(self.tables.end_transaction(session, committed=False))
            except RuntimeError:  # no event loop (closed at shutdown): the tables stay
                return
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _static_columns(self, ast: exp.Expr) -> tuple[Column, ...] | None:
        if index_ddl.handles(ast):
            return index_ddl.SHOW_COLUMNS if isinstance(ast, ShowObjects) else None
        if view_ddl.handles(ast):
            return self.views.columns(ast)
        if isinstance(ast, ShowObjects) and ast.args.get("kind") == "secret":
            return (Column("name", TEXT),)
        if sink_ddl.handles(ast):
            return sink_ddl.show_columns(ast)
        if isinstance(ast, ShowObjects):
            return (Column("name", TEXT), Column("type", TEXT))
        return None

    # ---- execute ------------------------------------------------------------------------------
    async def execute(self, session: Session, portal: Portal, max_rows: int, cancel: asyncio.Event, *,
                      stream: bool = False) -> ExecuteResponse:
        """`stream`: the caller takes a large result in pieces (SendingRows.more, coordinator/row_streams.py)."""
        if portal.row_stream is not None and not portal.pending_rows:
            return await continue_stream(portal, cancel)
        if portal.pending_rows is not None:
            return next_rows(portal, max_rows)
        if portal.finished and portal.stream is None and portal.scroll_rows is None:
            # a DML or DDL portal that ran: running it again would do it twice (PostgreSQL: 55000)
            name = next((name for name, held in session.portals.items() if held is portal), "")
            raise HeadraceError(f'portal "{name}" cannot be run', sqlstate="55000")
        stream = stream and max_rows == 0
        statement = portal.statement
        ast = statement.ast
        if ast is None and not statement.backend:
            return EmptyQuery()
        if session.transaction is TransactionStatus.FAILED and not isinstance(ast, (exp.Commit, exp.Rollback)) \
                and not (isinstance(ast, SavepointStatement) and ast.args["action"] == "rollback_to"):
            raise HeadraceError("current transaction is aborted, commands ignored until end of transaction block",
                                sqlstate=AbortedTransaction)
        if statement.backend:  # PostgreSQL's statement (coordinator/passthrough.py)
            assert self.passthrough is not None
            if statement.store_reads:  # headrace's relations, kept in the store PostgreSQL
                self.privileges.require_relations(session.user, statement.store_reads)
                await self._sync_store_grants()
                if self.system_mirror is not None and (system := [name for schema, name in statement.store_reads
                                                                  if self.system_mirror.mirrors(schema, name)]):
                    await self._run(self.system_mirror.refresh, system)
                own_writes = await self.tables.statement_with_own_writes(session, ast, statement.sql) \
                    if session.in_block else None
                await self.tables.wait_visible(statement.sql, cancel=cancel, exclude=own_writes and own_writes[1],
                                               statement_timeout_s=statement_timeout_s(session.variables))
                if own_writes is not None:  # it reads tables this block wrote: as the block sees them
                    portal.statement = dataclasses.replace(statement, sql=own_writes[0])
            try:
                response = await self.passthrough.execute(session, portal, cancel, stream=stream)
            finally:
                portal.statement = statement
            if isinstance(response, SendingRows):
                return next_rows(portal, max_rows, tag_verb=response.tag_verb, tag=response.tag)
            return response
        assert ast is not None
        if statement.plan is not None:  # SELECT, COPY (query) TO, a cursor's query, an index lookup
            self.privileges.require_relations(session.user, statement.plan.relations)
        elif statement.store_reads:  # an index lookup on the PostgreSQL serving store
            self.privileges.require_relations(session.user, statement.store_reads)
        elif isinstance(ast, SubscribeStatement):
            self._authorize_subscribe(session, ast)
        own_writes: tuple[str, frozenset[str]] | None = None
        if statement.plan is not None or isinstance(statement, FastStatement) or isinstance(ast, SubscribeStatement):
            if session.in_block and isinstance(statement, FastStatement) and statement.store_reads:
                own_writes = await self.tables.statement_with_own_writes(session, ast, statement.sql)
            elif session.in_block:
                self.tables.refuse_read_of_own_writes(session, statement.sql)
            # read-your-writes of tables (coordinator/tables.py); a cancel and statement_timeout end the wait
            await self.tables.wait_visible(statement.sql, cancel=cancel, exclude=own_writes and own_writes[1],
                                           statement_timeout_s=statement_timeout_s(session.variables))
        if own_writes is not None:  # an index lookup of a table this block wrote: PostgreSQL runs it as it sees it
            return await self.run_on_store(session, portal, max_rows, cancel, sql=own_writes[0])
        if isinstance(statement, FastStatement):  # answered from an index (coordinator/fast_path.py)
            return await self.fast_path.execute(self, session, portal, max_rows, cancel)
        if statement.plan is not None:
            if statement.plan.reads_system_catalog:
                await self._run(self.system_catalog.refresh)
            params = session_parameters(statement.plan, portal.params, session)  # + current_user, ...
            columns, rows, portal.row_stream = await self._run_cancellable(cancel, statement.plan, params, stream)
            portal.columns = columns
            portal.pending_rows = rows
            return next_rows(portal, max_rows)
        creating = CREATING_ROLE.set(session.user)  # it owns what the statement creates (catalog/catalog.py)
        try:
            if table_ddl.handles(ast):
                if is_write(ast):
                    refuse_store_only_functions(ast)  # INSERT ... SELECT FROM read_text(...), ...
                    target = write_target(ast)
                    self.privileges.require_write(session.user, ast, (target.schema, target.name))
                else:  # CREATE / DROP TABLE
                    authorize_command(self.privileges, session.user, ast, statement.sql, self.indexes.catalog.find,
                                      self.host_access)
                response = await self.tables.execute(session, ast, statement.sql, portal.params)
            elif isinstance(ast, SESSION_STATEMENTS):
                response = await self.session_sql.execute(session, ast, cancel)
                if self.passthrough is not None:  # COMMIT, ROLLBACK, SAVEPOINT reach the store backend too
                    await self.passthrough.after_session_statement(session, ast)
            else:
                response = await self._execute_command(session, ast, statement.sql)
        finally:
            CREATING_ROLE.reset(creating)
        await self._sync_store_grants()  # a relation created or dropped, a GRANT, a role changed
        if isinstance(response, SendingRows):
            portal.columns, portal.pending_rows = response.columns, list(response.rows)
            return next_rows(portal, max_rows, tag_verb=response.tag_verb)
        portal.finished = True
        return response

    async def run_on_store(self, session: Session, portal: Portal, max_rows: int,
                           cancel: asyncio.Event, sql: str | None = None) -> ExecuteResponse:
        """An index lookup on the PostgreSQL serving store that its index declined (coordinator/fast_path.py):
        PostgreSQL runs its text (or `sql`, the same query over this block's own writes), with its parameters
        re-encoded (headrace decoded them for the index)."""
        assert self.passthrough is not None
        statement = portal.statement
        await self._sync_store_grants()
        relayed = Portal(PreparedStatement(sql or statement.sql, statement.ast, statement.description, backend=True,
                                           store_reads=statement.store_reads),
                         portal.params, binary=portal.binary, result_formats=portal.result_formats)
        response = await self.passthrough.execute(session, relayed, cancel)
        if not isinstance(response, SendingRows):
            portal.finished = True
            return response
        portal.columns, portal.pending_rows = relayed.columns, relayed.pending_rows
        return next_rows(portal, max_rows, tag_verb=response.tag_verb, tag=response.tag)

    async def _execute_command(self, session: Session, ast: exp.Expr, sql: str) -> ExecuteResponse:
        refuse_store_only_functions(ast)  # a view's or a SUBSCRIBE's query
        authorize_command(self.privileges, session.user, ast, sql, self.indexes.catalog.find, self.host_access)
        if isinstance(ast, GrantPrivileges):
            return execute_grant(self.privileges, session.user, ast)
        if index_ddl.handles(ast):
            return await self.indexes.execute(ast, sql)
        if is_source_ddl(ast):
            return await self.source_ddl.execute(ast)
        if view_ddl.handles(ast):
            return await self.views.execute(ast, sql)
        if sink_ddl.handles(ast):
            return await self.sinks.execute(ast, sql)
        if isinstance(ast, ShowObjects):
            rows = [(source.name, "webhook") for source in self.catalog.sources()
                    if ast.args.get("schema") in (None, source.schema)]
            return SendingRows(self._static_columns(ast) or (), rows, tag_verb="SHOW")
        if isinstance(ast, ROLE_STATEMENTS):
            return execute_role_statement(self.roles, session.user, ast,
                                          lambda role: role_dependents(self.privileges, role))
        if isinstance(ast, SubscribeStatement):
            return await self.subscriptions.start(ast)
        raise FeatureNotSupported(f"{ast.key.upper()} is not supported yet")

    def _authorize_subscribe(self, session: Session, ast: SubscribeStatement) -> None:
        query = ast.args.get("query")
        if query is None:
            schema, name = ast.this
            self.privileges.require_relations(session.user, [(schema or None, name)])
        else:
            self.privileges.require_relations(session.user, [(t.db or None, t.name) for t in referenced_tables(query)])

    # ---- DDL ----------------------------------------------------------------------------------
    def _sources_changed(self) -> None:
        self._on_sources_changed(self.catalog.sources())

    # ---- helpers ------------------------------------------------------------------------------
    def _relation_exists(self, schema: str, name: str) -> bool:
        if self.system_tables is not None and self.system_tables.exists(schema, name):
            return True
        if self.views.is_system_relation(schema, name) or self.catalog.find_view(schema, name) is not None:
            return True
        return self.catalog.find(schema, name) is not None or self.catalog.find_table(schema, name) is not None

    def _relation_named(self, schema: str, name: str) -> bool:
        """_relation_exists, or a headrace relation whose name differs only in case: headrace does not fold unquoted
        names yet (`CREATE TABLE Foo` keeps "Foo") while its SELECTs resolve names without case, so for routing a
        statement (coordinator/passthrough.py) `foo` names it too."""
        if self._relation_exists(schema, name):
            return True
        folded = name.lower()
        items = [*self.catalog.sources(), *self.catalog.tables(), *self.catalog.views()]
        return any(item.schema.lower() == schema.lower() and item.name.lower() == folded for item in items)

    async def _sync_store_grants(self) -> None:
        if self.store_grants is not None and not self.store_grants.up_to_date():
            await self._run(self.store_grants.sync)

    async def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def _run_cancellable(self, cancel: asyncio.Event, plan: Any, params: Sequence[Any], stream: bool = False
                               ) -> tuple[tuple[Column, ...], list[tuple[Any, ...]], StoreRowStream | None]:
        """A plan's columns and rows; with `stream`, its first STREAM_CHUNK_ROWS rows and the rest still in
        DuckDB (the stream then holds the cursor)."""
        reusable = reusable_cursor(plan)
        cursor = self.cursors.acquire() if reusable else self.resources.query_store.cursor()
        kept = False
        chunk = STREAM_CHUNK_ROWS if stream else None
        try:
            if runs_inline(plan):  # no FROM: microseconds, or rows DuckDB produces as they are fetched
                columns, rows, rest = run_query_chunk(cursor, plan, params, chunk)
            else:
                if self.system_tables is not None:
                    self.system_tables.register(cursor, plan)
                try:
                    columns, rows, rest = await interruptible(
                        self._run(run_query_chunk, cursor, plan, params, chunk), cancel, cursor.interrupt)
                except QueryCanceled:
                    reusable = False
                    raise
            if rest is None:
                return columns, rows, None
            kept = True
            return columns, rows, StoreRowStream(rest, columns, self._run,
                                                 lambda ok: self.cursors.release(cursor, reusable and ok))
        finally:
            if not kept:
                self.cursors.release(cursor, reusable)


def statement_timeout_s(variables: dict[str, str]) -> float:
    """The session's statement_timeout in seconds (0: none), read as PostgreSQL reads it: ms by default, or with a
    unit (ms, s, min, h, d)."""
    text = variables.get("statement_timeout", "0").strip().strip("'").lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|min|h|d)?", text)
    if match is None:
        return 0.0
    scale = {"ms": 0.001, None: 0.001, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}[match.group(2)]
    return float(match.group(1)) * scale
