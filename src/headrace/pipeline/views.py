"""The Spark side of view maintenance: one transaction's input changes -> one partial document per key.

Input: a DataFrame of changes (the change-stream contract), one row per change:
  - the input relation's columns, with jsonb as JSON text and timestamptz as long microseconds (as the
    log source and the materialization protocol carry them);
  - hr_diff int (+1 insert, -1 retraction), hr_seq long (order of the change in the stream; a
    replacement's -1 and +1 share it, the -1 sorting first), hr_row string (canonical JSON of the
    input row's key), hr_at long (arrival of this row version: orders first/last/array_agg).

Spark parses JSON, evaluates WHERE, projections and group keys, shuffles by group and sums the weighted
counts and sums (views whose states are all sums or extremes skip the shuffle: pipeline/view_partials.py);
per group the few list-shaped states (value counts, keyed sets) are folded on the driver from Spark's
collected lists. `view_documents` returns [(key, partial doc)] for
Runtime.transact; the runtime reduces each with the stored document and calls ViewPlan.finalize.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from sqlglot import exp

from headrace.errors import FeatureNotSupported
from headrace.sql.view_aggregates import Aggregate, Change, Maintenance, fold
from headrace.sql.view_scalars import (
    ARITHMETIC,
    COMPARISONS,
    INTEGER_TYPES,
    NUMERIC_RANK,
    date_literal_days,
    numeric_display_scale,
    timestamp_literal_micros,
    type_of,
)
from headrace.sql import view_numeric
from headrace.sql.views import DELETED_FIELD, KEY_FIELD, ROWS_FIELD, STATE_FIELD, ViewPlan

SPARK_TYPES = {"int2": "smallint", "int4": "int", "int8": "bigint", "float4": "double", "float8": "double",
               "numeric": "decimal(38,10)", "text": "string", "varchar": "string", "bool": "boolean",
               "timestamptz": "timestamp"}
_canonical = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode


# ---------------------------------------------------------------------------------------------- expressions

class SparkExpressions:
    """Translates a view's scalar expressions (sqlglot, already checked by view_scalars.type_of) into Spark
    Columns over a frame whose jsonb columns are VARIANT and timestamptz columns are TIMESTAMP."""

    def __init__(self, columns: Mapping[str, str]) -> None:
        self.columns = columns

    def __call__(self, node: exp.Expr) -> Column:
        return self.column(node)

    def type(self, node: exp.Expr) -> str:
        return type_of(node, self.columns)

    def column(self, node: exp.Expr) -> Column:  # noqa: C901 - one dispatch over node kinds
        c = self.column
        if isinstance(node, exp.Column):
            return F.col(f"`{node.name}`")
        if isinstance(node, exp.Literal):
            if node.is_string:
                return F.lit(node.this)
            text = node.this
            return F.lit(Decimal(text)) if any(ch in text for ch in ".eE") else F.lit(int(text))
        if isinstance(node, exp.Boolean):
            return F.lit(bool(node.this))
        if isinstance(node, exp.Null):
            return F.lit(None)
        if isinstance(node, exp.Paren):
            return c(node.this)
        if isinstance(node, exp.Neg):
            return -c(node.this)
        if isinstance(node, exp.Cast):
            return self._cast(node)
        if isinstance(node, (exp.JSONExtract, exp.JSONExtractScalar)):
            path = _spark_json_path(node.expression)
            target = "variant" if isinstance(node, exp.JSONExtract) else "string"
            return F.variant_get(c(node.this), path, target)
        if isinstance(node, ARITHMETIC):
            return self._arithmetic(node)
        if isinstance(node, exp.DPipe):
            return F.concat(self._text(node.this), self._text(node.expression))
        if isinstance(node, COMPARISONS):
            left, right = self._compared(node.this, node.expression), self._compared(node.expression, node.this)
            op = {exp.EQ: "__eq__", exp.NEQ: "__ne__", exp.GT: "__gt__", exp.GTE: "__ge__", exp.LT: "__lt__",
                  exp.LTE: "__le__"}[type(node)]
            return getattr(left, op)(right)
        if isinstance(node, exp.And):
            return c(node.this) & c(node.expression)
        if isinstance(node, exp.Or):
            return c(node.this) | c(node.expression)
        if isinstance(node, exp.Not):
            return ~c(node.this)
        if isinstance(node, exp.Is):
            # sqlglot reads `x IS NOT NULL` as Is(x, NULL, negate=True), not as Not(Is(...)).
            test = c(node.this).isNull() if isinstance(node.expression, exp.Null) else \
                c(node.this).eqNullSafe(F.lit(node.expression.this))
            return ~test if node.args.get("negate") else test
        if isinstance(node, exp.In):
            return c(node.this).isin(*[self._compared(value, node.this) for value in node.expressions])
        if isinstance(node, exp.Between):
            return c(node.this).between(self._compared(node.args["low"], node.this),
                                        self._compared(node.args["high"], node.this))
        if isinstance(node, exp.Like):
            return F.like(c(node.this), c(node.expression))
        if isinstance(node, exp.ILike):
            return F.ilike(c(node.this), c(node.expression))
        if isinstance(node, exp.Coalesce):
            return F.coalesce(*[c(v) for v in (node.this, *node.expressions)])
        if isinstance(node, exp.Greatest):
            return F.greatest(*[c(v) for v in (node.this, *node.expressions)])
        if isinstance(node, exp.Least):
            return F.least(*[c(v) for v in (node.this, *node.expressions)])
        if isinstance(node, exp.Nullif):
            return F.nullif(c(node.this), c(node.expression))
        if isinstance(node, exp.Case):
            return self._case(node)
        if isinstance(node, exp.Length):
            return F.length(c(node.this))
        if isinstance(node, exp.Lower):
            return F.lower(c(node.this))
        if isinstance(node, exp.Upper):
            return F.upper(c(node.this))
        if isinstance(node, exp.Trim):
            return F.trim(c(node.this))
        if isinstance(node, exp.Substring):
            return self._substring(node)
        if isinstance(node, exp.Replace):
            return F.replace(c(node.this), c(node.expression), c(node.args["replacement"]))
        if isinstance(node, exp.Left):
            # PostgreSQL: a negative n keeps all but the last |n| characters (Spark's left gives '')
            text, n = c(node.this), c(node.expression)
            return F.when(n >= 0, F.left(text, n)).when(n < 0, text.substr(F.lit(1), F.greatest(F.length(text) + n, F.lit(0))))
        if isinstance(node, exp.Right):
            # PostgreSQL: a negative n drops the first |n| characters (Spark's right gives '')
            text, n = c(node.this), c(node.expression)
            return F.when(n >= 0, F.right(text, n)).when(n < 0, text.substr(F.lit(1) - n, F.lit(2**31 - 1)))
        if isinstance(node, exp.MD5):
            return F.md5(c(node.this))
        if isinstance(node, exp.SplitPart):
            return F.split_part(c(node.this), c(node.args["delimiter"]), c(node.args["part_index"]))
        if isinstance(node, exp.Concat):
            return F.concat_ws("", *[self._text(v) for v in node.expressions])
        if isinstance(node, (exp.Abs, exp.Floor, exp.Ceil, exp.Round)):
            return self._math(node)
        if isinstance(node, exp.TimestampTrunc):
            return F.date_trunc(node.args["unit"].name.lower(), c(node.this))
        raise FeatureNotSupported(f"{node.sql(dialect='postgres')} has no Spark translation")

    def _text(self, node: exp.Expr) -> Column:
        """An operand of `||` as text, as its ::text cast gives it (view_scalars.check_text_form refused the rest)."""
        source = self.type(node)
        if source in ("text", "varchar", "unknown"):
            return self.column(node)
        return self._cast(exp.Cast(this=node, to=exp.DataType.build("text")))

    def _cast(self, node: exp.Cast) -> Column:
        source, target = self.type(node.this), type_of(node, self.columns)
        operand = self.column(node.this)
        if target in INTEGER_TYPES and source in ("float4", "float8"):
            # PostgreSQL's float -> integer cast rounds with rint(): half to even (2.5 -> 2, 3.5 -> 4).
            return F.rint(operand).cast(SPARK_TYPES[target])
        if target in INTEGER_TYPES and source == "numeric":
            # numeric -> integer rounds half away from zero (-2.5 -> -3): Spark's round on a decimal is HALF_UP.
            return F.round(operand, 0).cast(SPARK_TYPES[target])
        if target in ("text", "varchar") and source in TEXT_FORMATS:
            return TEXT_FORMATS[source](operand)
        if target in ("text", "varchar") and source == "numeric":
            return F.round(operand, numeric_display_scale(node.this, self.columns)).cast("string")
        if target == "numeric" and (shape := view_numeric.cast_shape(node.to)) is not None:
            # numeric(p,s) rounds half away from zero to s digits (Spark's decimal cast: HALF_UP); too wide is 22003
            return operand.cast(f"decimal({shape[0]},{shape[1]})").cast(SPARK_TYPES["numeric"])
        if target in ("jsonb", "json"):
            return operand if source in ("jsonb", "json") else F.parse_json(operand.cast("string"))
        if source in ("jsonb", "json") and target in ("text", "varchar"):
            return F.to_json(operand)
        if target == "bool" and source in ("text", "varchar", "unknown"):
            return F.lower(F.trim(operand)).cast("boolean")
        return operand.cast(SPARK_TYPES[target])

    def _arithmetic(self, node: exp.Expr) -> Column:
        left, right = self.column(node.this), self.column(node.expression)
        result = type_of(node, self.columns)
        if isinstance(node, exp.Add):
            return left + right
        if isinstance(node, exp.Sub):
            return left - right
        if isinstance(node, exp.Mul):
            return left * right
        if isinstance(node, exp.Mod):
            return left % right
        if result in ("int2", "int4", "int8"):
            # PostgreSQL divides integers truncating toward zero; Spark's `/` is always fractional.
            # (a - a % b) is an exact multiple of b (both truncate toward zero), and b = 0 still raises.
            return ((left - left % right) / right).cast(SPARK_TYPES[result])
        return left / right

    def _compared(self, node: exp.Expr, other: exp.Expr) -> Column:
        """One side of a comparison; a string literal compared with a date or timestamp column is read as that type
        here, in the document form the column travels in (days, microseconds), as PostgreSQL reads it."""
        if isinstance(node, exp.Literal) and node.is_string:
            other_type = self.type(other)
            if other_type == "date":
                return F.lit(date_literal_days(node.this))
            if other_type == "timestamp":
                return F.lit(timestamp_literal_micros(node.this))
        return self.column(node)

    def _substring(self, node: exp.Expr) -> Column:
        """substr(s, start[, length]) as PostgreSQL counts: the characters at positions start .. start+length-1 that
        exist (a start below 1 shortens the result; Spark would count a negative start from the end)."""
        text = self.column(node.this)
        start = self.column(node.args["start"]) if node.args.get("start") is not None else F.lit(1)
        first = F.greatest(start, F.lit(1))  # (greatest skips NULL: a NULL start or length gives NULL below)
        if node.args.get("length") is None:
            return F.when(start.isNotNull(), text.substr(first, F.lit(2**31 - 1)))
        length = self.column(node.args["length"]).cast("bigint")
        taken = F.greatest(start.cast("bigint") + length - first, F.lit(0)).cast("int")
        return F.when(start.isNotNull() & length.isNotNull(), text.substr(first, taken))

    def _case(self, node: exp.Case) -> Column:
        branches = node.args.get("ifs") or []
        subject = self.column(node.this) if node.this is not None else None
        result: Any = None
        for branch in branches:
            condition = self.column(branch.this)
            if subject is not None:
                condition = subject == condition
            value = self.column(branch.args["true"])
            result = F.when(condition, value) if result is None else result.when(condition, value)
        default = node.args.get("default")
        return result.otherwise(self.column(default)) if default is not None else result

    def _math(self, node: exp.Expr) -> Column:
        operand = self.column(node.this)
        result_type = SPARK_TYPES[type_of(node, self.columns)]
        if isinstance(node, exp.Abs):
            return F.abs(operand)
        if isinstance(node, exp.Floor):
            return F.floor(operand).cast(result_type)
        if isinstance(node, exp.Ceil):
            return F.ceil(operand).cast(result_type)
        decimals = node.args.get("decimals")
        scale = int(decimals.this) if isinstance(decimals, exp.Literal) else 0
        if not result_type.startswith("decimal"):
            return F.rint(operand)  # round(float8) is rint() in PostgreSQL: half to even
        return F.round(operand.cast("decimal(38,10)") if result_type.startswith("decimal") else operand, scale).cast(result_type)


def _timestamp_text(micros: Column) -> Column:
    """PostgreSQL's text of a timestamp given as UTC microseconds: seconds, then the fraction without trailing zeros."""
    fraction = F.regexp_replace(F.lpad(F.pmod(micros, F.lit(1_000_000)).cast("string"), 6, "0"), "0+$", "")
    seconds = F.date_format(F.timestamp_micros(micros), "yyyy-MM-dd HH:mm:ss")
    return F.concat(seconds, F.when(fraction == "", F.lit("")).otherwise(F.concat(F.lit("."), fraction)))


