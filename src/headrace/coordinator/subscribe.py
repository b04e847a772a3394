"""SUBSCRIBE: a webhook source's or materialized view's rows as of a timestamp, then every committed change.

Everything is read from the serving store's changelog (docs/materialization.md, "The changelog"): one
transaction per poll (DuckDB's, or PostgreSQL's REPEATABLE READ: `store.reading()`) reads the committed
frontier (`latest_timestamp`), the changelog's `since` frontier and the changes after our position, so
compaction cannot slip in between. The object's public relation (or the subscriber's `SELECT ... FROM object
WHERE ...`) is applied to the snapshot and to each change batch by the store itself, in its dialect
(`store.dialect`), over a CTE `__hr_input` with the stored columns plus hr_timestamp and hr_diff: on the
PostgreSQL store the subscriber's functions, casts and errors are PostgreSQL's, and so are the column types
(coordinator/subscribe_postgres.py).

Output columns: hr_timestamp numeric, [hr_progressed bool (WITH PROGRESS)], hr_diff bigint, data columns.
UP TO is exclusive (as in Materialize): changes at timestamps < UP TO, then the stream ends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import duckdb
from sqlglot import exp

from headrace.catalog.catalog import Catalog
from headrace.coordinator.responses import Column, Subscribing
from headrace.coordinator.subscribe_postgres import (INPUT, allow_reading, check_functions, describe_columns,
                                                     fetch_rows, reading, subscriber_select)
from headrace.errors import FeatureNotSupported, HeadraceError, UndefinedObject
from headrace.materialize.sources import source_binding
from headrace.pgwire import types as pg
from headrace.sql.ast import SubscribeStatement
from headrace.sql.types import oid_of_duckdb_type
from headrace.sql.view_serving import public_relation_sql
from headrace.store.jsonb import jsonb_text
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ChangelogCompacted, ServingStore, changelog_table, qualified_name, quote_ident

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.1
PROGRESS_INTERVAL_MS = 1000
# A commit takes its timestamp from the store's clock just before it becomes visible, so once the clock
# is this far past a timestamp no commit at or before it can still appear (UP TO ends, AS OF is reached).
CLOCK_GRACE_MS = 1000
FROM_KEY = "from_" if "from_" in exp.Select.arg_types else "from"  # renamed in newer sqlglot

Row = tuple[Any, ...]
Store = ServingStore | PostgresServingStore


@dataclass(frozen=True, slots=True)
class SubscribeTarget:
    """What a subscription reads: the binding table, its materialization, and the SELECT (in the store's
    dialect) over `__hr_input` (hr_timestamp, hr_diff, stored columns) giving hr_timestamp, hr_diff, data
    columns."""

    resource_path: tuple[str, ...]
    materialization: str
    select_sql: str


def source_target(source: Any) -> SubscribeTarget:
    binding = source_binding(source)
    columns = ", ".join(quote_ident(column) for column in source.column_names())
    return SubscribeTarget(binding.resource_path, source.materialization,
                           f"SELECT hr_timestamp, hr_diff, {columns} FROM {INPUT}")


def table_target(table: Any) -> SubscribeTarget:
    """A table's declared columns (its hidden row id, if any, stays hidden), as its public relation shows them."""
    columns = ", ".join(quote_ident(column) for column in table.column_names())
    return SubscribeTarget(("headrace_internal", table.materialization), table.materialization,
                           f"SELECT hr_timestamp, hr_diff, {columns} FROM {INPUT}")


def view_target(plan: Any, view_id: str, materialization: str | None = None,
                dialect: str = "duckdb") -> SubscribeTarget:
    """The view's public relation (sql/view_serving.py) re-aimed at the input: outputs as SELECT * shows them.
    `dialect`: the serving store's."""
    create = exp.maybe_parse(public_relation_sql(plan, view_id, dialect=dialect), dialect=dialect)
    select = create.expression
    if isinstance(select, exp.Union):  # the "no rows at all" branch of a global aggregate: snapshot-only
        select = select.this
    select = select.copy()
    select.set(FROM_KEY, exp.From(this=exp.to_table(INPUT)))
    select.set("expressions", [exp.column("hr_timestamp"), exp.column("hr_diff"), *select.expressions])
    # `materialization`: whose commit timestamps are the view's, its root source's or table's
    # (Catalog.root_materialization): a view is a binding of its root's transactions.
    return SubscribeTarget((("headrace_internal", f"view_{view_id}")), materialization or f"view_{view_id}",
                           select.sql(dialect=dialect))


