"""How a view lives in the serving store: its binding (one table keyed by hr_key) and its public relation.

Table headrace_internal."view_<id>": hr_key VARCHAR (canonical JSON of the key values: NULL group keys are
keys too), then ViewPlan.stored_fields: k*/a*/hr_state (aggregating) or o* (non-aggregating). The public
relation public."<name>" is a DuckDB view over it computing the SELECT list (and HAVING) from k*/a*, casting
stored types back to the view's column types; a global aggregate (no GROUP BY) shows its empty-input row
(count 0, other aggregates NULL) while the table is empty, as PostgreSQL's aggregate over no rows does."""

from __future__ import annotations

import json

from sqlglot import exp

from headrace.materialize.protocol import Binding, MaterializationSpec
from headrace.sql.view_scalars import type_of
from headrace.sql.views import KEY_FIELD, ViewPlan

INTERNAL_SCHEMA = "headrace_internal"
VIEW_SCHEMAS_TABLE = f"{INTERNAL_SCHEMA}.view_schemas"
VIEW_SCHEMAS_DDL = (f"CREATE TABLE IF NOT EXISTS {VIEW_SCHEMAS_TABLE} (id VARCHAR PRIMARY KEY, schema VARCHAR, "
                    "name VARCHAR, input VARCHAR, aggregating BOOLEAN, append_only BOOLEAN, "
                    "stored_fields VARCHAR, reduce_schema JSON)")

# PostgreSQL type -> the serving store's column type (the driver's supported set).
_STORED = {"int2": "INTEGER", "int4": "INTEGER", "int8": "BIGINT", "float4": "DOUBLE", "float8": "DOUBLE",
           "numeric": "DOUBLE", "text": "VARCHAR", "varchar": "VARCHAR", "bool": "BOOLEAN", "jsonb": "JSON",
           "json": "JSON", "timestamptz": "TIMESTAMPTZ",
           "date": "DATE", "timestamp": "TIMESTAMP", "uuid": "UUID", "interval": "INTERVAL"}  # tables' types
# PostgreSQL type -> DuckDB type of the public column where it differs from the stored one.
_PUBLIC = {"int2": "SMALLINT", "float4": "FLOAT"}
_ELEMENT = {"int2": "SMALLINT", "int4": "INTEGER", "int8": "BIGINT", "float4": "FLOAT", "float8": "DOUBLE",
            "numeric": "DOUBLE", "text": "VARCHAR", "varchar": "VARCHAR", "bool": "BOOLEAN", "jsonb": "JSON",
            "json": "JSON"}
_EMPTY_ZERO = ("count_star", "count", "count_distinct")


def stored_type(pg_type: str) -> str:
    return "JSON" if pg_type.endswith("[]") else _STORED[pg_type]


def public_type(pg_type: str) -> str | None:
    """The DuckDB type to cast a stored column to in the public relation, or None (as stored)."""
    if pg_type.endswith("[]"):
        return f"{_ELEMENT[pg_type[:-2]]}[]"
    return _PUBLIC.get(pg_type)


def view_binding(plan: ViewPlan, view_id: str) -> Binding:
    types = plan.stored_types()
    column_types = {KEY_FIELD: "VARCHAR", **{name: stored_type(types[name]) for name in plan.stored_fields}}
    return Binding(resource_path=(INTERNAL_SCHEMA, f"view_{view_id}"), key=(KEY_FIELD,),
                   values=plan.stored_fields, column_types=column_types)


def view_materialization(plan: ViewPlan, view_id: str) -> MaterializationSpec:
    return MaterializationSpec(name=f"view_{view_id}", bindings=(view_binding(plan, view_id),))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _stored_reference(name: str, pg_type: str) -> exp.Expr:
    column = exp.column(name, quoted=True)
    target = public_type(pg_type)
    return exp.cast(column, exp.DataType.build(target, dialect="duckdb")) if target else column


def _over_stored(plan: ViewPlan, expression: exp.Expr, empty: bool = False) -> exp.Expr:
    """An output expression over k*/a* as DuckDB SQL: stored columns cast back, integer division kept
    integral; with `empty`, each aggregate replaced by its value over no input rows."""
    types = plan.stored_types()
    functions = {a.field: a.function for a in plan.aggregates}
    expression = expression.copy()
    for division in list(expression.find_all(exp.Div)):
        if type_of(division.this, types) in ("int2", "int4", "int8") and \
                type_of(division.expression, types) in ("int2", "int4", "int8"):
            integral = exp.Cast(this=exp.IntDiv(this=division.this.copy(), expression=division.expression.copy()),
                                to=exp.DataType.build("BIGINT"))
            if division is expression:
                expression = integral
            else:
                division.replace(integral)

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.name in types:
            if empty:
                if functions.get(node.name) in _EMPTY_ZERO:
                    return exp.Literal.number(0)
                return exp.cast(exp.null(), exp.DataType.build(public_type(types[node.name]) or stored_type(types[node.name]),
                                                               dialect="duckdb"))
            return _stored_reference(node.name, types[node.name])
        return node

    return expression.transform(replace, copy=False)


def public_relation_sql(plan: ViewPlan, view_id: str) -> str:
    """CREATE OR REPLACE VIEW public."<name>" over the view's table (idempotent)."""
    table = f"{INTERNAL_SCHEMA}.{_quote(f'view_{view_id}')}"
    if not plan.aggregating:
        types = plan.stored_types()
        items = [f"{_stored_reference(f'o{i}', types[f'o{i}']).sql(dialect='duckdb')} AS {_quote(o.name)}"
                 for i, o in enumerate(plan.outputs)]
        return f"CREATE OR REPLACE VIEW {plan.schema}.{_quote(plan.name)} AS SELECT {', '.join(items)} FROM {table}"
    items = [f"{_over_stored(plan, o.expression).sql(dialect='duckdb')} AS {_quote(o.name)}" for o in plan.outputs]
    having = f" WHERE {_over_stored(plan, plan.having).sql(dialect='duckdb')}" if plan.having is not None else ""
    select = f"SELECT {', '.join(items)} FROM {table}{having}"
    if not plan.group_keys:
        empty_items = [f"{_over_stored(plan, o.expression, empty=True).sql(dialect='duckdb')} AS {_quote(o.name)}"
                       for o in plan.outputs]
        empty_having = f" AND ({_over_stored(plan, plan.having, empty=True).sql(dialect='duckdb')})" if plan.having is not None else ""
        select += f" UNION ALL SELECT {', '.join(empty_items)} WHERE NOT EXISTS (SELECT 1 FROM {table}){empty_having}"
    return f"CREATE OR REPLACE VIEW {plan.schema}.{_quote(plan.name)} AS {select}"


def view_schema_row(plan: ViewPlan, view_id: str) -> tuple[str, str, str, str, bool, bool, str, str]:
    """The row of headrace_internal.view_schemas describing a view's generated schema."""
    return (view_id, plan.schema, plan.name, f"{plan.input.kind} {plan.input.name}", plan.aggregating,
            plan.append_only, ", ".join((KEY_FIELD, *plan.stored_fields)), json.dumps(plan.reduce_schema))
