"""The queries of INSERT / UPDATE / DELETE / ON CONFLICT DO UPDATE on the PostgreSQL serving store: generated
from the statement's own AST in PostgreSQL's dialect (not sql/select.py's DuckDB translation) and run BY
PostgreSQL (store/table_reads_postgres.py: as a role that is no superuser, values assigned to their columns
by PostgreSQL's own assignment), so `UPDATE t SET x = x / 2 WHERE y ~ 'a'` gets PostgreSQL's answer and its
errors (22012, 22003, 22001, ...). Blocking: run in the executor.

  * INSERT ... VALUES with expressions / INSERT ... SELECT: `INSERT INTO <temporary table of the target columns'
    declared types> <the statement's VALUES or query> RETURNING *` (PostgreSQL's coercion of VALUES rows to
    their target columns, DEFAULT replaced by the column's default expression);
  * UPDATE / DELETE: `SELECT t.*, <SET expressions> FROM t [AS alias] WHERE ...` under `WITH t AS (<the
    table's current contents>)`: the store's rows with the overlay of acknowledged, unapplied rows (and the
    transaction's own) laid over them, as store/table_reads.select_current does on DuckDB;
  * ON CONFLICT DO UPDATE: the SET expressions over a relation of the table's name holding each conflict's
    existing row and its proposed row (EXCLUDED.col), the WHERE applied before SET is evaluated, as in
    PostgreSQL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlglot import exp

from headrace.catalog.tables import Table, TableColumn
from headrace.coordinator import table_upserts as upserts
from headrace.errors import HeadraceError
from headrace.store import table_reads_postgres as on_postgres
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import quote_ident

Key = tuple[Any, ...]
Document = dict[str, Any]
DIALECT = "postgres"
_SESSION_SETTINGS = {"timezone": "TimeZone", "statement_timeout": "statement_timeout"}


def session_settings(session: Any) -> dict[str, str]:
    """The session's settings a write's query depends on (TimeZone for casts of timestamptz, DateStyle's field
    order for reading dates, its statement_timeout), to be SET LOCAL for it."""
    variables: Mapping[str, str] = getattr(session, "variables", None) or {}
    settings = {setting: str(variables[name]) for name, setting in _SESSION_SETTINGS.items() if name in variables}
    datestyle = str(variables.get("datestyle") or "")
    order = datestyle.rsplit(",", 1)[-1].strip().upper()
    if order in ("MDY", "DMY", "YMD"):
        # the session's field order reads '02-10-1997' as PostgreSQL would for it; the output stays ISO, which is
        # what the values are read back in
        settings["DateStyle"] = f"ISO, {order}"
    return settings


def _parameter_number(node: exp.Expr) -> int | None:
    text = (node.name if isinstance(node, exp.Placeholder) else
            node.this.name if isinstance(node.this, exp.Expr) else str(node.this)).lstrip("$")
    return int(text) if text.isdigit() else None


def compact_parameters(node: exp.Expr, params: Sequence[Any]) -> tuple[exp.Expr, list[Any]]:
    """The query (a copy) with the client parameters it names renumbered $1..$m, and their values: PostgreSQL
    cannot type a parameter a query does not use (42P18), and headrace's own parameters follow the client's. A
    parameter named but not given is PostgreSQL's 42P02."""
    node = node.copy()
    numbers: dict[int, int] = {}
    for found in list(node.find_all(exp.Placeholder, exp.Parameter)):
        number = _parameter_number(found)
        if number is None:
            continue
        if number > len(params):
            raise HeadraceError(f"there is no parameter ${number}", sqlstate="42P02")
        position = numbers.setdefault(number, len(numbers) + 1)
        found.replace(exp.Parameter(this=exp.Literal.number(position)))
    return node, [params[number - 1] for number in sorted(numbers, key=numbers.__getitem__)]


def _reads_table(query: exp.Expr, table: Table) -> bool:
    return any(node.name == table.name and node.db in ("", table.schema) for node in query.find_all(exp.Table))


def _insert_query(ast: exp.Insert) -> exp.Expr:
    """The INSERT's VALUES or query (DEFAULT items stay: the temporary table has the columns' DEFAULTs)."""
    query = ast.args.get("expression")
    assert isinstance(query, exp.Expr)
    return query


def _own_contents(table: Table, query: exp.Expr, overlay: Mapping[Key, Document | None] | None,
                  first_parameter: int) -> tuple[str, list[list[str | None]]]:
    """WITH <table> AS (its current contents, declared columns), when the query reads the table it writes."""
    if not _reads_table(query, table):
        return "", []
    contents, extra = on_postgres.current_contents(table, overlay or {}, on_postgres.storage_name(table),
                                                   first_parameter)
    return f"WITH {quote_ident(table.name)} AS ({on_postgres.declared_columns(table, contents, False)})", extra


def insert_values(store: PostgresServingStore, table: Table, ast: exp.Insert, columns: list[TableColumn],
                  params: Sequence[Any], session: Any,
                  overlay: Mapping[Key, Document | None] | None = None) -> list[tuple[Any, ...]]:
    """The rows an INSERT with expressions (or a query) adds, as PostgreSQL assigns them to `columns` (the target
    columns: those listed, or all, the ones a row leaves out taking their DEFAULT): a value per column per row. A
    query reading the table itself reads its current contents (store, overlay, this transaction)."""
    query, values = compact_parameters(_insert_query(ast), params)
    with_clause, extra = _own_contents(table, query, overlay, len(values) + 1)
    return on_postgres.run_insert_query(store, query.sql(dialect=DIALECT), [*values, *extra], columns,
                                        session_settings(session), with_clause)


