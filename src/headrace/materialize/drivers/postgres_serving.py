"""The serving store's driver on the store PostgreSQL: the POSTGRES sink driver (drivers/postgres.py) with the
serving store's additions, so one driver serves both. Commit pattern: the remote store is authoritative, with
fencing, exactly as the sink's (COPY staging, one PostgreSQL transaction per commit, the fenced checkpoint update
last). What the serving store adds:
  * tables and changelogs are made by `PostgresServingStore.apply` (store/postgres_serving.py), in its layout
    (`public`, `headrace_internal`), and the checkpoints live in `headrace_internal.checkpoints`, not the sink's
    per-schema table, with no transaction history;
  * every write feeds the binding's changelog in the same statement, at the commit's timestamp (TablePlan's
    `changelog`): deletions and updates retract the old rows (DELETE / UPDATE ... RETURNING inside one statement
    with the changelog INSERT), new rows are COPYed into the table and into the changelog;
  * the checkpoint row records that timestamp as `committed_at` (what `snapshot` / SUBSCRIBE read as the
    materialization's position), and `note_committed` wakes the store's readers after the commit.

Why extend the sink driver rather than make drivers/serving.py generic over two stores: the sink already has the
PostgreSQL half (COPY staging, Loads as one JSON text, columnar Loads as CSV, the fence with concurrent Opens); the
serving driver's DuckDB SQL (registered Arrow tables, INSERT OR REPLACE, DuckDB's json()) shares no statement with
PostgreSQL. The additions are four hooks and the changelog statements of TablePlan (about 100 lines).

Quarantine, as the DuckDB driver does it: the records the pipeline quarantined (listed in the runtime checkpoint)
are written to headrace_internal.quarantine in the commit's transaction; and a source's new rows are inserted under
a savepoint: should PostgreSQL refuse some (text jsonb will not take, e.g. \\u0000: 22P02 / 22P05 / 22021, which
webhook/store_rules.py did not predict), the refused rows are found by bisection (COPYs into the temporary rows
table, each under a savepoint), quarantined with PostgreSQL's SQLSTATE and message, and the others inserted."""

from __future__ import annotations

from typing import Any

import psycopg
import pyarrow as pa
from psycopg.types.json import Jsonb

from headrace.errors import FeatureNotSupported, ServiceUnavailable
from headrace.materialize.drivers.postgres import _SESSION, RESOURCE_SCHEMA, PostgresTransactor
from headrace.materialize.drivers.postgres_sql import duckdb_type
from headrace.materialize.drivers.postgres_tables import TablePlan
from headrace.materialize.protocol import (
    PROTOCOL_VERSION, Applied, Apply, FieldConstraint, MaterializationSpec, Spec, SpecResponse, StartedCommit,
    Validate, Validated, ValidatedBinding, field_constraint)
from headrace.store.postgres_serving import PostgresServingStore, column_type, record_quarantined
from headrace.store.view_errors import commit_ended, commit_starting, record_view_errors
from headrace.store.serving import CHANGELOG_COLUMNS, CHECKPOINTS_TABLE, changelog_table, schema_and_table


class PostgresServingTransactor(PostgresTransactor):
    """Transactor of one runtime connection to the PostgreSQL serving store (see the module docstring)."""

    def __init__(self, store: PostgresServingStore) -> None:
        super().__init__()
        self._store = store
        self._refused: list[list[Any]] = []  # source rows refused in the open commit: quarantined with it

    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit:
        self._refused = []
        return super().start_commit(runtime_checkpoint)

    def _prepare(self, spec: MaterializationSpec) -> psycopg.Connection[Any]:
        for binding in spec.bindings:
            self._store.apply(binding)  # idempotent: a no-op once Apply ran
        try:
            conn = psycopg.connect(self._store.conninfo, autocommit=False, application_name="headrace-serving")
        except psycopg.OperationalError as exc:
            raise ServiceUnavailable(f"cannot connect to the store PostgreSQL: {str(exc).strip()}") from None
        conn.execute(_SESSION)
        conn.commit()
        return conn

    def _make_plans(self, spec: MaterializationSpec) -> list[TablePlan]:
        plans = []
        for index, binding in enumerate(spec.bindings):
            table_columns = self._store.columns(binding.resource_path)
            assert table_columns is not None  # applied in _prepare
            plans.append(TablePlan(index, *schema_and_table(binding.resource_path), binding, None,
                                   changelog=changelog_table(binding.resource_path),
                                   table_columns=list(table_columns)))
        return plans

    @property
    def _checkpoints_table(self) -> str:
        return CHECKPOINTS_TABLE

    def _commit_timestamp(self) -> int | None:
        return self._store.next_commit_timestamp()

    def _record_commit(self, cursor: psycopg.Cursor[Any], runtime_checkpoint: dict[str, Any],
                       timestamp: int | None) -> int:
        refused, self._refused = self._refused, []
        record_quarantined(cursor, self._name, runtime_checkpoint, refused)
        commit_ended(self)  # a previous commit of errors that failed is no longer in flight
        if record_view_errors(cursor, runtime_checkpoint, placeholder="%s"):  # store/view_errors.py
            commit_starting(self)  # ended by _committed
        cursor.execute(f"UPDATE {CHECKPOINTS_TABLE} SET checkpoint = %s, committed_at = %s "
                       "WHERE materialization = %s AND key_begin = %s AND key_end = %s AND fence = %s",
                       [Jsonb(runtime_checkpoint), timestamp, self._name, *self._key_range, self._fence])
        return cursor.rowcount

    def _committed(self) -> None:
        commit_ended(self)
        self._store.note_committed()  # readers (SUBSCRIBE, sinks, arrangements) catch up

    def _insert(self, cursor: psycopg.Cursor[Any], plan: TablePlan, rows: pa.Table, computed_document: bool,
                timestamp: int | None) -> None:
        """A source's rows under a savepoint, the ones PostgreSQL refuses quarantined (module docstring)."""
        if not _is_source_rows(plan, rows):
            plan.insert(cursor, rows, computed_document, timestamp)
            return
        cursor.execute("SAVEPOINT headrace_source_rows")
        try:
            plan.insert(cursor, rows, computed_document, timestamp)
            return
        except STORE_REFUSALS:
            cursor.execute("ROLLBACK TO SAVEPOINT headrace_source_rows")
        refused = _refused_rows(cursor, plan, rows)
        offsets = rows["log_offset"].to_pylist()
        arrivals = rows["received_at"].cast(pa.int64()).to_pylist() if "received_at" in rows.column_names \
            else [None] * rows.num_rows
        self._refused.extend([offsets[i], arrivals[i], sqlstate, reason] for i, (sqlstate, reason)
                             in sorted(refused.items()))
        kept = rows.filter(pa.array([i not in refused for i in range(rows.num_rows)]))
        if kept.num_rows:
            plan.insert(cursor, kept, computed_document, timestamp)


