"""What a sink reads: a source's, view's or table's rows and changes in the serving store, with a key.

A sink reads the same changelog SUBSCRIBE reads (coordinator/subscribe.py): `select_sql` is a SELECT in the serving
store's dialect (DuckDB's or PostgreSQL's: `store.dialect`) over `__hr_input` (hr_timestamp, hr_diff, the stored
columns) giving hr_timestamp, hr_diff, then the sink's columns: the relation's public columns, plus the key when the
public columns do not hold it. Keys:
  * a source: `log_offset`, the row's position in the source's log (a replacement under IDEMPOTENT deletes the
    replaced row's offset and stores the new one, exactly as in the serving store);
  * a view: its GROUP BY columns when every one is selected as a plain output column, else `hr_key` (the view's
    stored key: canonical JSON of the group values, or of the input row's key for a view without GROUP BY);
  * a table: its PRIMARY KEY, else its hidden `hr_row_id`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from headrace.catalog.catalog import Catalog
from headrace.catalog.tables import HIDDEN_ROW_ID
from headrace.errors import HeadraceError, UndefinedObject
from headrace.materialize.sources import source_binding
from headrace.sql.view_serving import INTERNAL_SCHEMA, public_relation_sql
from headrace.sql.views import KEY_FIELD
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ServingStore, changelog_table, quote_ident

SinkStore = ServingStore | PostgresServingStore  # a sink reads either serving store (its `dialect` says which)
INPUT = "__hr_input"
FIRST = "__hr_first"  # a keyed batch's consolidation: the diff of each key's first change in the range
FROM_KEY = "from_" if "from_" in exp.Select.arg_types else "from"  # renamed in newer sqlglot


@dataclass(frozen=True, slots=True)
class SinkInput:
    kind: str  # "source" | "view" | "table"
    relation: str  # schema.name, for messages
    resource_path: tuple[str, ...]  # the serving-store table (and its changelog)
    materialization: str  # whose commit timestamps are the relation's (ServingStore.latest_timestamp)
    select_sql: str  # over __hr_input -> hr_timestamp, hr_diff, the sink's columns
    key: tuple[str, ...]

    def columns(self, store: SinkStore) -> list[tuple[str, str]]:
        """The sink's columns (after hr_timestamp, hr_diff) with their canonical DuckDB type names, key columns
        first: as DuckDB describes the SELECT, or as PostgreSQL does (sink/postgres_reads.py maps its types)."""
        sql = f"WITH {INPUT} AS (SELECT * FROM {changelog_table(self.resource_path)} LIMIT 0) {self.select_sql}"
        if store.dialect == "postgres":
            from headrace.sink.postgres_reads import describe  # it imports this module

            assert isinstance(store, PostgresServingStore)
            columns = describe(store, sql)[2:]
        else:
            assert isinstance(store, ServingStore)
            with store.cursor() as cursor:
                description = cursor.execute(sql).description or []
            columns = [(str(name), str(type_name)) for name, type_name, *_ in description[2:]]
        keys = [column for column in columns if column[0] in self.key]
        return sorted(keys, key=lambda column: self.key.index(column[0])) + \
            [column for column in columns if column[0] not in self.key]


def resolve_input(catalog: Catalog, view_plan: Callable[[Any], Any], schema: str, name: str,
                  dialect: str) -> SinkInput:
    """The sink input for relation schema.name (UndefinedObject if there is none), its SELECT in `dialect` (the
    serving store's: "duckdb" or "postgres")."""
    relation = f"{schema}.{name}"
    source = catalog.find(schema, name)
    if source is not None:
        binding = source_binding(source)
        columns = ", ".join(quote_ident(column) for column in ("log_offset", *source.column_names()))
        return SinkInput("source", relation, binding.resource_path, source.materialization,
                         f"SELECT hr_timestamp, hr_diff, {columns} FROM {INPUT}", ("log_offset",))
    table = catalog.find_table(schema, name)
    if table is not None:
        names = [*([HIDDEN_ROW_ID] if table.has_hidden_key else []), *table.column_names()]
        columns = ", ".join(quote_ident(column) for column in names)
        return SinkInput("table", relation, (INTERNAL_SCHEMA, table.materialization), table.materialization,
                         f"SELECT hr_timestamp, hr_diff, {columns} FROM {INPUT}", table.store_key)
    view = catalog.find_view(schema, name)
    if view is not None:
        return _view_input(view_plan(view), view.id, relation, catalog.root_materialization(view), dialect)
    raise UndefinedObject(f"unknown source, materialized view or table '{relation}'")


def _view_input(plan: Any, view_id: str, relation: str, materialization: str, dialect: str) -> SinkInput:
    create = exp.maybe_parse(public_relation_sql(plan, view_id, dialect=dialect), dialect=dialect)
    select = create.expression
    if isinstance(select, exp.Union):  # a global aggregate's "no rows" branch shows only in snapshots
        select = select.this
    select = select.copy()
    select.set(FROM_KEY, exp.From(this=exp.to_table(INPUT)))
    key = _group_key_outputs(plan)
    head: list[exp.Expr] = [exp.column("hr_timestamp"), exp.column("hr_diff")]
    if key is None:
        head.append(exp.column(KEY_FIELD, quoted=True))
        key = (KEY_FIELD,)
        if any(output.name == KEY_FIELD for output in plan.outputs):
            raise HeadraceError(f"a sink of {relation} needs its key column {KEY_FIELD}, which an output shadows",
                                sqlstate="42701", hint="rename that output column")
    select.set("expressions", [*head, *select.expressions])
    return SinkInput("view", relation, (INTERNAL_SCHEMA, f"view_{view_id}"), materialization,
                     select.sql(dialect=dialect), key)


def _group_key_outputs(plan: Any) -> tuple[str, ...] | None:
    """The output names of the view's GROUP BY columns, if each is selected as it is (else None)."""
    if not plan.aggregating or not plan.group_keys:
        return None
    names: list[str] = []
    for index in range(len(plan.group_keys)):
        stored = f"k{index}"
        match = next((output.name for output in plan.outputs
                      if isinstance(output.expression, exp.Column) and output.expression.name == stored), None)
        if match is None:
            return None
        names.append(match)
    return tuple(names)
