"""System relations that live in the server's memory, queryable in SQL like any relation:

    headrace_internal.webhook_counters   one row per webhook source (webhook/metrics.py)
    headrace_internal.webhook_requests   the last N requests of each source (webhook/request_log.py)
    headrace_internal.sink_status        one row per sink: state, position, lag, last error (sink/manager.py)
    headrace_internal.source_status      one row per source the pipeline runs: state, failures, last error
                                         (pipeline/status.py, reported by the pipeline process)
    headrace_internal.pipeline_status    one row: the pipeline process's state, restarts, last error (pipeline/status.py)
    headrace_internal.quarantined_records  log records the store refused, set aside (store/quarantine.py); the
                                         one relation read from the serving store itself (durable)
    headrace_internal.view_errors        rows materialized views cannot compute, with their SQLSTATE and message
                                         (store/view_errors.py; read from the serving store, DuckDB or PostgreSQL)

and, added by metrics/setup.py once the server's parts exist:

    headrace_internal.objects            every catalog object (catalog/system/objects.py)
    headrace_internal.object_dependencies  each object and the objects it reads (catalog/system/objects.py)
    headrace_internal.materializations   per source, table, view and sink: state, position, lag, freshness, last
                                         error, retries (metrics/materialization_status.py)
    headrace_internal.sessions           SQL sessions and their running statements (metrics/sessions.py)

The planner resolves them by name (`exists`); `bind` points the planned DuckDB SQL at a per-cursor
name, and `register` puts a fresh Arrow snapshot under that name on the cursor that runs the query,
so each query sees the counters as of its start and nothing is written to the serving store."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import duckdb
import pyarrow as pa
from sqlglot import exp, parse_one

from headrace.coordinator.responses import Column
from headrace.sql.select import SelectPlan
from headrace.pipeline.status import PIPELINE_COLUMNS, STATUS_COLUMNS, PipelineStatus
from headrace.store.query import describe_query, translate_error
from headrace.store.quarantine import COLUMNS as QUARANTINE_COLUMNS
from headrace.store.quarantine import quarantine_snapshot
from headrace.store.serving import ServingStore
from headrace.store.view_errors import RELATION_COLUMNS as VIEW_ERROR_COLUMNS
from headrace.store.view_errors import relation_rows as view_error_rows
from headrace.webhook.ingest import IngestRegistry
from headrace.webhook.metrics import COUNTER_COLUMNS, counter_rows
from headrace.webhook.request_log import REQUEST_COLUMNS, request_rows

SYSTEM_SCHEMA = "headrace_internal"
INSUFFICIENT_PRIVILEGE = "<insufficient privilege>"  # what pg_stat_activity shows of another role's query
_REGISTERED_PREFIX = "__headrace_system_"

_ARROW_TYPES = {
    "VARCHAR": pa.string(), "BIGINT": pa.int64(), "INTEGER": pa.int32(), "DOUBLE": pa.float64(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
}


@dataclasses.dataclass(frozen=True)
class SystemRelation:
    columns: tuple[tuple[str, str], ...]  # (name, DuckDB type)
    rows: Callable[[], Iterable[tuple[Any, ...]]]
    # Instead of `rows`: the snapshot read through the query's own cursor (a relation kept in the serving store).
    read: Callable[[duckdb.DuckDBPyConnection], pa.Table] | None = None
    # (column, role column): `column` is shown only to the role the row's `role column` names, as
    # pg_stat_activity shows `query` (store/system_relations_postgres.py makes the relation a view doing that);
    # the DuckDB serving store, whose snapshots do not know the reader, shows it to no one.
    restricted: tuple[str, str] | None = None

    def snapshot(self, cursor: duckdb.DuckDBPyConnection | None = None) -> pa.Table:
        if self.read is not None and cursor is not None:
            return self.read(cursor)
        rows = list(self.rows())
        if self.restricted is not None:
            hidden = [name for name, _ in self.columns].index(self.restricted[0])
            rows = [(*row[:hidden], INSUFFICIENT_PRIVILEGE, *row[hidden + 1:]) for row in rows]
        arrays = [pa.array([row[index] for row in rows], type=_ARROW_TYPES[type_name])
                  for index, (_, type_name) in enumerate(self.columns)]
        return pa.Table.from_arrays(arrays, names=[name for name, _ in self.columns])


class SystemTables:
    def __init__(self, registry: IngestRegistry, pipeline_status: PipelineStatus | None = None) -> None:
        self.pipeline_status = pipeline_status or PipelineStatus()
        self._relations = {
            "source_status": SystemRelation(STATUS_COLUMNS, self.pipeline_status.rows),
            "pipeline_status": SystemRelation(PIPELINE_COLUMNS, self.pipeline_status.pipeline_rows),
            "quarantined_records": SystemRelation(QUARANTINE_COLUMNS, tuple, read=quarantine_snapshot),
            "view_errors": SystemRelation(VIEW_ERROR_COLUMNS, view_error_rows),
            "webhook_counters": SystemRelation(
                COUNTER_COLUMNS, lambda: counter_rows((key, ingestor.metrics) for key, ingestor in registry.items())),
            "webhook_requests": SystemRelation(
                REQUEST_COLUMNS, lambda: request_rows((key, ingestor.requests) for key, ingestor in registry.items())),
        }

    def add(self, name: str, relation: SystemRelation) -> None:
        """Another in-memory relation (headrace_internal.sink_status: sink/manager.py)."""
        self._relations[name] = relation

    def exists(self, schema: str, name: str) -> bool:
        return schema == SYSTEM_SCHEMA and name in self._relations

    def relation(self, name: str) -> SystemRelation | None:
        return self._relations.get(name)

    def names(self) -> list[str]:
        return list(self._relations)

    def bind(self, plan: SelectPlan) -> SelectPlan:
        """Point references to system relations at the names `register` gives their snapshots."""
        if not any(name in plan.duckdb_sql for name in self._relations):
            return plan
        ast = parse_one(plan.duckdb_sql, dialect="duckdb")
        changed = False
        for table in list(ast.find_all(exp.Table)):
            if table.db == SYSTEM_SCHEMA and table.name in self._relations:
                alias = table.alias or table.name
                replacement = exp.Table(this=exp.to_identifier(_REGISTERED_PREFIX + table.name, quoted=True))
                replacement.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
                table.replace(replacement)
                changed = True
        return dataclasses.replace(plan, duckdb_sql=ast.sql(dialect="duckdb")) if changed else plan

    def register(self, cursor: duckdb.DuckDBPyConnection, plan: SelectPlan) -> None:
        """Register a fresh snapshot of each system relation the (bound) plan reads on `cursor`."""
        if _REGISTERED_PREFIX not in plan.duckdb_sql:
            return
        for name, relation in self._relations.items():
            if _REGISTERED_PREFIX + name in plan.duckdb_sql:
                cursor.register(_REGISTERED_PREFIX + name, relation.snapshot(cursor))

    def describe(self, store: ServingStore, plan: SelectPlan) -> tuple[Column, ...]:
        if _REGISTERED_PREFIX not in plan.duckdb_sql:
            return describe_query(store, plan)
        with store.cursor() as cursor:
            self.register(cursor, plan)
            try:
                relation = cursor.sql(plan.duckdb_sql, params=[None] * len(plan.param_types) or None)
            except duckdb.Error as exc:
                raise translate_error(exc) from None
            from headrace.store.query import _columns  # one place maps DuckDB types to PostgreSQL's

            return _columns(plan, relation.columns, [str(t) for t in relation.types])
