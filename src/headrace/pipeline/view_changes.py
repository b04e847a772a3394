"""Materialized views over a webhook source, maintained in the source's own transactions.

A view over a source is one more binding of the SOURCE's materialization: each micro-batch is one
transaction holding the source's rows and every view's partial documents, so they commit together
(and a replayed batch is skipped for all of them at once). Per batch:

  1. the batch's log records, plus the old versions of the rows they replace (read from the log at each
     record's `prev_offset`), become the source's change stream (`source_changes`: +1 per record, -1 per
     replaced row, the -1 ordered just before its replacement);
  2. per view, Spark computes one partial document per key from the changes (`view_documents`);
  3. the runtime reduces each with the stored document by the view's reduce schema (SchemaReducer.full)
     and calls the plan's `finalize` (which deletes a group when no input row is left in it).

Backfill: a view created while its source already holds rows starts from a full computation over the
source's rows. The runtime checkpoint lists the views whose state it includes (`views`); when the source's
query starts with a view missing from that list, one transaction first computes the view's partial
documents from the log up to the checkpoint's `log_end` (the live rows: every record not replaced by a
later one) and commits them with the checkpoint now listing the view. The stream then goes on from
`log_end`, so every row counts exactly once; a crash before that commit simply backfills again.

Columns follow the change-stream contract of pipeline/views.py: the source's columns (body as JSON text,
or text / bytes by BODY FORMAT; headers as JSON text; received_at as integer microseconds), log_offset, and
hr_diff / hr_seq / hr_row / hr_at added by `source_changes`."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from headrace.catalog.items import WebhookSource
from headrace.catalog.views import MaterializedView
from headrace.log.reader import read_records
from headrace.materialize.columnar import ColumnarDocuments
from headrace.materialize.protocol import Binding
from headrace.materialize.runtime import DerivedBinding
from headrace.materialize.sources import source_relation
from headrace.pipeline.quarantine import record_refusal
from headrace.pipeline.view_errors import (ERRORS_FIELD, DocumentsWithErrors, ErrorEntry, documents_isolating_errors,
                                           error_entries, is_data_error, isolate)
from headrace.sql.parser import parse_statement
from headrace.sql.view_serving import view_binding
from headrace.sql.view_chain import chain_refusal, row_changes, stored_fields
from headrace.sql.views import KEY_FIELD, InputRelation, ViewPlan, compile_view
from headrace.webhook.record import decode_fields
from headrace.webhook.rows import row_builder

BACKFILL_CHUNK_ROWS = 200_000  # live rows per Spark job while backfilling (bounds driver memory)
Document = dict[str, Any]


@dataclass(frozen=True)
class SourceView:
    """A view maintained as binding `index` of its source's materialization; `upstream`: for a view over a view,
    the binding index of the view it reads (its documents derive from that view's changes: `derived_bindings`)."""

    view: MaterializedView
    plan: ViewPlan
    index: int
    upstream: int | None = None

    @property
    def binding(self) -> Binding:
        return view_binding(self.plan, self.view.id)


def compile_source_views(source: WebhookSource, views: Sequence[MaterializedView],
                         first_index: int = 1) -> tuple[list[SourceView], list[tuple[MaterializedView, Exception]]]:
    """Plans of the views reading `source`, compiled as the coordinator compiled them (same statement, same
    input columns). Returns the views and those that failed to compile (logged by the caller, not maintained)."""
    relation = source_relation(source)
    by_name: dict[tuple[str, str], SourceView] = {}

    def lookup(schema: str, name: str) -> InputRelation | None:
        if (schema, name) == (source.schema, source.name):
            return relation
        upstream = by_name.get((schema, name))
        if upstream is None or chain_refusal(upstream.plan) is not None:
            return None
        columns = {o.name: o.pg_type for o in upstream.plan.outputs}
        return InputRelation(kind="view", item_id=upstream.view.id, name=upstream.view.name, columns=columns,
                             key=(KEY_FIELD,), append_only=upstream.plan.append_only)

    compiled: list[SourceView] = []
    failed: list[tuple[MaterializedView, Exception]] = []
    for view in views:  # in dependency order: a view's input view is compiled before it
        try:
            statement = parse_statement(view.create_sql)
            plan = compile_view(statement, lookup)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - one broken view must not stop its source
            failed.append((view, exc))
            continue
        upstream = by_name.get((view.input_schema, view.input_name))
        compiled.append(SourceView(view, plan, first_index + len(compiled),
                                   upstream.index if upstream is not None else None))
        by_name[(view.schema, view.name)] = compiled[-1]
    return compiled, failed


_SPARK_ARROW_TYPES = {"int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64(), "float4": pa.float64(),
                      "float8": pa.float64(), "numeric": pa.float64(), "text": pa.string(), "varchar": pa.string(),
                      "bool": pa.bool_(), "jsonb": pa.string(), "json": pa.string(), "timestamptz": pa.int64(),
                      # tables' exact types in their document form (store/table_types.py)
                      "date": pa.int64(), "timestamp": pa.int64(), "interval": pa.int64(), "uuid": pa.string()}


class _ChangeSequence:
    """Sequence numbers (arrival order) of derived changes: increasing across transactions and restarts."""

    def __init__(self) -> None:
        self._last = 0

    def take(self, count: int) -> int:
        first = max(self._last + 1, time.time_ns() // 1000)
        self._last = first + count
        return first


def derived_bindings(spark: Any, views: Sequence[SourceView]) -> list[DerivedBinding]:
    """The runtime's DerivedBinding of each view over a view: the upstream's changed documents become its public
    rows' changes (sql/view_chain.py), a small DataFrame from which Spark computes the view's partial documents."""
    from headrace.pipeline.views import view_documents

    index = {view.index: view for view in views}
    sequence = _ChangeSequence()
    derived = []
    for view in views:
        if view.upstream is None:
            continue
        upstream = index[view.upstream]

        def derive(changes: list[tuple[Document | None, Document | None]], checkpoint: dict[str, Any],
                   upstream: SourceView = upstream, view: SourceView = view) -> list[tuple[list[Any], Document]]:
            rows = row_changes(upstream.plan, changes, sequence.take(len(changes)))
            if not rows:
                return []
            fields = [(name, _SPARK_ARROW_TYPES.get(pg_type, pa.string()))
                      for name, _, pg_type in stored_fields(upstream.plan)]
            schema = pa.schema([*fields, ("hr_diff", pa.int32()), ("hr_seq", pa.int64()), ("hr_row", pa.string()),
                                ("hr_at", pa.int64())])
            table = pa.Table.from_pylist(rows, schema=schema)
            documents, failing = isolate(lambda part: view_documents(view.plan, spark.createDataFrame(part))
                                         if part.num_rows else [], table)
            if failing:  # errors of the downstream view, in this transaction's checkpoint (pipeline/view_errors.py)
                checkpoint.setdefault(ERRORS_FIELD, []).extend(error_entries(view.view.id, table, failing))
            return documents

        derived.append(DerivedBinding(upstream=upstream.index, binding=view.index, derive=derive))
    return derived


# ---------------------------------------------------------------------------------------------- rows

def input_table(source: WebhookSource, log_rows: pa.Table) -> pa.Table:
    """Log rows (log_offset, received_at, idempotency_key, headers, body) -> the source's columns as a
    view reads them, plus log_offset."""
    columns: dict[str, pa.Array | pa.ChunkedArray] = {"log_offset": log_rows["log_offset"].cast(pa.int64())}
    body = log_rows["body"].cast(pa.binary())
    columns["body"] = body if source.body_format == "bytes" else body.cast(pa.string())
    if source.include_headers or source.header_columns:
        # The row builder decides which headers a row keeps, exactly as the source's own table does.
        build = row_builder(source)
        rows = [build(0, None, orjson.loads(h) if h is not None else None, b)
                for h, b in zip(log_rows["headers"].to_pylist(), log_rows["body"].to_pylist())]
        if source.include_headers:
            columns["headers"] = pa.array([orjson.dumps(r["headers"]).decode() for r in rows], pa.string())
        for header in source.header_columns:
            columns[header.column] = pa.array([r[header.column] for r in rows],
                                              pa.binary() if header.as_bytes else pa.string())
    columns["received_at"] = log_rows["received_at"].cast(pa.int64())
    if source.idempotent_expr is not None:
        columns["idempotency_key"] = log_rows["idempotency_key"].cast(pa.string())
    return pa.table(columns)


_LOG_SCHEMA = pa.schema([("log_offset", pa.int64()), ("received_at", pa.int64()), ("idempotency_key", pa.string()),
                         ("headers", pa.string()), ("body", pa.binary())])


if TYPE_CHECKING:  # read_replaced's log: files or the log read service
    from headrace.log.access import LogAccess


def read_replaced(log_dir: Path | LogAccess, prev_offsets: Sequence[int], replaced_by: Sequence[int]) -> pa.Table:
    """The old rows a batch replaces, read from the log at their offsets (its files, or the log read service:
    log/access.py), with the replacing record's offset in `replaced_by`."""
    from headrace.log.access import FileLogAccess

    access = FileLogAccess(log_dir) if isinstance(log_dir, Path) else log_dir
    rows: dict[str, list[Any]] = {name: [] for name in _LOG_SCHEMA.names}
    for offset, payload in access.records_at(prev_offsets):  # LookupError when no record starts at one of them
        received_at_us, key, headers, body, _ = decode_fields(payload)
        for name, value in zip(_LOG_SCHEMA.names, (offset, received_at_us, key, headers, body)):
            rows[name].append(value)
    table = pa.table(rows, schema=_LOG_SCHEMA)
    return table.append_column("replaced_by", pa.array(list(replaced_by), pa.int64()))


def changes_frame(spark: Any, source: WebhookSource, batch: pa.Table, replaced: pa.Table | None) -> Any:
    """The batch (and the rows it replaces) as a Spark DataFrame of changes."""
    from headrace.pipeline.views import source_changes

    inserted = spark.createDataFrame(input_table(source, batch))
    retracted = None
    if replaced is not None and replaced.num_rows:
        old = input_table(source, replaced).append_column("replaced_by", replaced["replaced_by"])
        retracted = spark.createDataFrame(old)
    return source_changes(inserted, retracted)


def batch_changes(frame: Any, source: WebhookSource, batch: pa.Table, log_dir: Path | None) -> Any:
    """The micro-batch DataFrame Spark handed to foreachBatch (the log source's rows) as the change stream,
    computed on that frame rather than on one rebuilt from `batch` (its collected Arrow form, used here only to
    find the replaced rows). The old versions of replaced rows are read from the log and unioned as a small
    extra frame, only when the batch has replacements. A source that includes headers builds its header
    columns with the row builder (Python), so it goes the collected way (`changes_frame`)."""
    from pyspark.sql import functions as F

    from headrace.pipeline.views import source_changes

    replacing = pc.drop_null(batch["prev_offset"])
    replaced = None
    if len(replacing):
        if log_dir is None:
            raise LookupError("views over an IDEMPOTENT source need the log to read replaced rows")
        mask = pc.is_valid(batch["prev_offset"])
        replaced = read_replaced(log_dir, replacing.to_pylist(), pc.filter(batch["log_offset"], mask).to_pylist())
    if source.include_headers or source.header_columns:
        return changes_frame(frame.sparkSession, source, batch, replaced)
    inserted = frame.select(*_input_columns(source))
    retracted = None
    if replaced is not None and replaced.num_rows:
        old = input_table(source, replaced).append_column("replaced_by", replaced["replaced_by"])
        retracted = frame.sparkSession.createDataFrame(old)
    return source_changes(inserted, retracted)


def _input_columns(source: WebhookSource) -> list[Any]:
    """The source's columns as a view reads them, from the log source's frame (a source without header columns)."""
    from pyspark.sql import functions as F

    body = F.col("body") if source.body_format == "bytes" else F.col("body").cast("string")
    columns = [F.col("log_offset"), body.alias("body"), F.col("received_at")]
    if source.idempotent_expr is not None:
        columns.append(F.col("idempotency_key"))
    return columns


class OneJobBatch:
    """A micro-batch collected by ONE Spark job that yields both the log rows and every view's projection.

    Eligible when the source has no header columns (built in Python) and every view reading the source directly is
    arrow-groupable (pipeline/view_partials.py: its partials are pyarrow sums/extremes of projected columns). The
    log rows pass through under `hr_src_` names while the views' columns are computed from the same rows, so Spark
    reads and decodes the batch once with no persist, and no second job groups it. The old versions of replaced
    rows (read from the log after the collection) are projected by a small second job only when there are any.
    Measured on a loaded local[2] at 5k events/s: the second job plus persist/unpersist cost 2-5 s per batch."""

    RAW = "hr_src_"

    def __init__(self, source: WebhookSource, views: Sequence[SourceView], columnar: bool = True) -> None:
        from headrace.pipeline.view_columnar import ViewColumnarReducer, columnar_reducible
        from headrace.pipeline.view_partials import GroupedProjection
        from headrace.pipeline.views import SparkExpressions

        self.source = source
        direct = [view for view in views if view.upstream is None]
        self.projections = [(view.index, GroupedProjection(view.plan, SparkExpressions(view.plan.input.columns),
                                                           f"v{view.index}_")) for view in direct]
        self.prepare_plan = direct[0].plan if direct else None
        self._view_columns: list[Any] | None = None  # built at the first batch, reused (see collect)
        self._passthrough: tuple[list[str], list[Any], list[Any]] | None = None
        # Views reduced as columns (pipeline/view_columnar.py): not those a view over a view reads (the runtime
        # derives the downstream view's changes from each upstream document).
        read_by_views = {view.upstream for view in views if view.upstream is not None}
        self.reducers = {view.index: ViewColumnarReducer(view.plan) for view in direct
                         if columnar and view.index not in read_by_views and columnar_reducible(view.plan)}

    @staticmethod
    def eligible(source: WebhookSource, views: Sequence[SourceView]) -> bool:
        from headrace.pipeline.view_partials import arrow_groupable

        direct = [view for view in views if view.upstream is None]
        return bool(direct) and not (source.include_headers or source.header_columns) \
            and all(arrow_groupable(view.plan) for view in direct)

    def _projected(self, changes: Any, passthrough: list[Any]) -> Any:
        from headrace.pipeline.views import prepare_changes

        assert self.prepare_plan is not None  # every direct view reads the source: same input columns
        prepared = prepare_changes(self.prepare_plan, changes)
        if self._view_columns is None:
            self._view_columns = [c for _, projection in self.projections for c in projection.columns()]
        return prepared.select(*passthrough, *self._view_columns)

    def collect(self, frame: Any) -> tuple[pa.Table, pa.Table]:
        """(the log rows as foreachBatch's frame holds them, the views' projected columns), from one Spark job.

        The Columns are built once and reused by every batch (they name columns, bound to no DataFrame): building
        them is a py4j call per expression node, measured at 0.1-0.3 s per batch on a loaded local[2]."""
        from pyspark.sql import functions as F

        from headrace.pipeline.views import source_changes

        names = frame.columns
        if self._passthrough is None or self._passthrough[0] != names:
            self._passthrough = (names, [*_input_columns(self.source), *[F.col(n).alias(self.RAW + n) for n in names]],
                                 [F.col(self.RAW + n) for n in names])
        _, inserted_columns, raw_columns = self._passthrough
        wide = self._projected(source_changes(frame.select(*inserted_columns)), raw_columns).toArrow()
        raw = [self.RAW + n for n in names]
        table = wide.select(raw).rename_columns(names)
        return table, wide.drop_columns(raw)

    def project(self, spark: Any, batch: pa.Table) -> pa.Table:
        """The views' projected columns of log rows already collected as Arrow (the batch loop's, which read them
        itself): only the source's input columns go to Spark and only the projection comes back, where `collect`
        also passes every log column through the job to have the rows."""
        from headrace.pipeline.views import source_changes

        needed = [name for name in ("log_offset", "body", "received_at", "idempotency_key") if name in batch.column_names]
        frame = spark.createDataFrame(batch.select(needed))
        return self._projected(source_changes(frame.select(*_input_columns(self.source))), []).toArrow()

    def documents(self, spark: Any, batch: pa.Table, projected: pa.Table,
                  log_dir: Path | None) -> tuple[list[tuple[int, list[Any], Document]], list[ColumnarDocuments]]:
        """Every direct view's partials: the batch's projection, plus retractions of replaced rows; as documents, or as
        columns for the views in `reducers`."""
        from headrace.pipeline.view_columnar import partials_table

        from pyspark.sql import functions as F

        from headrace.pipeline.views import source_changes

        replacing = pc.drop_null(batch["prev_offset"])
        if len(replacing):
            if log_dir is None:
                raise LookupError("views over an IDEMPOTENT source need the log to read replaced rows")
            mask = pc.is_valid(batch["prev_offset"])
            replaced = read_replaced(log_dir, replacing.to_pylist(), pc.filter(batch["log_offset"], mask).to_pylist())
            old = spark.createDataFrame(input_table(self.source, replaced))
            retracted = self._projected(source_changes(old).withColumn("hr_diff", F.lit(-1)), []).toArrow()
            projected = pa.concat_tables([projected, retracted.cast(projected.schema)])
        documents, columnar = [], []
        for index, projection in self.projections:
            reducer = self.reducers.get(index)
            if reducer is None:
                documents.extend((index, key, doc) for key, doc in projection.documents(projected))
                continue
            grouped = projection.grouped(projected)
            if grouped is not None and grouped.num_rows:
                columnar.append(ColumnarDocuments(index, partials_table(projection.plan, grouped), reducer))
        return documents, columnar


def view_documents_isolating(views: Sequence[SourceView], changes: Any) -> tuple[list[tuple[int, list[Any], Document]],
                                                                                   list[ErrorEntry]]:
    """`view_documents_of`, with the changes a view cannot evaluate left out of it and returned as its error entries
    (pipeline/view_errors.py): one Spark job per view while nothing fails; the changes collected and bisected when
    something does."""
    try:
        return list(view_documents_of(views, changes)), []
    except Exception as exc:  # noqa: BLE001 - data errors only, the rest re-raised
        if not is_data_error(exc):
            raise
    return documents_isolating_changes([view for view in views if view.upstream is None], changes.sparkSession,
                                       changes.toArrow())


def documents_isolating_changes(views: Sequence[SourceView], spark: Any, changes: pa.Table,
                                ) -> tuple[list[tuple[int, list[Any], Document]], list[ErrorEntry]]:
    """Each view's documents over the collected `changes` it can evaluate, and the error entries of the rest."""
    from headrace.pipeline.views import view_documents

    def compute(view: SourceView, part: pa.Table) -> list[tuple[int, list[Any], Document]]:
        if part.num_rows == 0:
            return []
        return [(view.index, key, doc) for key, doc in view_documents(view.plan, spark.createDataFrame(part))]

    return documents_isolating_errors(views, changes, compute)


def view_documents_of(views: Sequence[SourceView], changes: Any) -> Iterator[tuple[int, list[Any], Document]]:
    """Every view's partial documents for one transaction's changes, as (binding, key, doc)."""
    from headrace.pipeline.views import view_documents

    views = [view for view in views if view.upstream is None]  # views over views derive in the runtime
    if len(views) > 1:
        changes = changes.cache()  # one evaluation of the local data for every view
    try:
        for view in views:
            for key, doc in view_documents(view.plan, changes):
                yield view.index, key, doc
    finally:
        if len(views) > 1:
            changes.unpersist()


# ---------------------------------------------------------------------------------------------- backfill

def backfill_documents(spark: Any, source: WebhookSource, log_dir: Path, end: int,
                       views: Sequence[SourceView]) -> DocumentsWithErrors:
    """Partial documents of `views` over the source's live rows in the log before `end` (see module docstring), with
    the errors of rows a view cannot evaluate (committed with them: DocumentsWithErrors).
    Chunks are separate Spark jobs; the runtime combines their documents per key (partials reduce)."""
    if end <= 0 or not views:
        return DocumentsWithErrors()
    replaced: set[int] = set()
    for _, payload in read_records(log_dir, 0, end):  # pass 1: which rows were replaced later
        prev = decode_fields(payload)[4]
        if prev is not None:
            replaced.add(prev)
    documents = DocumentsWithErrors()
    errors: list[ErrorEntry] = []
    chunk: dict[str, list[Any]] = {name: [] for name in _LOG_SCHEMA.names}
    for offset, payload in read_records(log_dir, 0, end):  # pass 2: the live rows, as +1 changes
        if offset in replaced:
            continue
        received_at_us, key, headers, body, _ = decode_fields(payload)
        if record_refusal(source, key, headers, body) is not None:
            continue  # quarantined: in no view (pipeline/quarantine.py)
        for name, value in zip(_LOG_SCHEMA.names, (offset, received_at_us, key, headers, body)):
            chunk[name].append(value)
        if len(chunk["log_offset"]) >= BACKFILL_CHUNK_ROWS:
            _add_chunk_documents(spark, source, chunk, views, documents, errors)
            chunk = {name: [] for name in _LOG_SCHEMA.names}
    if chunk["log_offset"]:
        _add_chunk_documents(spark, source, chunk, views, documents, errors)
    return DocumentsWithErrors(documents, errors)


def _add_chunk_documents(spark: Any, source: WebhookSource, chunk: dict[str, list[Any]], views: Sequence[SourceView],
                         documents: list[tuple[int, list[Any], Document]], errors: list[ErrorEntry]) -> None:
    changes = changes_frame(spark, source, pa.table(chunk, schema=_LOG_SCHEMA), None)
    found, found_errors = view_documents_isolating(views, changes)
    documents.extend(found)
    errors.extend(found_errors)