def restrict(target: SubscribeTarget, query: exp.Expr, data_columns: Sequence[str],
             dialect: str = "duckdb", query_sql: str | None = None) -> SubscribeTarget:
    """SUBSCRIBE (SELECT ... FROM object [WHERE ...]): the projection and filter over the object's rows, in the
    serving store's `dialect`. On PostgreSQL the subscriber's SELECT runs as PostgreSQL runs it, from its own text
    `query_sql` when given (subscribe_postgres.subscriber_select)."""
    if not isinstance(query, exp.Select):
        raise FeatureNotSupported("SUBSCRIBE supports (SELECT ... FROM <source or materialized view> [WHERE ...])")
    refused = [name for name in ("joins", "group", "having", "order", "limit", "offset", "distinct", "with", "qualify")
               if query.args.get(name)]
    if query.find(exp.AggFunc) is not None or query.find(exp.Window) is not None:
        refused.append("aggregates")
    if any(isinstance(node, (exp.Subquery, exp.Exists)) for node in query.walk()):
        refused.append("subqueries")
    if refused:
        raise FeatureNotSupported(f"SUBSCRIBE (SELECT ...) cannot use {', '.join(refused)}",
                                  hint="create a materialized view for it and SUBSCRIBE to the view")
    select = query.copy()
    table = select.args[FROM_KEY].this
    alias = table.alias_or_name
    if dialect == "postgres":
        check_functions(query)
    if dialect == "postgres" and query_sql is not None:
        spliced = subscriber_select(query_sql, alias, target.select_sql, data_columns)
        if spliced is not None:
            return SubscribeTarget(target.resource_path, target.materialization, spliced)
    expressions: list[exp.Expr] = [exp.column("hr_timestamp", table=alias), exp.column("hr_diff", table=alias)]
    for expression in select.expressions:
        if isinstance(expression, exp.Star) or (isinstance(expression, exp.Column) and expression.is_star):
            expressions += [exp.column(name, table=alias, quoted=True) for name in data_columns]
        else:
            expressions.append(expression)
    select.set("expressions", expressions)
    subquery = exp.maybe_parse(target.select_sql, dialect=dialect).subquery(alias)
    select.set(FROM_KEY, exp.From(this=subquery))
    return SubscribeTarget(target.resource_path, target.materialization, select.sql(dialect=dialect))


