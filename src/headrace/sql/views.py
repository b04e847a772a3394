"""The view compiler: CREATE MATERIALIZED VIEW ... AS SELECT ... -> a ViewPlan the pipeline maintains.

A view reads ONE input relation (a source, a table or another view) as a change stream: input rows with
a weight hr_diff (+1 insert, -1 retraction). Two kinds of views:

- aggregating (GROUP BY, aggregates, or DISTINCT): keyed by the group's values. Per transaction the
  pipeline folds each group's changes into a partial state (view_aggregates.py); the runtime reduces it
  with the stored document by `reduce_schema` and calls `finalize`, which derives the aggregates' values
  from the state, or deletes the group when no input row is left in it.
- non-aggregating (projection + filter): keyed by the input row's key; last write wins; a retraction
  deletes.

Stored documents (and the serving-store row, one column per field):
  aggregating:     {hr_key, k0.., a0.., hr_state: {rows, a0: state, ..}}
  non-aggregating: {hr_key, o0..} (a partial may be {hr_key, hr_deleted: true})
hr_key is the canonical JSON array of the key values (so NULL group keys are keys too). The public
relation public."<name>" computes the SELECT list over k*/a* (DuckDB) or renames o*.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from sqlglot import exp

from headrace.catalog.items import DEFAULT_DATABASE, DEFAULT_SCHEMA
from headrace.errors import FeatureNotSupported, HeadraceError, UndefinedColumn, UndefinedObject
from headrace.sql.select import _figure_column_name
from headrace.sql import view_numeric
from headrace.sql.view_aggregates import Aggregate, choose_maintenance, finalize as finalize_aggregate, output_type, state_schema
from headrace.sql.view_scalars import (
    SUPPORTED_TYPES,
    InvalidViewExpression,
    normalize_arrows,
    refuse_non_deterministic,
    type_of,
)

KEY_FIELD = "hr_key"
STATE_FIELD = "hr_state"
DELETED_FIELD = "hr_deleted"
ROWS_FIELD = "rows"
RESERVED_PREFIX = "hr_"
# Meta columns of a change stream, beside the input relation's own columns (see pipeline/views.py).
CHANGE_COLUMNS = ("hr_diff", "hr_seq", "hr_row", "hr_at")

AGGREGATE_NAMES = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max",
    exp.LogicalAnd: "bool_and", exp.LogicalOr: "bool_or", exp.First: "first", exp.Last: "last",
    exp.FirstValue: "first", exp.LastValue: "last", exp.ArrayAgg: "array_agg", exp.JSONBObjectAgg: "jsonb_object_agg",
}
ANONYMOUS_AGGREGATES = {"set_agg": "set_agg", "jsonb_merge_agg": "jsonb_merge_agg", "every": "bool_and",
                        "first": "first", "last": "last"}
OTHER_AGGREGATES = (exp.AggFunc,)  # any other aggregate sqlglot knows is refused with the supported list
SUPPORTED_AGGREGATES_HINT = ("supported aggregates: count(*), count(x), count(DISTINCT x), sum, avg, min, max, "
                             "bool_and, bool_or, first(x), last(x) (by arrival), array_agg(x), "
                             "array_agg(DISTINCT x), set_agg(x), jsonb_merge_agg(x), jsonb_object_agg(k, v)")


@dataclass(frozen=True)
class InputRelation:
    """What a view reads, as the catalog describes it."""

    kind: str  # "source" | "table" | "view"
    item_id: str
    name: str
    columns: dict[str, str]  # user-visible column -> PostgreSQL type name
    key: tuple[str, ...]  # the columns identifying an input row (hr_row is their canonical JSON)
    append_only: bool  # never retracts a row (a webhook source without IDEMPOTENT)
    scales: Mapping[str, int] = field(default_factory=dict)  # numeric(p,s) columns' s (display scale)


RelationLookup = Callable[[str, str], InputRelation | None]  # (schema, name) -> relation or None


@dataclass(frozen=True)
class OutputColumn:
    name: str  # the public column name
    pg_type: str
    expression: exp.Expr  # over the input's columns (non-aggregating) or over k*/a* (aggregating)


@dataclass(frozen=True)
class ViewPlan:
    name: str
    schema: str
    input: InputRelation
    aggregating: bool
    filter: exp.Expr | None  # WHERE, over the input's columns
    group_keys: tuple[exp.Expr, ...]  # k{i}: expressions over the input's columns
    group_key_types: tuple[str, ...]
    aggregates: tuple[Aggregate, ...]  # a{j}
    outputs: tuple[OutputColumn, ...]  # the public relation's columns, in order
    having: exp.Expr | None  # over k*/a*, applied by the public relation
    reduce_schema: dict[str, Any] = field(compare=False)
    # Display scale of each stored numeric field (k*, a*, o*) when the expression fixes it, else None (view_numeric).
    numeric_scales: dict[str, int | None] = field(default_factory=dict, compare=False)

    @property
    def append_only(self) -> bool:
        """Whether this view's own change stream never retracts (for views over it)."""
        return self.input.append_only and not self.aggregating

    @property
    def stored_fields(self) -> tuple[str, ...]:
        """The document fields stored as serving-store columns, after hr_key."""
        if self.aggregating:
            return (*(f"k{i}" for i in range(len(self.group_keys))),
                    *(a.field for a in self.aggregates), STATE_FIELD)
        return tuple(f"o{i}" for i in range(len(self.outputs)))

    def stored_types(self) -> dict[str, str]:
        """PostgreSQL type of each stored field (hr_state is jsonb)."""
        if self.aggregating:
            types = {f"k{i}": t for i, t in enumerate(self.group_key_types)}
            types.update({a.field: a.output_type for a in self.aggregates})
            types[STATE_FIELD] = "jsonb"
            return types
        return {f"o{i}": column.pg_type for i, column in enumerate(self.outputs)}

    def finalize(self, doc: dict[str, Any]) -> dict[str, Any] | None:
        """The runtime's step after full reduction: derive outputs from state; None deletes the row. numeric values
        become PostgreSQL's numeric text (sql/view_numeric.py)."""
        if not self.aggregating:
            if doc.get(DELETED_FIELD):
                return None
            for name, scale in self.numeric_scales.items():
                value = doc.get(name)
                if value is not None and not isinstance(value, str):
                    doc = {**doc, name: view_numeric.to_text(value, scale)}
            return doc
        state = doc.get(STATE_FIELD) or {}
        rows = state.get(ROWS_FIELD, 0)
        if rows <= 0:
            return None  # the group's last input row was retracted
        result: dict[str, Any] = {KEY_FIELD: doc[KEY_FIELD]}
        for i in range(len(self.group_keys)):
            value = result[f"k{i}"] = doc.get(f"k{i}")
            if self.group_key_types[i] == "numeric" and value is not None and not isinstance(value, str):
                result[f"k{i}"] = view_numeric.to_text(value, self.numeric_scales.get(f"k{i}"))
        kept: dict[str, Any] = {ROWS_FIELD: rows}
        for aggregate in self.aggregates:
            value, aggregate_state = finalize_aggregate(aggregate, state.get(aggregate.field))
            result[aggregate.field] = value
            if aggregate_state is not None:
                kept[aggregate.field] = aggregate_state
        result[STATE_FIELD] = kept
        return result