# Text forms PostgreSQL gives that Spark's cast to string does not (date and timestamp arrive in their document
# form: days and microseconds; timestamptz as a TIMESTAMP, shown as the UTC time: see docs/views.md).
TEXT_FORMATS: dict[str, Callable[[Column], Column]] = {
    "date": lambda days: F.date_format(F.date_from_unix_date(days.cast("int")), "yyyy-MM-dd"),
    "timestamp": _timestamp_text,
    "timestamptz": lambda ts: F.concat(_timestamp_text(F.unix_micros(ts)), F.lit("+00")),
    "bool": lambda b: F.when(b, F.lit("true")).when(~b, F.lit("false")),
}


def _spark_json_path(path: exp.Expr) -> str:
    steps = ["$"]
    for part in path.expressions:
        if isinstance(part, exp.JSONPathRoot):
            continue
        if isinstance(part, exp.JSONPathKey):
            key = str(part.this).replace("\\", "\\\\").replace("'", "\\'")
            steps.append(f"['{key}']")
        elif isinstance(part, exp.JSONPathSubscript):
            steps.append(f"[{int(part.this)}]")
        else:
            raise FeatureNotSupported(f"JSON path step {part.sql()} is not supported in views")
    return "".join(steps)


def doc_value(column: Column, pg_type: str) -> Column:
    """A column as the protocol carries values: jsonb as JSON text (parsed on the driver), timestamptz as
    microseconds, numeric as double."""
    if pg_type in ("jsonb", "json"):
        return F.to_json(column)
    if pg_type == "timestamptz":
        return F.unix_micros(column)
    if pg_type in ("numeric", "float4"):
        return column.cast("double")
    return column


