"""What INSERT / UPDATE / DELETE compute before their changes are checked (coordinator/table_changes.py):
the rows an INSERT adds, the (old, new) pairs of an UPDATE, the rows a DELETE removes.

INSERT ... VALUES of constants and parameters (what drivers send: psycopg's executemany, asyncpg) is
evaluated here in Python, with each parameter typed as its target column (as PostgreSQL describes it).
Anything else (expressions in VALUES, INSERT ... SELECT, SET expressions, WHERE) is planned like a SELECT
(sql/select.py: names resolved, PostgreSQL functions translated) and run by the serving store; UPDATE and
DELETE read the table's current contents (store rows + unapplied log + this transaction) through a CTE of
the table's name (store/table_reads.select_current). Values are then converted to their column's type as
PostgreSQL's assignment would (store/table_log.to_document: 22P02, 22003, 22001)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlglot import exp

from headrace.catalog.items import DEFAULT_SCHEMA
from headrace.catalog.tables import Table, TableColumn
from headrace.errors import FeatureNotSupported, HeadraceError, SyntaxError_, UndefinedColumn
from headrace.sql import table_statements as grammar
from headrace.sql.select import SelectPlan, plan_select
from headrace.store.query import run_query, session_parameters
from headrace.store.serving import ServingStore
from headrace.store.table_log import Document, ValueError_, to_document
from headrace.store.table_reads import select_current

Key = tuple[Any, ...]
SET_PREFIX = "hr_set_"


def _parameter_number(node: exp.Expr) -> int | None:
    text = node.name if isinstance(node, exp.Placeholder) else \
        node.this.name if isinstance(node.this, exp.Expr) else str(node.this)
    text = str(text).lstrip("$")
    return int(text) if text.isdigit() else None


def _is_parameter(node: exp.Expr) -> bool:
    return isinstance(node, (exp.Parameter, exp.Placeholder)) and _parameter_number(node) is not None


def _is_default(node: exp.Expr) -> bool:
    if not isinstance(node, (exp.Var, exp.Column)) or node.name.upper() != "DEFAULT":
        return False
    return not (isinstance(node, exp.Column) and (isinstance(node.this, exp.Star) or node.this.args.get("quoted")))


def _is_simple(node: exp.Expr) -> bool:
    """A constant or a parameter, evaluated without the store."""
    if isinstance(node, exp.Cast):
        return _is_simple(node.this)
    if isinstance(node, exp.Neg):
        return isinstance(node.this, exp.Literal) and not node.this.is_string
    return isinstance(node, (exp.Literal, exp.Null, exp.Boolean)) or _is_parameter(node) or _is_default(node)


def _simple_value(node: exp.Expr, params: Sequence[Any]) -> Any:
    if isinstance(node, exp.Cast):
        return _simple_value(node.this, params)
    if isinstance(node, exp.Neg):
        return -_simple_value(node.this, params)
    if isinstance(node, exp.Null) or _is_default(node):
        return None
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text)
        except ValueError:
            try:
                return Decimal(text)
            except InvalidOperation:
                return float(text)
    number = _parameter_number(node)
    assert number is not None
    if number > len(params):
        raise HeadraceError(f"there is no parameter ${number}", sqlstate="42P02")
    return params[number - 1]


def _values_rows(ast: exp.Insert) -> list[list[exp.Expr]] | None:
    values = ast.args.get("expression")
    if not isinstance(values, exp.Values):
        return None
    return [list(row.expressions) if isinstance(row, exp.Tuple) else [row] for row in values.expressions]


class WriteComputer:
    def __init__(self, store: ServingStore, executor: ThreadPoolExecutor,
                 relation_exists: Callable[[str, str], bool]) -> None:
        self.store = store
        self.executor = executor
        self._relation_exists = relation_exists

    # ---- prepare ------------------------------------------------------------------------------------
    async def param_types(self, table: Table, ast: exp.Expr, declared: Sequence[int]) -> tuple[int, ...]:
        if isinstance(ast, exp.Insert):
            columns = [table.column(name) for name in grammar.insert_columns(ast, table)]
            rows = _values_rows(ast)
            if rows is not None and all(_is_simple(node) for row in rows for node in row):
                found: dict[int, int] = {}
                for row in rows:
                    for column, node in zip(columns, row):
                        if _is_parameter(node) and column is not None:
                            found.setdefault(_parameter_number(node) or 0, column.type_oid)
                count = max([*found, len(declared)], default=0)
                return tuple((declared[i - 1] if i <= len(declared) and declared[i - 1] else found.get(i, 25))
                             for i in range(1, count + 1))
            return self._insert_plan(table, ast, declared).param_types
        return self._filter_plan(table, ast, declared).param_types

    # ---- INSERT -------------------------------------------------------------------------------------
    async def insert_documents(self, table: Table, ast: exp.Insert, params: Sequence[Any],
                               session: Any) -> list[Document]:
        names = grammar.insert_columns(ast, table)
        columns = [table.column(name) for name in names]
        rows = _values_rows(ast)
        if rows is not None and all(_is_simple(node) for row in rows for node in row):
            values = [[_simple_value(node, params) for node in row] for row in rows]
        else:
            plan = self._insert_plan(table, ast, ())
            values = await self._run(self._query, plan, session_parameters(plan, params, session))
        documents = []
        for row in values:
            if len(row) > len(columns):
                raise SyntaxError_("INSERT has more expressions than target columns")
            if len(row) < len(columns) and rows is None:
                raise SyntaxError_("INSERT has more target columns than expressions")
            document: Document = {name: None for name in table.column_names()}
            for column, value in zip(columns, row):
                assert column is not None
                document[column.name] = _converted(column, value)
            documents.append(document)
        return documents

    def _insert_plan(self, table: Table, ast: exp.Insert, declared: Sequence[int]) -> SelectPlan:
        query = ast.args.get("expression")
        columns = [table.column(name) for name in grammar.insert_columns(ast, table)]
        if isinstance(query, exp.Values):
            selects = []
            for row in _values_rows(ast) or []:
                items = [_typed(node, column) if column is not None else node.copy()
                         for node, column in zip(row, [*columns, *([None] * len(row))])]
                items = [exp.Null() if _is_default(node) else node for node in items]
                selects.append(exp.Select(expressions=items))
            query = selects[0]
            for select in selects[1:]:
                query = exp.union(query, select, distinct=False)
        if not isinstance(query, (exp.Select, exp.Union, exp.Intersect, exp.Except)):
            raise FeatureNotSupported("INSERT takes VALUES or a query")
        return plan_select(query, self._relation_exists, declared)

    # ---- UPDATE / DELETE ----------------------------------------------------------------------------
    def _filter_plan(self, table: Table, ast: exp.Expr, declared: Sequence[int]) -> SelectPlan:
        """SELECT t.*[, SET expressions] FROM t [AS alias] WHERE ...: over a CTE named t (the current contents)."""
        target = ast.this.copy()
        assert isinstance(target, exp.Table)
        target.set("db", None)
        target.set("catalog", None)
        reference = target.alias or target.name
        projections: list[exp.Expr] = [exp.Column(this=exp.Star(), table=exp.to_identifier(reference, quoted=True))]
        if isinstance(ast, exp.Update):
            for index, (column, value) in enumerate(_set_list(ast, table)):
                projections.append(exp.alias_(_typed(value, column), f"{SET_PREFIX}{index}", quoted=True))
        select = exp.Select(expressions=projections).from_(target)
        where = ast.args.get("where")
        if where is not None:
            select.set("where", where.copy())

        def exists(schema: str, name: str) -> bool:
            return (schema, name) == (DEFAULT_SCHEMA, table.name) or self._relation_exists(schema, name)

        return plan_select(select, exists, declared)

    async def update_pairs(self, table: Table, ast: exp.Update, params: Sequence[Any], session: Any,
                           overlay: dict[Key, Document | None]) -> list[tuple[Document, Document]]:
        assignments = _set_list(ast, table)
        plan = self._filter_plan(table, ast, ())
        found = await self._run(select_current, self.store, table, overlay, plan.duckdb_sql,
                                session_parameters(plan, params, session), len(assignments))
        pairs = []
        for old, extras in found:
            new = dict(old)
            for (column, _), value in zip(assignments, extras):
                new[column.name] = _converted(column, value)
            pairs.append((old, new))
        return pairs

    async def delete_rows(self, table: Table, ast: exp.Delete, params: Sequence[Any], session: Any,
                          overlay: dict[Key, Document | None]) -> list[Document]:
        plan = self._filter_plan(table, ast, ())
        found = await self._run(select_current, self.store, table, overlay, plan.duckdb_sql,
                                session_parameters(plan, params, session), 0)
        return [old for old, _ in found]

    # ---- plumbing -----------------------------------------------------------------------------------
    def _query(self, plan: SelectPlan, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self.store.cursor() as cursor:
            _, rows = run_query(cursor, plan, params)
        return rows

    async def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)


def _set_list(ast: exp.Update, table: Table) -> list[tuple[TableColumn, exp.Expr]]:
    assignments = []
    seen = set()
    for node in ast.expressions:
        if not isinstance(node, exp.EQ) or not isinstance(node.this, exp.Column):
            raise FeatureNotSupported("UPDATE ... SET takes column = expression")
        column = table.column(node.this.name)
        if column is None:
            raise UndefinedColumn(f'column "{node.this.name}" of relation "{table.name}" does not exist')
        if column.name in seen:
            raise SyntaxError_(f'multiple assignments to same column "{column.name}"', sqlstate="42601")
        seen.add(column.name)
        value = node.expression
        assignments.append((column, exp.Null() if _is_default(value) else value))
    return assignments


def _typed(node: exp.Expr, column: TableColumn) -> exp.Expr:
    """A bare parameter takes its column's type (PostgreSQL describes it so; binary clients rely on it)."""
    if _is_parameter(node):
        return exp.Cast(this=node.copy(), to=exp.DataType.build(column.pg_type, dialect="postgres"))
    return node.copy()


def _converted(column: TableColumn, value: Any) -> Any:
    try:
        return to_document(column.pg_type, value, column.max_length)
    except ValueError_ as error:
        raise HeadraceError(error.message, sqlstate=error.sqlstate) from None