class ViewRefused(FeatureNotSupported):
    """A statement headrace cannot maintain incrementally (0A000), with what would work in the hint."""


def is_create_materialized_view(statement: exp.Expr) -> bool:
    return (isinstance(statement, exp.Create) and str(statement.args.get("kind") or "").upper() == "VIEW"
            and any(isinstance(p, exp.MaterializedProperty)
                    for p in (statement.args.get("properties") or exp.Properties(expressions=[])).expressions))


def view_name(statement: exp.Create) -> tuple[str, str]:
    table = statement.this
    if isinstance(table, exp.Schema):
        raise ViewRefused("column lists in CREATE MATERIALIZED VIEW are not supported",
                          hint="name the columns with AS in the SELECT list")
    if (table.catalog or DEFAULT_DATABASE) != DEFAULT_DATABASE:
        raise FeatureNotSupported(f"cross-database references are not implemented: {table.catalog}")
    schema = table.db or DEFAULT_SCHEMA
    if schema != DEFAULT_SCHEMA:
        raise FeatureNotSupported(f"views live in {DEFAULT_SCHEMA} for now, not {schema}")
    return schema, table.name


def compile_view(statement: exp.Create, lookup: RelationLookup) -> ViewPlan:
    """Compile CREATE MATERIALIZED VIEW, or refuse it with why and what would work."""
    schema, name = view_name(statement)
    if statement.args.get("replace"):
        raise ViewRefused("CREATE OR REPLACE MATERIALIZED VIEW is not supported", hint="DROP the view, then CREATE it")
    query = statement.expression
    if isinstance(query, exp.Select):
        query = normalize_arrows(query.copy())
    if not isinstance(query, exp.Select):
        raise ViewRefused(f"a materialized view must be a single SELECT, not {query.key.upper()}",
                          hint="UNION, INTERSECT and EXCEPT are not maintained incrementally yet; "
                               "create one view per branch and combine them when reading")
    _refuse_unsupported(query)
    relation, alias = _input_of(query, lookup)
    columns = dict(relation.columns)
    _strip_qualifiers(query, {relation.name, alias})
    where = query.args.get("where")
    filter_expr = where.this if where is not None else None
    if filter_expr is not None:
        if list(_aggregate_calls(filter_expr)):
            raise HeadraceError("aggregate functions are not allowed in WHERE", sqlstate="42803",
                                hint="use HAVING to filter groups")
        if type_of(filter_expr, columns) not in ("bool", "unknown"):
            raise InvalidViewExpression("argument of WHERE must be type boolean")
        refuse_non_deterministic(filter_expr)
    items = _select_items(query, relation)
    for _, expression in items:
        refuse_non_deterministic(expression)
    names = [item_name for item_name, _ in items]
    _check_names(names)
    group_keys = _group_keys(query, items)
    having = query.args.get("having")
    if query.args.get("distinct") is not None:
        if group_keys or any(list(_aggregate_calls(e)) for _, e in items):
            raise ViewRefused("SELECT DISTINCT with GROUP BY or aggregates is not supported in views",
                              hint="GROUP BY the selected columns instead")
        group_keys = [expression for _, expression in items]
    aggregating = bool(group_keys) or having is not None or any(list(_aggregate_calls(e)) for _, e in items)
    if not aggregating:
        outputs = tuple(OutputColumn(item_name, _output_type(type_of(e, columns)), e) for item_name, e in items)
        plan_args: dict[str, Any] = dict(group_keys=(), group_key_types=(), aggregates=(), having=None)
    else:
        plan_args, outputs = _plan_aggregation(items, group_keys, having.this if having is not None else None,
                                               columns, relation.append_only, dict(relation.scales))
    plan = ViewPlan(name=name, schema=schema, input=relation, aggregating=aggregating, filter=filter_expr,
                    outputs=outputs, reduce_schema={}, **plan_args)
    object.__setattr__(plan, "reduce_schema", _reduce_schema(plan))
    object.__setattr__(plan, "numeric_scales", _numeric_scales(plan))
    return plan


