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

Not carried over from the DuckDB driver: the quarantine of source rows whose JSON the store refuses
(store/quarantine.py is DuckDB SQL); here such a row fails its transaction with DataError (jsonb refuses what
DuckDB's json() does not, e.g. \\u0000)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from headrace.errors import FeatureNotSupported, ServiceUnavailable
from headrace.materialize.drivers.postgres import _SESSION, RESOURCE_SCHEMA, PostgresTransactor
from headrace.materialize.drivers.postgres_sql import duckdb_type
from headrace.materialize.drivers.postgres_tables import TablePlan
from headrace.materialize.protocol import (
    PROTOCOL_VERSION, Applied, Apply, FieldConstraint, MaterializationSpec, Spec, SpecResponse, Validate,
    Validated, ValidatedBinding, field_constraint)
from headrace.store.postgres_serving import PostgresServingStore, column_type
from headrace.store.serving import CHANGELOG_COLUMNS, CHECKPOINTS_TABLE, changelog_table, schema_and_table


class PostgresServingTransactor(PostgresTransactor):
    """Transactor of one runtime connection to the PostgreSQL serving store (see the module docstring)."""

    def __init__(self, store: PostgresServingStore) -> None:
        super().__init__()
        self._store = store

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
        cursor.execute(f"UPDATE {CHECKPOINTS_TABLE} SET checkpoint = %s, committed_at = %s "
                       "WHERE materialization = %s AND key_begin = %s AND key_end = %s AND fence = %s",
                       [Jsonb(runtime_checkpoint), timestamp, self._name, *self._key_range, self._fence])
        return cursor.rowcount

    def _committed(self) -> None:
        self._store.note_committed()  # readers (SUBSCRIBE, sinks, arrangements) catch up


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