def describe_insert(store: PostgresServingStore, table: Table, ast: exp.Insert, columns: list[TableColumn],
                    declared: Sequence[int]) -> tuple[int, ...]:
    query = _insert_query(ast)
    with_clause, _ = _own_contents(table, query, None, 1)
    sql = on_postgres.insert_sql(query.sql(dialect=DIALECT), columns, with_clause)
    return on_postgres.describe_parameters(store, sql, declared, columns, inserting=True)


def _contents_clause(table: Table, overlay: Mapping[Key, Document | None], first_parameter: int
                     ) -> tuple[str, list[list[str | None]]]:
    contents, extra = on_postgres.current_contents(table, overlay, on_postgres.storage_name(table), first_parameter)
    return f"WITH {quote_ident(table.name)} AS ({on_postgres.declared_columns(table, contents, True)})", extra


def typed_assignments(select: exp.Select, assignments: Sequence[TableColumn]) -> exp.Select:
    """`select` with each SET value that has no type of its own (a quoted literal, NULL, a bare parameter) cast to
    its column's type, as PostgreSQL types it when it assigns it: in the SELECT that computes it, it would
    otherwise become text (`SET d = '2024-02-29'` into a date column: 42804)."""
    names = {f"hr_set_{i}": column for i, column in enumerate(assignments)}
    select = select.copy()
    for projection in select.expressions:
        column = names.get(projection.alias_or_name)
        if column is None or not isinstance(projection, exp.Alias):
            continue
        value = projection.this
        untyped = (isinstance(value, exp.Literal) and value.is_string) or isinstance(
            value, (exp.Null, exp.Placeholder, exp.Parameter))
        if untyped and column.pg_type != "bpchar":
            projection.set("this", exp.Cast(this=value.copy(), to=exp.DataType.build(column.type_sql,
                                                                                      dialect=DIALECT)))
    return select


def current_rows(store: PostgresServingStore, table: Table, select: exp.Select,
                 assignments: Sequence[TableColumn], overlay: Mapping[Key, Document | None],
                 params: Sequence[Any], session: Any) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """UPDATE / DELETE: `select` (SELECT t.*[, SET expressions AS hr_set_<i>] FROM t WHERE ...) over the table's
    current contents. Per row: (its stored columns, the SET values as PostgreSQL assigns them)."""
    query, values = compact_parameters(typed_assignments(select, assignments), params)
    with_clause, extra = _contents_clause(table, overlay, len(values) + 1)
    assigned = [(column, f"hr_set_{i}") for i, column in enumerate(assignments)]
    rows = on_postgres.run_assigning_query(store, query.sql(dialect=DIALECT), [*values, *extra], assigned,
                                           session_settings(session), with_clause)
    count = len(table.store_columns())
    return [(row[:count], found) for row, found in rows]


def describe_filter(store: PostgresServingStore, table: Table, select: exp.Select,
                    assignments: Sequence[TableColumn], declared: Sequence[int]) -> tuple[int, ...]:
    with_clause, _ = _contents_clause(table, {}, 1)
    assigned = [(column, f"hr_set_{i}") for i, column in enumerate(assignments)]
    sql = on_postgres.assigning_sql(typed_assignments(select, assignments).sql(dialect=DIALECT), assigned,
                                    with_clause)
    return on_postgres.describe_parameters(store, sql, declared, list(assignments) if assignments else None)


def upsert_rows(store: PostgresServingStore, table: Table, select: exp.Select, upsert: upserts.Upsert,
                conflicts: Sequence[tuple[Document, Document]], params: Sequence[Any],
                session: Any) -> list[tuple[Any, tuple[Any, ...]]]:
    """ON CONFLICT DO UPDATE: `select` (table_upserts.update_select) over the conflicts. Per conflict the WHERE
    accepts: (its index, the SET values as PostgreSQL assigns them)."""
    select = select.copy()
    for projection in list(select.expressions):
        if projection.alias_or_name == upserts.WHERE_COLUMN:  # filter first: SET is evaluated only where it holds
            condition = projection.this if isinstance(projection, exp.Alias) else projection
            projection.pop()
            select = select.where(condition.copy())
    select = typed_assignments(select, [column for column, _ in upsert.assignments])
    query, values = compact_parameters(select, params)
    names = list(table.store_columns())
    storage = on_postgres.storage_types(table)
    excluded = {f"{upserts.EXCLUDED_PREFIX}{name}": storage[name] for name in names}
    rows = [[*(old.get(c) for c in names), *(new.get(c) for c in names), index]
            for index, (old, new) in enumerate(conflicts)]
    relation, extra = on_postgres.rows_relation(table, [*names, *excluded, upserts.ROW_INDEX], rows,
                                                len(values) + 1, {**excluded, upserts.ROW_INDEX: "bigint"})
    typed = []  # the existing and the proposed (EXCLUDED) row, each column of its declared type
    for name in names:
        column = table.column(name)
        for prefix in ("", upserts.EXCLUDED_PREFIX):
            quoted = quote_ident(f"{prefix}{name}")
            typed.append(f"r.{quoted}" if column is None or column.pg_type == "bpchar"
                         else f"CAST(r.{quoted} AS {column.type_sql}) AS {quoted}")
    typed.append(f"r.{quote_ident(upserts.ROW_INDEX)}")
    with_clause = f"WITH {quote_ident(table.name)} AS (SELECT {', '.join(typed)} FROM ({relation}) AS r)"
    assigned = [(column, f"hr_set_{i}") for i, (column, _) in enumerate(upsert.assignments)]
    found = on_postgres.run_assigning_query(store, query.sql(dialect=DIALECT), [*values, *extra],
                                            assigned, session_settings(session), with_clause)
    return [(row[-1], assigned_values) for row, assigned_values in found]