def _from_doc(value: Any, pg_type: str) -> Any:
    if pg_type in ("jsonb", "json") and value is not None:
        return json.loads(value)
    return value


# ---------------------------------------------------------------------------------------------- changes

def prepare_changes(plan: ViewPlan, changes: DataFrame) -> DataFrame:
    """Parse jsonb columns into VARIANT and timestamptz micros into TIMESTAMP, once per change."""
    replacements: dict[str, Column] = {}
    for name, pg_type in plan.input.columns.items():
        if name not in changes.columns:
            continue
        if pg_type in ("jsonb", "json"):
            replacements[name] = F.parse_json(F.col(f"`{name}`"))
        elif pg_type == "timestamptz":
            replacements[name] = F.timestamp_micros(F.col(f"`{name}`"))
    return changes.withColumns(replacements) if replacements else changes


def view_documents(plan: ViewPlan, changes: DataFrame) -> list[tuple[list[Any], dict[str, Any]]]:
    """One transaction's changes -> [(key, partial document)], at most one per key."""
    frame = prepare_changes(plan, changes)
    translate = SparkExpressions(plan.input.columns)
    if plan.aggregating:
        from headrace.pipeline.view_partials import arrow_aggregate_documents, arrow_groupable

        if arrow_groupable(plan):  # no shuffle, WHERE as a column: see pipeline/view_partials.py
            return arrow_aggregate_documents(plan, frame, translate)
    if plan.filter is not None:
        frame = frame.where(translate(plan.filter))
    if plan.aggregating:
        return _aggregate_documents(plan, frame, translate)
    return _projection_documents(plan, frame, translate)