def _numeric_scales(plan: ViewPlan) -> dict[str, int | None]:
    """The display scale of each stored numeric field; refuses (0A000) any numeric the pipeline cannot compute
    exactly as PostgreSQL does (numeric division, more than 10 fractional digits), wherever it appears."""
    columns, scales = dict(plan.input.columns), dict(plan.input.scales)
    expressions = [*plan.group_keys, *(arg for a in plan.aggregates for arg in a.args),
                   *(a.filter for a in plan.aggregates if a.filter is not None)]
    if plan.filter is not None:
        expressions.append(plan.filter)
    if not plan.aggregating:
        expressions.extend(o.expression for o in plan.outputs)
    for expression in expressions:
        for node in expression.find_all(exp.Div, exp.Mul, exp.Literal, exp.Round):
            if type_of(node, columns) == "numeric":
                view_numeric.static_scale(node, columns, scales)
    found: dict[str, int | None] = {}
    for i, (key, key_type) in enumerate(zip(plan.group_keys, plan.group_key_types)):
        if key_type == "numeric":
            found[f"k{i}"] = view_numeric.static_scale(key, columns, scales)
    for aggregate in plan.aggregates:
        if aggregate.output_type == "numeric":
            found[aggregate.field] = aggregate.arg_scale if aggregate.function != "avg" else None
        elif aggregate.output_type == "numeric[]":
            found[aggregate.field] = aggregate.arg_scale  # the elements' scale (DuckDB's DECIMAL(38,s)[])
    if not plan.aggregating:
        for i, output in enumerate(plan.outputs):
            if output.pg_type == "numeric":
                found[f"o{i}"] = view_numeric.static_scale(output.expression, columns, scales)
    return found


