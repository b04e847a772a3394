"""How a view lives in the serving store: its binding (one table keyed by hr_key) and its public relation.

Table headrace_internal."view_<id>": hr_key VARCHAR (canonical JSON of the key values: NULL group keys are
keys too), then ViewPlan.stored_fields: k*/a*/hr_state (aggregating) or o* (non-aggregating). The public
relation public."<name>" is a view (DuckDB's or PostgreSQL's: the serving store's `dialect`) over it computing
the SELECT list (and HAVING) from k*/a*, casting stored types back to the view's column types; a global aggregate (no GROUP BY) shows its empty-input row
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
VIEW_SCHEMAS_UPDATE = ", ".join(f"{column} = excluded.{column}" for column in (
    "schema", "name", "input", "aggregating", "append_only", "stored_fields", "reduce_schema"))  # ON CONFLICT (id)

# PostgreSQL type -> the serving store's column type (the driver's supported set).
# numeric is held as PostgreSQL's numeric text (sql/view_numeric.py: each value with its display scale) and cast by
# the public relation: to numeric on PostgreSQL (exact, scale kept), to DECIMAL(38,s) on DuckDB.
_STORED = {"int2": "INTEGER", "int4": "INTEGER", "int8": "BIGINT", "float4": "DOUBLE", "float8": "DOUBLE",
           "numeric": "VARCHAR", "text": "VARCHAR", "varchar": "VARCHAR", "bool": "BOOLEAN", "jsonb": "JSON",
           "json": "JSON", "timestamptz": "TIMESTAMPTZ",
           "date": "DATE", "timestamp": "TIMESTAMP", "uuid": "UUID", "interval": "INTERVAL"}  # tables' types
# PostgreSQL type -> DuckDB type of the public column where it differs from the stored one.
_PUBLIC = {"int2": "SMALLINT", "float4": "FLOAT"}
_ELEMENT = {"int2": "SMALLINT", "int4": "INTEGER", "int8": "BIGINT", "float4": "FLOAT", "float8": "DOUBLE",
            "text": "VARCHAR", "varchar": "VARCHAR", "bool": "BOOLEAN", "jsonb": "JSON",
            "json": "JSON"}
_EMPTY_ZERO = ("count_star", "count", "count_distinct")


def stored_type(pg_type: str) -> str:
    return "JSON" if pg_type.endswith("[]") else _STORED[pg_type]


DUCKDB_DYNAMIC_SCALE = 16  # DuckDB's DECIMAL has one scale per column: a numeric whose values each keep their own
# (avg, an unconstrained column) is shown at 16 digits there, PostgreSQL's least for a quotient


def public_type(pg_type: str, scale: int | None = None) -> str | None:
    """The DuckDB type to cast a stored column to in the public relation, or None (as stored)."""
    if pg_type.endswith("[]"):
        return f"{public_type(pg_type[:-2], scale) or _ELEMENT[pg_type[:-2]]}[]"
    if pg_type == "numeric":
        return f"DECIMAL(38,{DUCKDB_DYNAMIC_SCALE if scale is None else scale})"
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


# The PostgreSQL serving store's column type for each stored type (store/postgres_serving.py's mapping).
_STORED_IN_POSTGRES = {"INTEGER": "int4", "BIGINT": "int8", "DOUBLE": "float8", "VARCHAR": "text", "JSON": "jsonb",
                       "BOOLEAN": "bool", "TIMESTAMPTZ": "timestamptz", "DATE": "date", "TIMESTAMP": "timestamp",
                       "UUID": "uuid", "INTERVAL": "interval"}


def _postgres_reference(column: exp.Expr, pg_type: str) -> exp.Expr:
    """A stored column as the view's PostgreSQL type: arrays are kept as jsonb, the rest cast where the stored
    type differs (int2 as int4, float4 and numeric as float8, varchar as text, json as jsonb)."""
    if pg_type.endswith("[]"):
        element = pg_type[:-2]
        elements = exp.maybe_parse(
            f"CASE WHEN {column.sql(dialect='postgres')} IS NULL THEN NULL ELSE ARRAY(SELECT "
            f"CAST(e.value AS {element}) FROM jsonb_array_elements_text({column.sql(dialect='postgres')}) "
            "WITH ORDINALITY AS e(value, position) ORDER BY e.position) END", dialect="postgres")
        return exp.cast(elements, exp.DataType.build(pg_type, dialect="postgres"))
    if _STORED_IN_POSTGRES[stored_type(pg_type)] == pg_type:
        return column
    return exp.cast(column, exp.DataType.build(pg_type, dialect="postgres"))


def _stored_reference(name: str, pg_type: str, dialect: str = "duckdb", scale: int | None = None) -> exp.Expr:
    column = exp.column(name, quoted=True)
    if dialect == "postgres":
        return _postgres_reference(column, pg_type)
    target = public_type(pg_type, scale)
    return exp.cast(column, exp.DataType.build(target, dialect="duckdb")) if target else column


def _null_of(pg_type: str, dialect: str, scale: int | None = None) -> exp.Expr:
    if dialect == "postgres":
        return exp.cast(exp.null(), exp.DataType.build(pg_type, dialect="postgres"))
    return exp.cast(exp.null(), exp.DataType.build(public_type(pg_type, scale) or stored_type(pg_type),
                                                 dialect="duckdb"))


def _over_stored(plan: ViewPlan, expression: exp.Expr, empty: bool = False, dialect: str = "duckdb") -> exp.Expr:
    """An output expression over k*/a*: stored columns cast back; on DuckDB, integer division kept integral
    (PostgreSQL's own `/` already is); with `empty`, each aggregate replaced by its value over no input rows."""
    types = plan.stored_types()
    functions = {a.field: a.function for a in plan.aggregates}
    expression = expression.copy()
    for division in list(expression.find_all(exp.Div)) if dialect == "duckdb" else ():
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
                return _null_of(types[node.name], dialect, plan.numeric_scales.get(node.name))
            return _stored_reference(node.name, types[node.name], dialect, plan.numeric_scales.get(node.name))
        return node

    return expression.transform(replace, copy=False)


def public_relation_sql(plan: ViewPlan, view_id: str, dialect: str = "duckdb") -> str:
    """CREATE OR REPLACE VIEW public."<name>" over the view's table (idempotent), in `dialect` ("duckdb" or
    "postgres": the serving store's `dialect`)."""
    table = f"{INTERNAL_SCHEMA}.{_quote(f'view_{view_id}')}"
    if not plan.aggregating:
        types = plan.stored_types()
        items = [f"{_stored_reference(f'o{i}', types[f'o{i}'], dialect, plan.numeric_scales.get(f'o{i}')).sql(dialect=dialect)} "
                 f"AS {_quote(o.name)}"
                 for i, o in enumerate(plan.outputs)]
        return f"CREATE OR REPLACE VIEW {plan.schema}.{_quote(plan.name)} AS SELECT {', '.join(items)} FROM {table}"

    def over(expression: exp.Expr, empty: bool = False) -> str:
        return _over_stored(plan, expression, empty, dialect).sql(dialect=dialect)

    items = [f"{over(o.expression)} AS {_quote(o.name)}" for o in plan.outputs]
    having = f" WHERE {over(plan.having)}" if plan.having is not None else ""
    select = f"SELECT {', '.join(items)} FROM {table}{having}"
    if not plan.group_keys:
        empty_items = [f"{over(o.expression, empty=True)} AS {_quote(o.name)}" for o in plan.outputs]
        empty_having = f" AND ({over(plan.having, empty=True)})" if plan.having is not None else ""
        select += f" UNION ALL SELECT {', '.join(empty_items)} WHERE NOT EXISTS (SELECT 1 FROM {table}){empty_having}"
    return f"CREATE OR REPLACE VIEW {plan.schema}.{_quote(plan.name)} AS {select}"


def view_schema_row(plan: ViewPlan, view_id: str) -> tuple[str, str, str, str, bool, bool, str, str]:
    """The row of headrace_internal.view_schemas describing a view's generated schema."""
    return (view_id, plan.schema, plan.name, f"{plan.input.kind} {plan.input.name}", plan.aggregating,
            plan.append_only, ", ".join((KEY_FIELD, *plan.stored_fields)), json.dumps(plan.reduce_schema))
