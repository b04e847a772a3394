"""What INSERT / UPDATE / DELETE compute before their changes are checked (coordinator/table_changes.py):
the rows an INSERT adds, the (old, new) pairs of an UPDATE, the rows a DELETE removes.

INSERT ... VALUES of constants and parameters (what drivers send: psycopg's executemany, asyncpg) is
evaluated here in Python, with each parameter typed as its target column (as PostgreSQL describes it).
Anything else (expressions in VALUES, INSERT ... SELECT, SET expressions, WHERE) runs in the serving store;
UPDATE and DELETE read the table's current contents (store rows + unapplied log + this transaction) through a
CTE of the table's name. On DuckDB it is planned like a SELECT (sql/select.py: names resolved, PostgreSQL
functions translated; store/table_reads.select_current) and values are converted to their column's type as
PostgreSQL's assignment would (store/table_log.to_document: 22P02, 22003, 22001). On PostgreSQL the statement's
own SQL runs there, values assigned by PostgreSQL itself (coordinator/table_writes_postgres.py)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlglot import exp

from headrace.catalog.items import DEFAULT_SCHEMA
from headrace.catalog.tables import Table, TableColumn
from headrace.coordinator import table_upserts as upserts
from headrace.coordinator import table_writes_postgres as on_postgres
from headrace.coordinator.table_defaults import default_ast, default_document
from headrace.errors import FeatureNotSupported, HeadraceError, SyntaxError_, UndefinedColumn
from headrace.sql import table_statements as grammar
from headrace.sql.select import SelectPlan, plan_select
from headrace.store.query import run_query, session_parameters
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ServingStore
from headrace.store.table_log import Document, ValueError_, to_document
from headrace.store.table_reads import Store, select_current, select_over_pairs

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


_INTEGER_TYPES = frozenset({"int2", "int4", "int8"})


def _python_assigns(rows: list[list[exp.Expr]], columns: Sequence[TableColumn | None]) -> bool:
    """Whether Python assigns these VALUES exactly as PostgreSQL would: parameters (typed as their columns),
    NULL, DEFAULT, text literals into text columns, integers into integer columns, booleans into bool. Anything
    else (a string literal into a timestamp, a float, a varchar(n), ...) is PostgreSQL's to read on the PostgreSQL
    serving store: 'now', 'epoch', 'Feb 10 17:32:01 1997 PST', 'infinity', '10e400' for a real ..."""
    for row in rows:
        for node, column in zip(row, columns):
            if _is_parameter(node) or _is_default(node) or isinstance(node, exp.Null) or column is None:
                continue
            if isinstance(node, exp.Boolean) and column.pg_type == "bool":
                continue
            if isinstance(node, exp.Literal) and node.is_string and column.pg_type == "text":
                continue
            number = node.this if isinstance(node, exp.Neg) else node
            if isinstance(number, exp.Literal) and not number.is_string and number.this.isdigit() \
                    and column.pg_type in _INTEGER_TYPES:
                continue
            return False
    return True


def _values_rows(ast: exp.Insert) -> list[list[exp.Expr]] | None:
    values = ast.args.get("expression")
    if not isinstance(values, exp.Values):
        return None
    return [list(row.expressions) if isinstance(row, exp.Tuple) else [row] for row in values.expressions]


class WriteComputer:
    def __init__(self, store: Store, executor: ThreadPoolExecutor,
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
                upsert = upserts.conflict_clause(ast, table)
                for column, node in upsert.assignments if upsert is not None else ():
                    if _is_parameter(node):  # ON CONFLICT ... SET col = $n
                        found.setdefault(_parameter_number(node) or 0, column.type_oid)
                numbers = [_parameter_number(n) or 0 for n in ast.find_all(exp.Placeholder, exp.Parameter)
                           if _is_parameter(n)]
                count = max([*found, *numbers, len(declared)], default=0)
                return tuple((declared[i - 1] if i <= len(declared) and declared[i - 1] else found.get(i, 25))
                             for i in range(1, count + 1))
            if isinstance(self.store, PostgresServingStore):  # PostgreSQL types the statement's own query
                return await self._run(on_postgres.describe_insert, self.store, table, ast,
                                       [c for c in columns if c is not None], declared)
            return self._insert_plan(table, ast, declared).param_types
        if isinstance(self.store, PostgresServingStore):
            assignments = [column for column, _ in _set_list(ast, table)] if isinstance(ast, exp.Update) else []
            return await self._run(on_postgres.describe_filter, self.store, table, _filter_select(table, ast),
                                   assignments, declared)
        return self._filter_plan(table, ast, declared).param_types

    # ---- INSERT -------------------------------------------------------------------------------------
    async def insert_documents(self, table: Table, ast: exp.Insert, params: Sequence[Any], session: Any,
                               overlay: dict[Key, Document | None] | None = None) -> list[Document]:
        names = grammar.insert_columns(ast, table)
        columns = [table.column(name) for name in names]
        rows = _values_rows(ast)
        _check_width(ast, rows, len(columns))
        now = datetime.datetime.now(datetime.timezone.utc)
        on_store = isinstance(self.store, PostgresServingStore)
        if rows is not None and all(_is_simple(node) for row in rows for node in row) \
                and not (on_store and not _python_assigns(rows, columns)):
            values = [[_DEFAULT if _is_default(node) else _simple_value(node, params) for node in row]
                      for row in rows]
        elif on_store:
            values = await self._run(on_postgres.insert_values, self.store, table, ast,
                                     [c for c in columns if c is not None], params, session, overlay)
        else:
            plan = self._insert_plan(table, ast, ())
            values = await self._run(self._query, plan, session_parameters(plan, params, session))
        documents = []
        for row in values:
            if len(row) > len(columns):
                raise SyntaxError_("INSERT has more expressions than target columns")
            if len(row) < len(columns) and rows is None:
                raise SyntaxError_("INSERT has more target columns than expressions")
            document = defaults_document(table, now)
            for column, value in zip(columns, row):
                assert column is not None
                document[column.name] = default_document(column, now) if value is _DEFAULT \
                    else _converted(column, value)
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
                items = [_default_node(column) if _is_default(node) else node
                         for node, column in zip(items, [*columns, *([None] * len(items))])]
                selects.append(exp.Select(expressions=items))
            query = selects[0]
            for select in selects[1:]:
                query = exp.union(query, select, distinct=False)
        if not isinstance(query, (exp.Select, exp.Union, exp.Intersect, exp.Except)):
            raise FeatureNotSupported("INSERT takes VALUES or a query")
        return plan_select(query, self._relation_exists, declared)

    # ---- UPDATE / DELETE ----------------------------------------------------------------------------
    def _filter_plan(self, table: Table, ast: exp.Expr, declared: Sequence[int]) -> SelectPlan:
        def exists(schema: str, name: str) -> bool:
            return (schema, name) == (DEFAULT_SCHEMA, table.name) or self._relation_exists(schema, name)

        return plan_select(_filter_select(table, ast), exists, declared)

    async def update_pairs(self, table: Table, ast: exp.Update, params: Sequence[Any], session: Any,
                           overlay: dict[Key, Document | None]) -> list[tuple[Document, Document]]:
        assignments = _set_list(ast, table)
        if isinstance(self.store, PostgresServingStore):
            found = await self._run(on_postgres.current_rows, self.store, table, _filter_select(table, ast),
                                    [column for column, _ in assignments], overlay, params, session)
            return [(old, {**old, **{column.name: _converted(column, value)
                                     for (column, _), value in zip(assignments, values)}})
                    for old, values in zip(_documents(table, [row for row, _ in found]), (v for _, v in found))]
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
        if isinstance(self.store, PostgresServingStore):
            found = await self._run(on_postgres.current_rows, self.store, table, _filter_select(table, ast), [],
                                    overlay, params, session)
            return _documents(table, [row for row, _ in found])
        plan = self._filter_plan(table, ast, ())
        found = await self._run(select_current, self.store, table, overlay, plan.duckdb_sql,
                                session_parameters(plan, params, session), 0)
        return [old for old, _ in found]

    # ---- INSERT ... ON CONFLICT DO UPDATE ------------------------------------------------------------
    async def upsert_pairs(self, table: Table, ast: exp.Insert, upsert: upserts.Upsert,
                           conflicts: list[tuple[Document, Document]], params: Sequence[Any],
                           session: Any) -> list[tuple[Document, Document] | None]:
        """Per conflict (existing row, proposed row): (existing, updated) or None when the WHERE rejects it."""
        if not conflicts:
            return []
        select = upserts.update_select(table, ast, upsert, _typed)
        results: list[tuple[Document, Document] | None] = [None] * len(conflicts)
        if isinstance(self.store, PostgresServingStore):
            accepted = await self._run(on_postgres.upsert_rows, self.store, table, select, upsert, conflicts,
                                       params, session)
            for index, values in accepted:
                old = conflicts[index][0]
                results[index] = (old, {**old, **{column.name: _converted(column, value)
                                                  for (column, _), value in zip(upsert.assignments, values)}})
            return results

        def exists(schema: str, name: str) -> bool:
            return (schema, name) == (DEFAULT_SCHEMA, table.name) or self._relation_exists(schema, name)

        plan = plan_select(select, exists, ())
        rows = await self._run(select_over_pairs, self.store, table, conflicts, plan.duckdb_sql,
                               session_parameters(plan, params[:len(plan.param_types)], session),
                               upserts.EXCLUDED_PREFIX, upserts.ROW_INDEX)
        count = len(upsert.assignments)
        for row in rows:
            index = row[-1]
            if upsert.where is not None and row[count] is not True:
                continue
            old = conflicts[index][0]
            new = dict(old)
            for (column, _), value in zip(upsert.assignments, row[:count]):
                new[column.name] = _converted(column, value)
            results[index] = (old, new)
        return results

    # ---- plumbing -----------------------------------------------------------------------------------
    def _query(self, plan: SelectPlan, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        assert isinstance(self.store, ServingStore)
        with self.store.cursor() as cursor:
            _, rows = run_query(cursor, plan, params)
        return rows

    async def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)


def _check_width(ast: exp.Insert, rows: list[list[exp.Expr]] | None, width: int) -> None:
    """With a column list, a VALUES row or a SELECT giving fewer values is PostgreSQL's 42601 (without one, the
    columns left out take their DEFAULT)."""
    if not (isinstance(ast.this, exp.Schema) and ast.this.expressions):
        return
    query = ast.args.get("expression")
    if rows is not None:
        short = any(len(row) < width for row in rows)
    elif isinstance(query, exp.Select) and not any(isinstance(s, exp.Star) or isinstance(s, exp.Column)
                                                   and isinstance(s.this, exp.Star) for s in query.selects):
        short = len(query.selects) < width
    else:
        short = False
    if short:
        raise SyntaxError_("INSERT has more target columns than expressions")


def _filter_select(table: Table, ast: exp.Expr) -> exp.Select:
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
    joined = grammar.other_relations(ast)
    for relation in joined:  # UPDATE ... FROM / DELETE ... USING (PostgreSQL serving store only)
        select.append("joins", exp.Join(this=relation))
    if joined:  # a row several joined rows match is changed once, as PostgreSQL changes it
        select.set("distinct", exp.Distinct(on=exp.Tuple(expressions=[
            exp.column(name, table=reference, quoted=True) for name in table.store_key])))
    where = ast.args.get("where")
    if where is not None:
        where = where.copy()
        _type_compared_parameters(where, table)
        select.set("where", where)
    return select


def _documents(table: Table, rows: list[tuple[Any, ...]]) -> list[Document]:
    """Rows of the table's stored columns (PostgreSQL's values) as row documents."""
    from headrace.store.table_log import from_store

    types = table.store_columns()
    return [{name: from_store(store_type, value) for (name, store_type), value in zip(types.items(), row)}
            for row in rows]


def _set_list(ast: exp.Update, table: Table) -> list[tuple[TableColumn, exp.Expr]]:
    assignments = []
    seen = set()
    for target, value in grammar.assignments(ast.expressions, "UPDATE ... SET"):
        column = table.column(target.name)
        if column is None:
            raise UndefinedColumn(f'column "{target.name}" of relation "{table.name}" does not exist')
        if column.name in seen:
            raise SyntaxError_(f'multiple assignments to same column "{column.name}"', sqlstate="42601")
        seen.add(column.name)
        assignments.append((column, _default_node(column) if _is_default(value) else value))
    return assignments


_DEFAULT = object()  # the DEFAULT keyword in a VALUES row
_COMPARISONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.Is)


def _type_compared_parameters(where: exp.Expr, table: Table) -> None:
    """`col = $1`, `col < $1`, `col IN ($1, ...)`: the parameter takes the column's type, as PostgreSQL infers it
    (asyncpg then sends a uuid / date / numeric value, not text)."""
    for node in list(where.find_all(exp.Placeholder, exp.Parameter)):
        if not _is_parameter(node):
            continue
        parent = node.parent
        others: list[exp.Expr] = []
        if isinstance(parent, _COMPARISONS):
            others = [parent.left if parent.right is node else parent.right]
        elif isinstance(parent, exp.In) and node is not parent.this:
            others = [parent.this]
        column = next((table.column(o.name) for o in others if isinstance(o, exp.Column)), None)
        if column is not None:
            node.replace(_typed(node, column))


def defaults_document(table: Table, now: datetime.datetime) -> Document:
    """A new row before its listed columns are set: each column's DEFAULT (NULL without one)."""
    return {column.name: default_document(column, now) for column in table.columns}