def _projection_documents(plan: ViewPlan, frame: DataFrame, translate: SparkExpressions) -> list[tuple[list[Any], dict[str, Any]]]:
    outputs = [doc_value(translate(o.expression), o.pg_type).alias(f"o{i}") for i, o in enumerate(plan.outputs)]
    rows = frame.select("hr_row", "hr_seq", "hr_diff", *outputs).toArrow().to_pylist()
    # Last change of each input row wins (no shuffle: the runtime stores each key once anyway).
    rows.sort(key=lambda r: (r["hr_seq"], r["hr_diff"]))
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        latest[row["hr_row"]] = row
    documents = []
    for key, row in latest.items():
        if row["hr_diff"] < 0:
            doc: dict[str, Any] = {KEY_FIELD: key, DELETED_FIELD: True}
        else:
            doc = {KEY_FIELD: key}
            for i, output in enumerate(plan.outputs):
                doc[f"o{i}"] = _from_doc(row[f"o{i}"], output.pg_type)
        documents.append(([key], doc))
    return documents


class _Projected:
    """Aggregate arguments and FILTERs evaluated once per change, in a projection before the aggregation.

    Without it Spark evaluates each argument in every aggregate using it, inside a HashAggregate that JSON
    access keeps out of whole-stage codegen: measured at 100k changes and 6 aggregates over `body->>'v'`, the
    projection first made the aggregation ~2x faster."""

    def __init__(self, plan: ViewPlan, translate: SparkExpressions) -> None:
        self.translate = translate
        self.names: dict[str, str] = {}
        self.columns: list[Column] = []
        for aggregate in plan.aggregates:
            for node in (*aggregate.args, *([aggregate.filter] if aggregate.filter is not None else [])):
                text = node.sql(dialect="postgres")
                if text not in self.names:
                    self.names[text] = name = f"hr_x{len(self.names)}"
                    self.columns.append(translate(node).alias(name))

    def __call__(self, node: exp.Expr) -> Column:
        name = self.names.get(node.sql(dialect="postgres"))
        return F.col(name) if name is not None else self.translate(node)