# What PostgreSQL refuses in a value's text: invalid input (22P02), a \u0000 escape jsonb cannot hold (22P05),
# bytes that are not UTF-8 (22021).
STORE_REFUSALS = (psycopg.errors.InvalidTextRepresentation, psycopg.errors.UntranslatableCharacter,
                  psycopg.errors.CharacterNotInRepertoire)


def _is_source_rows(plan: TablePlan, rows: pa.Table) -> bool:
    """A webhook source's table (keyed by log offset): rows the store refuses are quarantined, not fatal."""
    return ([c.name for c in plan.keys] == ["log_offset"] and plan.display.split(".")[-1].startswith("source_")
            and "log_offset" in rows.column_names)


def _refused_rows(cursor: psycopg.Cursor[Any], plan: TablePlan, rows: pa.Table) -> dict[int, tuple[str, str]]:
    """Row index -> (SQLSTATE, message) of every row PostgreSQL refuses, by bisection: a part that COPYs holds
    none; a refused part is halved until single rows remain (about 2 log2(n) COPYs per refused row)."""
    refused: dict[int, tuple[str, str]] = {}

    def bisect(start: int, length: int) -> None:
        cursor.execute("SAVEPOINT headrace_check")
        try:
            plan.check_rows(cursor, rows.slice(start, length))
            cursor.execute("ROLLBACK TO SAVEPOINT headrace_check")
            return
        except STORE_REFUSALS as exc:
            cursor.execute("ROLLBACK TO SAVEPOINT headrace_check")
            if length == 1:
                message = exc.diag.message_primary or str(exc).splitlines()[0]
                detail = f" ({exc.diag.message_detail})" if exc.diag.message_detail else ""
                refused[start] = (exc.sqlstate or "22P02", (message + detail)[:500])
                return
        half = length // 2
        bisect(start, half)
        bisect(start + half, length - half)

    if rows.num_rows:
        bisect(0, rows.num_rows)
    return refused


class PostgresServingConnector:
    """Spec, Validate and Apply of the PostgreSQL serving store (as drivers/serving.py's ServingConnector)."""

    def __init__(self, store: PostgresServingStore) -> None:
        self._store = store

    def spec(self, spec: Spec) -> SpecResponse:
        return SpecResponse(protocol=PROTOCOL_VERSION, config_schema={"type": "object"},
                            resource_config_schema=RESOURCE_SCHEMA)

    def validate(self, validate: Validate) -> Validated:
        """Key fields are required; names the changelog uses are forbidden; a type the store cannot hold, or
        one that differs from an existing column's, is incompatible; every other field is recommended."""
        answers = []
        for proposal in validate.bindings:
            existing = self._store.columns(proposal.resource_path) or {}
            constraints: dict[str, FieldConstraint] = {}
            for name, type_name in proposal.fields.items():
                try:
                    column_type(type_name)
                    incompatible = None
                except FeatureNotSupported:
                    incompatible = f"type {type_name} cannot be stored"
                canonical = duckdb_type(type_name)
                if incompatible is None and name in existing and existing[name][0] != canonical:
                    incompatible = f"the existing column has type {existing[name][0]}, not {canonical}"
                constraints[name] = field_constraint(
                    name, proposal.key,
                    forbidden="the name is reserved for the changelog" if name in CHANGELOG_COLUMNS else None,
                    incompatible=incompatible)
            answers.append(ValidatedBinding(proposal.resource_path, constraints, proposal.delta_updates))
        return Validated(tuple(answers))

    def apply(self, apply: Apply) -> Applied:
        """Create or migrate every binding's table and changelog; applying the same spec again does nothing."""
        actions: list[str] = []
        for binding in apply.materialization.bindings:
            actions += self._store.apply(binding)
        return Applied(action_description="; ".join(actions) if actions else "no changes")