def _default_node(column: TableColumn | None) -> exp.Expr:
    """DEFAULT in a planned statement: the column's default expression (now(), a constant, ...) or NULL, a NULL
    typed as the column (an untyped NULL in a sub-select is text, which PostgreSQL will not assign to an integer)."""
    node = default_ast(column) if column is not None else None
    if node is not None:
        return node
    return exp.Null() if column is None else exp.Cast(this=exp.Null(), to=exp.DataType.build(column.pg_type,
                                                                                               dialect="postgres"))


def _typed(node: exp.Expr, column: TableColumn) -> exp.Expr:
    """A bare parameter takes its column's type (PostgreSQL describes it so; binary clients rely on it)."""
    if _is_parameter(node):
        return exp.Cast(this=node.copy(), to=exp.DataType.build(column.pg_type, dialect="postgres"))
    return node.copy()


def column_document(column: TableColumn, value: Any) -> Any:
    """A value as the document form of `column` (ValueError_ when it does not fit)."""
    return to_document(column.pg_type, value, column.max_length, column.precision, column.scale)


def _converted(column: TableColumn, value: Any) -> Any:
    try:
        return column_document(column, value)
    except ValueError_ as error:
        raise HeadraceError(error.message, sqlstate=error.sqlstate, detail=error.detail) from None