def _aggregate_documents(plan: ViewPlan, frame: DataFrame, translate: SparkExpressions) -> list[tuple[list[Any], dict[str, Any]]]:
    keys = [doc_value(translate(key), t).alias(f"k{i}") for i, (key, t) in enumerate(zip(plan.group_keys, plan.group_key_types))]
    projected = _Projected(plan, translate)
    frame = frame.select("hr_diff", "hr_seq", "hr_row", "hr_at", *keys, *projected.columns)
    columns = [F.sum("hr_diff").alias(ROWS_FIELD)]
    for aggregate in plan.aggregates:
        columns.extend(_partial_columns(aggregate, projected))  # type: ignore[arg-type]
    key_names = [f"k{i}" for i in range(len(keys))]
    grouped = frame.groupBy(*key_names).agg(*columns) if keys else frame.agg(*columns)
    return [partial_document(plan, row) for row in grouped.toArrow().to_pylist()
            if row[ROWS_FIELD] is not None]  # None: a global aggregate over no changes


def partial_document(plan: ViewPlan, row: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """([key], partial document) of one grouped row (k0.., the row count, each aggregate's partial columns),
    whether Spark or pyarrow (pipeline/view_partials.py) grouped it."""
    key_values = [_from_doc(row[f"k{i}"], t) for i, t in enumerate(plan.group_key_types)]
    key = _canonical(key_values)
    state: dict[str, Any] = {ROWS_FIELD: row[ROWS_FIELD]}
    for aggregate in plan.aggregates:
        partial = _partial_state(aggregate, row)
        if partial is not None:
            state[aggregate.field] = partial
    return [key], {KEY_FIELD: key, **{f"k{i}": v for i, v in enumerate(key_values)}, STATE_FIELD: state}


_SPARK_AGGREGATIONS = {"sum": lambda c: F.coalesce(F.sum(c), F.lit(0)), "min": F.min, "max": F.max}


def _partial_columns(aggregate: Aggregate, translate: SparkExpressions) -> list[Column]:
    from headrace.pipeline.view_partials import aggregate_inputs, contributions

    name, m = aggregate.field, aggregate.maintenance
    if m in (Maintenance.COUNT, Maintenance.SUM, Maintenance.BOOL_COUNTS, Maintenance.EXTREME):
        return [_SPARK_AGGREGATIONS[how](column).alias(field) for column, field, how in contributions(aggregate, translate)]
    args, condition = aggregate_inputs(aggregate, translate)
    diff = F.col("hr_diff")
    value = doc_value(args[0], aggregate.arg_types[0]) if args else F.lit(None)
    if m in (Maintenance.FIRST_WRITE, Maintenance.LAST_WRITE):
        by = F.min_by if m is Maintenance.FIRST_WRITE else F.max_by
        return [by(F.struct(value.alias("v")), F.when(condition, F.col("hr_seq"))).alias(f"{name}_w")]
    # List-shaped states: Spark gathers the group's changes, the driver folds them (view_aggregates.fold).
    fields = [F.col("hr_seq").alias("seq"), diff.alias("diff"), F.col("hr_row").alias("row"), F.col("hr_at").alias("at")]
    fields += [doc_value(arg, t).alias(f"x{i}") for i, (arg, t) in enumerate(zip(args, aggregate.arg_types))]
    return [F.collect_list(F.when(condition, F.struct(*fields))).alias(f"{name}_l")]


def _partial_state(aggregate: Aggregate, row: Mapping[str, Any]) -> Any:
    name, m = aggregate.field, aggregate.maintenance
    if m is Maintenance.COUNT:
        return row[f"{name}_n"]
    if m is Maintenance.SUM:
        total = row[f"{name}_s"]
        if isinstance(total, Decimal):  # sum(int8): exact decimal text, summed exactly by the reduction (numbers.py)
            total = str(int(total))
        return {"s": total, "n": row[f"{name}_n"]}
    if m is Maintenance.BOOL_COUNTS:
        return {"t": row[f"{name}_t"], "f": row[f"{name}_f"]}
    if m is Maintenance.EXTREME:
        return row[f"{name}_v"]
    if m in (Maintenance.FIRST_WRITE, Maintenance.LAST_WRITE):
        written = row[f"{name}_w"]
        return None if written is None else {"v": _from_doc(written["v"], aggregate.arg_types[0])}
    changes = [Change(seq=entry["seq"], diff=entry["diff"], row=entry["row"], at=entry["at"],
                      args=tuple(_from_doc(entry[f"x{i}"], t) for i, t in enumerate(aggregate.arg_types)))
               for entry in row[f"{name}_l"] or ()]
    return fold(aggregate, changes)


# ---------------------------------------------------------------------------------------------- sources

def source_changes(batch: DataFrame, replaced: DataFrame | None = None) -> DataFrame:
    """A webhook source micro-batch as a change stream.

    `batch`: the log source's rows (log_offset, received_at, idempotency_key, headers, body, ...); each is
    +1. `replaced`: the old versions of rows this batch replaces (same idempotency key), read from the log
    at each record's prev_offset, with a `replaced_by` column holding the replacing record's log_offset;
    each is -1, ordered just before its replacement."""
    inserted = batch.select(
        "*", F.lit(1).alias("hr_diff"), F.col("log_offset").alias("hr_seq"),
        F.concat(F.lit("["), F.col("log_offset").cast("string"), F.lit("]")).alias("hr_row"),
        F.col("log_offset").alias("hr_at"))
    if replaced is None:
        return inserted
    retracted = replaced.select(
        *[F.col(c) for c in batch.columns], F.lit(-1).alias("hr_diff"), F.col("replaced_by").alias("hr_seq"),
        F.concat(F.lit("["), F.col("log_offset").cast("string"), F.lit("]")).alias("hr_row"),
        F.col("log_offset").alias("hr_at"))
    return inserted.unionByName(retracted)
