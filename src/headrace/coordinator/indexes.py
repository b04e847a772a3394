"""CREATE INDEX / DROP INDEX / SHOW INDEXES, and the indexes' arrangements (store/arrangements.py).

`CREATE INDEX [IF NOT EXISTS] [name] ON <source | materialized view | table> (col, ...)` builds the
arrangement before answering, so the next point lookup is served from memory (coordinator/fast_path.py).
An index whose relation was dropped (or dropped and created again: a new catalog id) is forgotten the
next time its relation's indexes are looked up.

Either serving store (DuckDB or PostgreSQL): an index's columns are its relation's as SUBSCRIBE describes them
(`describe_target`: PostgreSQL's own types on the PostgreSQL store), and its arrangement reads what SUBSCRIBE reads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlglot import exp

from headrace.catalog.catalog import Catalog
from headrace.catalog.indexes import IndexCatalog, IndexDefinition
from headrace.coordinator.fast_path import IndexedRelation
from headrace.coordinator.responses import Column, CommandComplete, ExecuteResponse, SendingRows
from headrace.coordinator.subscribe import Store, Subscriptions, describe_target
from headrace.errors import DuplicateObject, FeatureNotSupported, HeadraceError, UndefinedColumn, UndefinedObject
from headrace.pgwire import types as pg
from headrace.sql.ast import ShowObjects
from headrace.store import index_relation_postgres
from headrace.store.arrangements import Arrangement, Arrangements
from headrace.store.postgres_serving import PostgresServingStore

SHOW_COLUMNS = (Column("name", pg.TEXT), Column("on", pg.TEXT), Column("cluster", pg.TEXT), Column("key", pg.TEXT))
INDEX_KIND = "index"


def handles(ast: exp.Expr) -> bool:
    if isinstance(ast, exp.Create) or isinstance(ast, exp.Drop):
        return str(ast.args.get("kind") or "").upper() == "INDEX"
    return isinstance(ast, ShowObjects) and ast.args.get("kind") == INDEX_KIND


class IndexDdl:
    def __init__(self, catalog: Catalog, store: Store, executor: ThreadPoolExecutor,
                 subscriptions: Subscriptions, data_dir: Path | None) -> None:
        self.items = catalog
        self.store = store
        self.executor = executor
        self.subscriptions = subscriptions
        self.catalog = IndexCatalog(data_dir)
        self.arrangements = Arrangements(store, executor)
        self._relations: dict[str, IndexedRelation] = {}  # by index id: columns and key positions
        self._lock = asyncio.Lock()

    # ---- lookups (fast path) -----------------------------------------------------------------------
    def relation_id(self, schema: str, name: str) -> str | None:
        """The catalog id of the source, view or table of that name."""
        finders: list[Callable[[str, str], Any]] = [self.items.find, self.items.find_view]
        find_table = getattr(self.items, "find_table", None)
        if find_table is not None:
            finders.append(find_table)
        for find in finders:
            item = find(schema, name)
            if item is not None:
                return str(item.id)
        return None

    def indexed_relations(self, schema: str, name: str) -> list[IndexedRelation]:
        """The live indexes on a relation (stale ones are forgotten here)."""
        indexes = self.catalog.on(schema, name)
        if not indexes:
            return []
        relation_id = self.relation_id(schema, name)
        live = []
        for index in indexes:
            if index.on_id != relation_id:
                self._forget(index)
                continue
            relation = self._relations.get(index.id)
            if relation is None:
                relation = self._describe(index)
            live.append(relation)
        return live

    def _describe(self, index: IndexDefinition) -> IndexedRelation:
        columns = describe_target(self.store, self.subscriptions.resolve(index.on_schema, index.on_name))
        names = [column.name for column in columns]
        missing = [column for column in index.columns if column not in names]
        if missing:
            raise UndefinedColumn(f'column "{missing[0]}" does not exist')
        relation = IndexedRelation(index.id, columns, tuple(names.index(column) for column in index.columns))
        self._relations[index.id] = relation
        return relation

    async def arrangement(self, index_id: str) -> Arrangement | None:
        """The index's arrangement, built on first use (after a restart); None if the index is gone."""
        arrangement = self.arrangements.get(index_id)
        if arrangement is not None:
            return arrangement
        index = next((i for i in self.catalog.all() if i.id == index_id), None)
        if index is None or index.on_id != self.relation_id(index.on_schema, index.on_name):
            return None
        relation = self._relations.get(index_id) or self._describe(index)
        target = self.subscriptions.resolve(index.on_schema, index.on_name)
        return await self.arrangements.ensure(index_id, lambda: self._arrangement(index, target, relation))

    def _arrangement(self, index: IndexDefinition, target: Any, relation: IndexedRelation) -> Arrangement:
        def alive() -> bool:
            return self.relation_id(index.on_schema, index.on_name) == index.on_id

        return Arrangement(self.store, self.executor, target, relation.columns, relation.key_positions, alive)

    def _forget(self, index: IndexDefinition) -> None:
        in_store = self._postgres_store()
        if in_store is not None:
            index_relation_postgres.drop(in_store, index.schema, index.on_name, index.name)
        self.catalog.remove(index.id)
        self.arrangements.drop(index.id)
        self._relations.pop(index.id, None)

    # ---- DDL -------------------------------------------------------------------------------------------
    async def execute(self, ast: exp.Expr, sql: str) -> ExecuteResponse:
        if isinstance(ast, ShowObjects):
            return self._show(ast)
        async with self._lock:
            if isinstance(ast, exp.Create):
                return await self._create(ast, sql)
            assert isinstance(ast, exp.Drop)
            return await asyncio.get_running_loop().run_in_executor(self.executor, self._drop, ast)

    async def _create(self, ast: exp.Create, sql: str) -> CommandComplete:
        index = ast.this
        table = index.args.get("table")
        params = index.args.get("params")
        if not isinstance(index, exp.Index) or not isinstance(table, exp.Table) or params is None:
            raise FeatureNotSupported("CREATE INDEX [name] ON <relation> (<column>, ...) is the supported form")
        if ast.args.get("unique"):
            raise FeatureNotSupported("CREATE UNIQUE INDEX is not supported", hint="indexes only speed up reads")
        on_schema, on_name = table.db or "public", table.name
        relation_id = self.relation_id(on_schema, on_name)
        if relation_id is None:
            raise UndefinedObject(f'relation "{on_name}" does not exist')
        columns: list[str] = []
        for ordered in params.args.get("columns") or []:
            column = ordered.this if isinstance(ordered, exp.Ordered) else ordered
            if not isinstance(column, exp.Column) or column.table:
                raise FeatureNotSupported("an index is keyed by columns of its relation, not by expressions",
                                          hint="create a materialized view with the expression as a column")
            columns.append(column.name if column.this.quoted else column.name.lower())
        if not columns:
            raise FeatureNotSupported("an index needs at least one column")
        name_node = index.this
        name = (name_node.name if name_node.quoted else name_node.name.lower()) if name_node is not None \
            else f"{on_name}_{'_'.join(columns)}_idx"
        schema = on_schema
        notice = self._name_taken(schema, name)
        if notice is not None:
            if ast.args.get("exists"):
                return CommandComplete("CREATE INDEX", (f'{notice}, skipping',))
            raise DuplicateObject(notice)
        definition = IndexDefinition(self.catalog.allocate_id(), name, schema, on_schema, on_name, relation_id,
                                     tuple(columns), sql)
        loop = asyncio.get_running_loop()
        relation = await loop.run_in_executor(self.executor, self._describe, definition)
        in_store = self._postgres_store()
        if in_store is not None:  # a PostgreSQL index too, where PostgreSQL can index the relation
            await loop.run_in_executor(self.executor, index_relation_postgres.create, in_store, on_schema, on_name,
                                       name, definition.columns)
        self.catalog.add(definition)
        try:
            target = self.subscriptions.resolve(on_schema, on_name)
            await self.arrangements.ensure(definition.id, lambda: self._arrangement(definition, target, relation))
        except BaseException:
            self._forget(definition)
            raise
        return CommandComplete("CREATE INDEX")

    def _postgres_store(self) -> PostgresServingStore | None:
        return self.store if isinstance(self.store, PostgresServingStore) else None

    def _name_taken(self, schema: str, name: str) -> str | None:
        if self.catalog.find(schema, name) is not None:
            return f'index "{name}" already exists'
        if self.relation_id(schema, name) is not None:
            return f'relation "{name}" already exists'
        return None

    def _drop(self, ast: exp.Drop) -> CommandComplete:
        notices = []
        for table in ast.args.get("tables") or []:
            index = self.catalog.find(table.db or "public", table.name)
            if index is None:
                if ast.args.get("exists"):
                    notices.append(f'index "{table.name}" does not exist, skipping')
                    continue
                raise HeadraceError(f'index "{table.name}" does not exist', sqlstate="42704")
            self._forget(index)
        return CommandComplete("DROP INDEX", tuple(notices))

    def _show(self, ast: ShowObjects) -> SendingRows:
        rows = []
        for index in self.catalog.all():
            if ast.args.get("schema") not in (None, index.schema):
                continue
            if index.on_id != self.relation_id(index.on_schema, index.on_name):
                continue
            rows.append((index.name, index.on_name, "default", "{" + ",".join(index.columns) + "}"))
        return SendingRows(SHOW_COLUMNS, rows, tag_verb="SHOW")

    def close(self) -> None:
        self.arrangements.close()