class Subscriptions:
    """Starts subscriptions for the coordinator; `resolve(schema, name)` finds a source or view's target."""

    def __init__(self, store: Store, executor: ThreadPoolExecutor, catalog: Catalog,
                 view_plan: Callable[[Any], Any]) -> None:
        self.store = store
        self.executor = executor
        self.catalog = catalog
        self._view_plan = view_plan

    def resolve(self, schema: str, name: str) -> SubscribeTarget:
        source = self.catalog.find(schema or "public", name)
        if source is not None:
            return source_target(source)
        view = self.catalog.find_view(schema or "public", name)
        if view is not None:
            root = getattr(self.catalog, "root_materialization", None)
            return view_target(self._view_plan(view), view.id, root(view) if root is not None else None,
                               self.store.dialect)
        find_table = getattr(self.catalog, "find_table", None)  # CREATE TABLE (coordinator/tables.py)
        table = find_table(schema or "public", name) if find_table is not None else None
        if table is not None:
            return table_target(table)
        shown = f"{schema}.{name}" if schema else name
        raise UndefinedObject(f'unknown catalog item \'{shown}\'')

    def target(self, ast: SubscribeStatement) -> SubscribeTarget:
        query = ast.args.get("query")
        if query is None:
            schema, name = ast.this
            return self.resolve(schema, name)
        from_ = query.args.get(FROM_KEY) if isinstance(query, exp.Select) else None
        if from_ is None or not isinstance(from_.this, exp.Table):
            raise FeatureNotSupported("SUBSCRIBE supports (SELECT ... FROM <source or materialized view> [WHERE ...])")
        table = from_.this
        base = self.resolve(table.db, table.name)
        return restrict(base, query, self._column_names(base), self.store.dialect, ast.args.get("query_sql"))

    def _error_check(self, ast: SubscribeStatement) -> Callable[[], Awaitable[None]] | None:
        """For a SUBSCRIBE of a view: raises the view's error (or a view's it reads) once it holds one, as a SELECT of
        it fails (coordinator/views.py refuse_view_errors: no store query unless a commit changed views' errors)."""
        query = ast.args.get("query")
        if query is None:
            schema, name = ast.this
        else:
            table = query.args[FROM_KEY].this
            schema, name = table.db, table.name
        if self.catalog.find_view(schema or "public", name) is None:
            return None
        from headrace.coordinator.views import refuse_view_errors

        async def run(function: Callable[..., Any], *args: Any) -> Any:
            return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)
        return lambda: refuse_view_errors(self.catalog, self.store, run, f'"{name}"')  # type: ignore[arg-type]

    def _column_names(self, target: SubscribeTarget) -> list[str]:
        return [column.name for column in describe_target(self.store, target)]

    async def describe(self, ast: SubscribeStatement) -> tuple[Column, ...]:
        target = self.target(ast)
        data = await asyncio.get_running_loop().run_in_executor(self.executor, describe_target, self.store, target)
        return output_columns(data, bool(ast.args.get("progress")))

    async def start(self, ast: SubscribeStatement) -> Subscribing:
        target = self.target(ast)
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(self.executor, describe_target, self.store, target)
        stream = SubscriptionStream(self.store, self.executor, target, data, snapshot=bool(ast.args.get("snapshot")),
                                    progress=bool(ast.args.get("progress")), as_of=ast.args.get("as_of"),
                                    up_to=ast.args.get("up_to"), check_errors=self._error_check(ast))
        return Subscribing(output_columns(data, stream.progress), stream.batches(), stream.cancel)


def output_columns(data: Sequence[Column], progress: bool) -> tuple[Column, ...]:
    head = [Column("hr_timestamp", pg.NUMERIC)]
    if progress:
        head.append(Column("hr_progressed", pg.BOOL))
    head.append(Column("hr_diff", pg.INT8))
    return (*head, *data)


def describe_target(store: Store, target: SubscribeTarget) -> tuple[Column, ...]:
    """The data columns (after hr_timestamp and hr_diff) of the target's SELECT, without rows."""
    if isinstance(store, PostgresServingStore):  # PostgreSQL's types, sizes and modifiers; its errors
        path = target.resource_path
        allow_reading(store, [qualified_name(path), changelog_table(path)])  # what the stream reads, as the reader
        with reading(store) as conn:  # as the reader (coordinator/subscribe_postgres.py)
            return describe_columns(conn, changelog_table(path), target.select_sql)[2:]
    sql = f"WITH {INPUT} AS (SELECT * FROM {changelog_table(target.resource_path)} LIMIT 0) {target.select_sql}"
    with store.cursor() as cursor:
        try:
            description = cursor.execute(sql).description or []
        except duckdb.Error as exc:
            raise HeadraceError(f"SUBSCRIBE cannot read {qualified_name(target.resource_path)}: {exc}",
                                sqlstate="42703" if isinstance(exc, duckdb.BinderException) else "XX000") from None
    return tuple(Column(name, oid_of_duckdb_type(str(type_name))) for name, type_name, *_ in description[2:])