# ---------------------------------------------------------------------------------------------- checks

def _input_of(query: exp.Select, lookup: RelationLookup) -> tuple[InputRelation, str]:
    from_ = query.args.get("from_") or query.args.get("from")
    if from_ is None:
        raise ViewRefused("a materialized view needs FROM <source | table | view>",
                          hint="constant views are not maintained; create the view over a source")
    if query.args.get("joins"):
        raise ViewRefused("joins are not supported in materialized views yet: a view reads one relation",
                          hint="materialize each input as its own view (filtered, grouped) and join them in "
                               "the SELECT that reads them")
    table = from_.this
    if not isinstance(table, exp.Table) or isinstance(table.this, exp.Func):
        raise ViewRefused("a materialized view reads a source, table or view by name, not a subquery or function",
                          hint="materialize the inner query as its own view and read that view")
    if (table.catalog or DEFAULT_DATABASE) != DEFAULT_DATABASE:
        raise FeatureNotSupported(f'cross-database references are not implemented: "{table.catalog}"')
    relation = lookup(table.db or DEFAULT_SCHEMA, table.name)
    if relation is None:
        shown = f"{table.db}.{table.name}" if table.db else table.name
        raise UndefinedObject(f'relation "{shown}" does not exist')
    return relation, table.alias_or_name


def _refuse_unsupported(query: exp.Select) -> None:
    if query.args.get("with_") is not None or query.args.get("with") is not None:
        raise ViewRefused("WITH is not supported in materialized views",
                          hint="materialize each common table expression as its own view")
    if query.args.get("order") is not None:
        raise ViewRefused("ORDER BY is not supported in materialized views: a view is a set of rows",
                          hint="put ORDER BY in the SELECT that reads the view")
    if query.args.get("limit") is not None or query.args.get("offset") is not None:
        raise ViewRefused("LIMIT and OFFSET are not supported in materialized views: which rows they keep "
                          "changes with every input row, so they are not maintained incrementally",
                          hint="put LIMIT in the SELECT that reads the view")
    distinct = query.args.get("distinct")
    if distinct is not None and distinct.args.get("on") is not None:
        raise ViewRefused("DISTINCT ON is not supported in materialized views",
                          hint="use GROUP BY with first(x) or last(x) (by arrival) for the other columns")
    for node in query.find_all(exp.Window):
        raise ViewRefused("window functions are not supported in materialized views",
                          hint="apply window functions in the SELECT that reads the view")
    for node in query.find_all(exp.Subquery, exp.Exists):
        raise ViewRefused("subqueries are not supported in materialized views",
                          hint="materialize the inner query as its own view and read that view")
    for node in query.find_all(exp.Select):
        if node is not query:
            raise ViewRefused("subqueries are not supported in materialized views",
                              hint="materialize the inner query as its own view and read that view")
    group = query.args.get("group")
    if group is not None and any(group.args.get(k) for k in ("grouping_sets", "cube", "rollup")):
        raise ViewRefused("GROUPING SETS, CUBE and ROLLUP are not supported in materialized views",
                          hint="create one view per grouping")


def _strip_qualifiers(query: exp.Select, allowed: set[str]) -> None:
    for column in query.find_all(exp.Column):
        if column.table:
            if column.table not in allowed:
                raise UndefinedObject(f'missing FROM-clause entry for table "{column.table}"')
            column.set("table", None)


def _select_items(query: exp.Select, relation: InputRelation) -> list[tuple[str, exp.Expr]]:
    items: list[tuple[str, exp.Expr]] = []
    for projection in query.expressions:
        if isinstance(projection, exp.Star) or (isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)):
            items.extend((column, exp.column(column)) for column in relation.columns)
            continue
        if isinstance(projection, exp.Alias):
            items.append((projection.alias, projection.this))
        else:
            named = projection.this if isinstance(projection, exp.Filter) else projection
            items.append((_figure_column_name(named), projection))
    return items


def _check_names(names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise HeadraceError(f'column "{name}" specified more than once', sqlstate="42701",
                                hint="give the columns distinct names with AS")
        if name.startswith(RESERVED_PREFIX):
            raise HeadraceError(f'column name "{name}" is reserved: names starting with {RESERVED_PREFIX} are '
                                "headrace's own", sqlstate="42939")
        seen.add(name)


def _group_keys(query: exp.Select, items: list[tuple[str, exp.Expr]]) -> list[exp.Expr]:
    group = query.args.get("group")
    if group is None:
        return []
    keys: list[exp.Expr] = []
    by_name = dict(items)
    for expression in group.expressions:
        if isinstance(expression, exp.Literal) and not expression.is_string:
            position = int(expression.this)
            if not 1 <= position <= len(items):
                raise HeadraceError(f"GROUP BY position {position} is not in select list", sqlstate="42P10")
            keys.append(items[position - 1][1])
        elif isinstance(expression, exp.Column) and expression.name in by_name and not expression.table:
            keys.append(by_name[expression.name])  # an output name (PostgreSQL prefers input columns)
        else:
            keys.append(expression)
    for key in keys:
        if list(_aggregate_calls(key)):
            raise HeadraceError("aggregate functions are not allowed in GROUP BY", sqlstate="42803")
    unique: list[exp.Expr] = []
    for key in keys:
        if key not in unique:
            unique.append(key)
    return unique


def _output_type(pg_type: str) -> str:
    return "text" if pg_type == "unknown" else pg_type


# ---------------------------------------------------------------------------------------------- aggregation

def _aggregate_calls(node: exp.Expr) -> list[exp.Expr]:
    """The outermost aggregate calls in `node` (a FILTER (WHERE ...) node stands for its aggregate)."""
    if isinstance(node, exp.Filter) and _is_aggregate(node.this) or _is_aggregate(node):
        return [node]
    return [call for child in node.iter_expressions() for call in _aggregate_calls(child)]


def _is_aggregate(node: exp.Expr) -> bool:
    if isinstance(node, exp.Anonymous):
        return node.name.lower() in ANONYMOUS_AGGREGATES
    return isinstance(node, OTHER_AGGREGATES) or type(node) in AGGREGATE_NAMES


def _plan_aggregation(items: list[tuple[str, exp.Expr]], group_keys: list[exp.Expr], having: exp.Expr | None,
                      columns: dict[str, str], append_only: bool,
                      scales: dict[str, int]) -> tuple[dict[str, Any], tuple[OutputColumn, ...]]:
    key_types = tuple(_output_type(type_of(key, columns)) for key in group_keys)
    for key, key_type in zip(group_keys, key_types):
        refuse_non_deterministic(key)
        if key_type not in SUPPORTED_TYPES:
            raise FeatureNotSupported(f"cannot group by a value of type {key_type}")
    aggregates: list[Aggregate] = []
    by_call: dict[exp.Expr, Aggregate] = {}

    def register(call: exp.Expr) -> Aggregate:
        existing = by_call.get(call)
        if existing is None:
            existing = _aggregate(len(aggregates), call, columns, append_only, scales)
            aggregates.append(existing)
            by_call[call] = existing
        return existing

    post_types = {f"k{i}": t for i, t in enumerate(key_types)}

    def rewrite(expression: exp.Expr, what: str) -> exp.Expr:
        """Replace aggregate calls by a{j} and group keys by k{i} (outermost first; inside an aggregate a
        key stays an input column); whatever input column is left is neither grouped nor aggregated."""
        made: set[int] = set()

        def replace(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Filter) and _is_aggregate(node.this) or _is_aggregate(node):
                aggregate = register(node)
                post_types[aggregate.field] = aggregate.output_type
                column = exp.column(aggregate.field)
            elif node in group_keys:
                column = exp.column(f"k{group_keys.index(node)}")
            else:
                return node
            made.add(id(column))
            return column

        rewritten = expression.copy().transform(replace, copy=False)
        for column in rewritten.find_all(exp.Column):
            if id(column) not in made:
                raise HeadraceError(f'column "{column.name}" must appear in the GROUP BY clause or be used in an '
                                    f"aggregate function ({what})", sqlstate="42803")
        return rewritten

    outputs = []
    for item_name, expression in items:
        rewritten = rewrite(expression, "select list")
        outputs.append(OutputColumn(item_name, _output_type(type_of(rewritten, post_types)), rewritten))
    having_rewritten = rewrite(having, "HAVING") if having is not None else None
    if having_rewritten is not None and type_of(having_rewritten, post_types) not in ("bool", "unknown"):
        raise InvalidViewExpression("argument of HAVING must be type boolean")
    return (dict(group_keys=tuple(group_keys), group_key_types=key_types, aggregates=tuple(aggregates),
                 having=having_rewritten), tuple(outputs))


def _aggregate(index: int, call: exp.Expr, columns: dict[str, str], append_only: bool,
               scales: dict[str, int]) -> Aggregate:
    filter_expr: exp.Expr | None = None
    if isinstance(call, exp.Filter):
        filter_expr = call.expression.this
        if type_of(filter_expr, columns) not in ("bool", "unknown"):
            raise InvalidViewExpression("argument of FILTER must be type boolean")
        call = call.this
    function = _function_name(call)
    args = _aggregate_args(call)
    if isinstance(call.this, exp.Distinct) and function not in ("count", "array_agg"):
        raise ViewRefused(f"{function}(DISTINCT ...) is not supported in materialized views", hint=SUPPORTED_AGGREGATES_HINT)
    if isinstance(call.this, exp.Distinct):
        function = "count_distinct" if function == "count" else "array_agg_distinct"
    if function == "count" and not args:
        function = "count_star"
    if isinstance(call.this, exp.Order) or call.find(exp.Order):
        raise ViewRefused(f"ORDER BY inside {function}() is not supported in materialized views",
                          hint="array_agg keeps arrival order; sort the array in the SELECT that reads the view")
    for arg in args:
        if list(_aggregate_calls(arg)) or (arg is not call and _is_aggregate(arg)):
            raise HeadraceError("aggregate function calls cannot be nested", sqlstate="42803")
        refuse_non_deterministic(arg)
    expected = 2 if function == "jsonb_object_agg" else 0 if function == "count_star" else 1
    if len(args) != expected:
        raise HeadraceError(f"{function} takes {expected} argument(s), got {len(args)}", sqlstate="42883")
    arg_types = tuple(_output_type(type_of(arg, columns)) for arg in args)
    if function in ("sum", "avg") and arg_types[0] not in ("int2", "int4", "int8", "numeric", "float4", "float8"):
        raise InvalidViewExpression(f"function {function}({arg_types[0]}) does not exist", sqlstate="42883",
                                    hint="cast the argument to a number, e.g. sum((body->>'amount')::int)")
    if function in ("bool_and", "bool_or") and arg_types[0] != "bool":
        raise InvalidViewExpression(f"function {function}({arg_types[0]}) does not exist", sqlstate="42883")
    if function in ("min", "max") and arg_types[0] in ("jsonb", "json"):
        raise InvalidViewExpression(f"function {function}(jsonb) does not exist", sqlstate="42883",
                                    hint="extract a scalar with ->> and cast it")
    if function in ("array_agg", "array_agg_distinct", "set_agg") and arg_types[0] in ("timestamptz",):
        raise ViewRefused(f"{function} of timestamptz is not supported yet", hint="aggregate the text form: x::text")
    arg_scale = None
    if arg_types and arg_types[0] in ("numeric", "int2", "int4", "int8"):
        arg_scale = view_numeric.static_scale(args[0], columns, scales)  # an integer's is 0
    return Aggregate(index=index, function=function, args=tuple(args), arg_types=arg_types, filter=filter_expr,
                     output_type=output_type(function, arg_types),
                     maintenance=choose_maintenance(function, append_only, arg_types[0] if arg_types else None),
                     arg_scale=arg_scale)


def _function_name(call: exp.Expr) -> str:
    if isinstance(call, exp.Anonymous):
        name = call.name.lower()
        if name in ANONYMOUS_AGGREGATES:
            return ANONYMOUS_AGGREGATES[name]
    elif type(call) in AGGREGATE_NAMES:
        return AGGREGATE_NAMES[type(call)]
    shown = call.sql(dialect="postgres").split("(")[0].lower()
    raise ViewRefused(f"aggregate {shown}() is not supported in materialized views", hint=SUPPORTED_AGGREGATES_HINT)


def _aggregate_args(call: exp.Expr) -> list[exp.Expr]:
    if isinstance(call, exp.Anonymous):
        return list(call.expressions)
    this = call.this
    if isinstance(this, exp.Star) or this is None:
        args: list[exp.Expr] = []
    elif isinstance(this, exp.Distinct):
        args = list(this.expressions)
    else:
        args = [this]
    if isinstance(call, exp.JSONBObjectAgg):
        args.append(call.expression)
    return args


# ---------------------------------------------------------------------------------------------- schema

def _reduce_schema(plan: ViewPlan) -> dict[str, Any]:
    """The JSON schema of the view's documents with Flow `reduce` annotations (shown by SHOW CREATE)."""
    properties: dict[str, Any] = {KEY_FIELD: {"type": "string"}}
    if not plan.aggregating:
        for i, column in enumerate(plan.outputs):
            properties[f"o{i}"] = {"title": column.name}
        properties[DELETED_FIELD] = {"type": "boolean"}
        return {"type": "object", "reduce": {"strategy": "lastWriteWins"}, "properties": properties,
                "required": [KEY_FIELD]}
    for i, key in enumerate(plan.group_keys):
        properties[f"k{i}"] = {"title": key.sql(dialect="postgres")}
    state: dict[str, Any] = {ROWS_FIELD: {"type": "integer", "reduce": {"strategy": "sum"}}}
    for aggregate in plan.aggregates:
        arguments = ", ".join(a.sql(dialect="postgres") for a in aggregate.args) or "*"
        call = f"{aggregate.function.replace('count_star', 'count')}({arguments})"
        properties[aggregate.field] = {"title": call}
        state[aggregate.field] = {**state_schema(aggregate), "title": f"{call}: {aggregate.maintenance.value}"}
    properties[STATE_FIELD] = {"type": "object", "reduce": {"strategy": "merge"}, "properties": state}
    return {"type": "object", "reduce": {"strategy": "merge"}, "properties": properties, "required": [KEY_FIELD]}