class SubscriptionStream:
    def __init__(self, store: Store, executor: ThreadPoolExecutor, target: SubscribeTarget,
                 data_columns: Sequence[Column], *, snapshot: bool, progress: bool, as_of: int | None,
                 up_to: int | None, check_errors: Callable[[], Awaitable[None]] | None = None) -> None:
        self.store, self.executor, self.target = store, executor, target
        self.check_errors = check_errors  # a view's error arriving later ends the subscription with it
        self.snapshot, self.progress, self.as_of, self.up_to = snapshot, progress, as_of, up_to
        self._data_columns = tuple(data_columns)
        self._data_width = len(data_columns)
        # DuckDB's JSON text is brought to jsonb's normal form; PostgreSQL prints that form itself
        self._jsonb = [2 + i for i, column in enumerate(data_columns)
                       if column.type_oid == pg.JSONB and store.dialect == "duckdb"]
        self._cancelled = asyncio.Event()
        self._stored_columns = [name for name in (store.columns(target.resource_path) or {})]
        # The PostgreSQL connection a read is running on: cancel() ends its statement (a subscriber's SELECT may
        # run long, pg_sleep() or a slow function). Cleared under the lock before the connection goes back to the
        # pool, so a cancel never reaches another reader's statement.
        self._active: Any = None
        self._active_lock = threading.Lock()

    def cancel(self) -> None:
        self._cancelled.set()
        if self._active is not None:
            threading.Thread(target=self._cancel_active, name="subscribe-cancel", daemon=True).start()

    def _cancel_active(self) -> None:
        with self._active_lock:
            if self._active is not None:
                try:
                    self._active.cancel_safe(timeout=5)
                except Exception:  # noqa: BLE001 - the read ends by itself then; cancelling is best effort
                    log.warning("could not cancel a SUBSCRIBE read", exc_info=True)

    async def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)
        except HeadraceError as error:
            if error.sqlstate == "57014" and self._cancelled.is_set():
                raise _Stopped from None  # our own cancel() ended the read: the stream just ends
            raise

    async def _sleep(self) -> bool:
        """Wait one poll interval; False once cancelled."""
        try:
            await asyncio.wait_for(self._cancelled.wait(), POLL_INTERVAL_S)
        except TimeoutError:
            return True
        return False

    async def batches(self) -> AsyncIterator[Sequence[Row]]:
        try:
            async for batch in self._batches():
                yield batch
        except _Stopped:
            return

    async def _batches(self) -> AsyncIterator[Sequence[Row]]:
        position: int | None = None
        while position is None:  # an AS OF in the future: wait until the store has passed it
            position, rows = await self._run(self._read_snapshot)
            if position is None and not await self._sleep():
                return
        if self.snapshot and rows:
            yield rows
        frontier_shown = position
        while not self._cancelled.is_set():
            if self.up_to is not None and position >= self.up_to - 1:
                return
            if self.check_errors is not None:
                await self.check_errors()
            position, rows, frontier = await self._run(self._read_changes, position)
            if rows:
                yield rows
                frontier_shown = frontier
            elif self.progress and frontier - frontier_shown >= PROGRESS_INTERVAL_MS:
                frontier_shown = frontier
                yield [self._progress_row(frontier)]
            if self.up_to is not None and _now_ms() - CLOCK_GRACE_MS >= self.up_to:
                position, rows, _ = await self._run(self._read_changes, position)  # the last ones below UP TO
                if rows:
                    yield rows
                return
            if not rows and not await self._sleep():
                return

    # --- reads (executor threads) -------------------------------------------------------------
    @contextmanager
    def _reading(self) -> Iterator[Any]:
        """One read-only transaction: a DuckDB cursor, or a PostgreSQL connection in REPEATABLE READ."""
        if isinstance(self.store, PostgresServingStore):
            with reading(self.store) as conn:  # as the reader (coordinator/subscribe_postgres.py)
                with self._active_lock:
                    self._active = conn
                try:
                    yield conn
                finally:
                    with self._active_lock:
                        self._active = None
            return
        cursor = self.store.cursor()
        try:
            cursor.begin()
            yield cursor
        finally:
            cursor.rollback()
            cursor.close()

    def _read_snapshot(self) -> tuple[int | None, list[Row]]:
        """(the snapshot's timestamp, its rows with hr_diff +1), or (None, []) while AS OF is ahead."""
        path = self.target.resource_path
        with self._reading() as reader:
            latest = self.store.latest_timestamp(self.target.materialization, reader) or 0
            since = self.store.changelog_since(path, reader)
            as_of = latest if self.as_of is None else self.as_of
            if as_of > latest:
                if _now_ms() - CLOCK_GRACE_MS < as_of:
                    return None, []
                as_of = latest  # nothing committed in (latest, as_of]: the latest rows are those as of it
                latest_read = as_of
            else:
                latest_read = latest
            if as_of < latest and as_of + 1 < since:
                raise ChangelogCompacted(f"AS OF {as_of} is before the since frontier {since} of "
                                         f"{qualified_name(path)}: those changes were compacted",
                                         hint="subscribe without AS OF, or with a later one")
            columns = ", ".join(quote_ident(column) for column in self._stored_columns)
            rows: list[Row] = []
            if self.snapshot:
                input_sql = (f"SELECT {as_of}::BIGINT AS hr_timestamp, 1 AS hr_diff, {columns} "
                             f"FROM {qualified_name(path)}")
                if as_of < latest_read:  # undo the changes after AS OF, then consolidate
                    input_sql = (f"SELECT hr_timestamp, sum(hr_diff)::INTEGER AS hr_diff, {columns} FROM ("
                                 f"{input_sql} UNION ALL SELECT {as_of}::BIGINT, -hr_diff, {columns} FROM "
                                 f"{changelog_table(path)} WHERE hr_timestamp > {as_of}) AS __hr_undone "
                                 f"GROUP BY hr_timestamp, {columns} HAVING sum(hr_diff) <> 0")
                rows = self._select(reader, input_sql)
            position = as_of if self.as_of is not None else max(as_of, since - 1)
            return position, rows

    def _read_changes(self, position: int) -> tuple[int, list[Row], int]:
        """(the new position, the changes after `position` up to the committed frontier and below UP TO,
        the frontier)."""
        path = self.target.resource_path
        with self._reading() as reader:
            latest = self.store.latest_timestamp(self.target.materialization, reader) or 0
            since = self.store.changelog_since(path, reader)
            upto = latest if self.up_to is None else min(latest, self.up_to - 1)
            if latest <= position:
                # nothing committed after us: compaction's frontier may pass us without losing anything
                limit = since - 1 if self.up_to is None else min(since - 1, self.up_to - 1)
                return max(position, limit), [], latest
            if upto <= position:
                return position, [], latest
            if position + 1 < since:
                raise ChangelogCompacted(f"changes of {qualified_name(path)} after {position} were compacted "
                                         f"(retained from {since})", hint="SUBSCRIBE again for a new snapshot")
            columns = ", ".join(quote_ident(column) for column in self._stored_columns)
            input_sql = (f"SELECT hr_timestamp, hr_diff, {columns} FROM {changelog_table(path)} "
                         f"WHERE hr_timestamp > {position} AND hr_timestamp <= {upto}")
            return upto, self._select(reader, input_sql), latest

    def _select(self, reader: Any, input_sql: str) -> list[Row]:
        if isinstance(self.store, PostgresServingStore):
            rows = fetch_rows(reader, input_sql, self.target.select_sql, self._data_columns, skip=2)
        else:
            sql = f"WITH {INPUT} AS ({input_sql}) SELECT * FROM ({self.target.select_sql}) ORDER BY 1, 2"
            rows = reader.execute(sql).fetchall()
        return [self._output_row(row) for row in rows]

    def _output_row(self, row: Row) -> Row:
        values = list(row)
        for i in self._jsonb:
            if isinstance(values[i], str):
                values[i] = jsonb_text(values[i])
        head: list[Any] = [Decimal(values[0])]
        if self.progress:
            head.append(False)
        return (*head, int(values[1]), *values[2:])

    def _progress_row(self, frontier: int) -> Row:
        return (Decimal(frontier), True, None, *([None] * self._data_width))


class _Stopped(Exception):
    """A read ended by the stream's own cancel()."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
