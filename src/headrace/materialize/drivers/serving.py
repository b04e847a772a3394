"""Driver for the DuckDB serving store. Commit pattern: the remote store is authoritative, with fencing.

The serving store keeps, per materialization key range, a row of `headrace_internal.checkpoints` holding the
runtime checkpoint and a fence. `open` bumps the fence in its own transaction (fencing off every earlier runtime
of an overlapping range) and returns the stored checkpoint, so the store, not the runtime's log, says where to
resume. `start_commit` applies all staged Stores and writes the checkpoint in ONE DuckDB transaction whose last
statement updates the checkpoint only where the fence is still ours: zero rows updated means a newer runtime
opened meanwhile, so the transaction rolls back and FencedOff is raised. Data and checkpoint are therefore
durable together when StartedCommit is sent, and a zombie runtime can never commit. Within that transaction, per
binding: one DELETE for Stores with `delete`, one INSERT for new keys, one INSERT OR REPLACE for existing keys,
and the binding's changelog rows at the commit's timestamp (-1 for each old row replaced or deleted, +1 for each
new row; see store/serving.py); the checkpoint row records the timestamp as `committed_at`. Acknowledged is sent
right after StartedCommit (nothing is left to apply). Delta-updates bindings append rows.

`ServingConnector` answers the control requests: Spec, Validate (field constraints) and Apply (create/migrate).

Documents live as columns: the binding's key and value columns (JSON as text, TIMESTAMPTZ from/to integer
microseconds). Loaded documents are rebuilt from those columns, so fields outside them are not kept.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from headrace.errors import DataError, FeatureNotSupported
from headrace.materialize.protocol import (
    PROTOCOL_VERSION, Acknowledged, Applied, Apply, Binding, FencedOff, FieldConstraint, Load, LoadColumns, Loaded,
    LoadedColumns, MaterializationError, Open, Opened, Spec, SpecResponse, StartedCommit, Store, StoreColumns,
    Validate, Validated, ValidatedBinding, field_constraint)
from headrace.store.quarantine import quarantine_entries, record_quarantined, refused_rows
from headrace.store.view_errors import commit_ended, commit_starting, record_view_errors
from headrace.store.table_types import arrow_type as exact_arrow_type
from headrace.store.table_types import document_select_sql, is_exact_store_type
from headrace.store.table_types import to_arrow as exact_to_arrow
from headrace.store.serving import (
    CHANGELOG_COLUMNS,
    CHECKPOINTS_TABLE,
    SUPPORTED_TYPES,
    ServingStore,
    changelog_table,
    qualified_name,
    quote_ident,
)

_ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),  # JSON text; DuckDB casts it on insert
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),  # built straight from integer microseconds
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "BLOB": pa.binary(),  # bytes (BODY FORMAT BYTES, INCLUDE HEADER ... BYTES)
}
_STAGED = "headrace_staged_rows"  # names of Arrow tables registered on this transactor's own cursor
_KEYS = "headrace_staged_keys"
_COLUMNAR = "headrace_columnar_input"  # a StoreColumns table, while it is converted to the staged form
_json_value = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_json_key = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode  # canonical


def _dump_value(value: Any) -> str:
    """JSON text by orjson (3x the json module here); the json module for what orjson refuses (big integers)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return _json_value(value)


def _dump_key(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return _json_key(value)


def _load_json(text: str | None) -> Any:
    if text is None:
        return None
    return orjson.loads(text)  # note: an integer beyond 64 bits comes back as a float (orjson)


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    duckdb_type: str
    arrow_type: pa.DataType
    to_arrow: Callable[[Any], Any] | None  # Python value -> Arrow input (None: as is)
    select_sql: str  # expression reading the column back as a JSON-able value
    from_sql: Callable[[Any], Any] | None  # fetched value -> document value (None: as is)


def _column(name: str, duckdb_type: str, is_key: bool) -> _Column:
    type_name = duckdb_type.upper()
    if type_name not in _ARROW_TYPES and is_exact_store_type(type_name):  # tables' numeric, date, ... (exact)
        return _Column(name, type_name, exact_arrow_type(type_name), lambda v: exact_to_arrow(type_name, v),
                       document_select_sql(type_name, f"t.{quote_ident(name)}"), None)
    if type_name not in _ARROW_TYPES:
        raise FeatureNotSupported(f"column type {type_name} of {name!r} is not supported by the serving store")
    quoted = f"t.{quote_ident(name)}"
    if type_name == "JSON":
        dump = _dump_key if is_key else _dump_value
        return _Column(name, type_name, _ARROW_TYPES[type_name], lambda v: None if v is None else dump(v),
                       f"CAST({quoted} AS VARCHAR)", _load_json)
    if type_name == "TIMESTAMPTZ":
        return _Column(name, type_name, _ARROW_TYPES[type_name], None, f"epoch_us({quoted})", None)
    if type_name == "BLOB":  # the protocol is JSON: bytes travel as base64 text both ways
        return _Column(name, type_name, _ARROW_TYPES[type_name],
                       lambda v: None if v is None else base64.b64decode(v), f"base64({quoted})", None)
    return _Column(name, type_name, _ARROW_TYPES[type_name], None, quoted, None)


class _BindingPlan:
    """The SQL and Arrow schemas of one binding, prepared once per open."""

    def __init__(self, binding: Binding, table_columns: list[str]) -> None:
        self.binding = binding
        self.table = qualified_name(binding.resource_path)
        changelog = changelog_table(binding.resource_path)
        self.keys = [_column(c, binding.column_types[c], True) for c in binding.key]
        self.values = [_column(c, binding.column_types[c], False) for c in binding.values]
        columns = self.keys + self.values
        column_list = ", ".join(quote_ident(c.name) for c in columns)
        key_match = " AND ".join(
            f"t.{quote_ident(c.name)} = CAST(k.{quote_ident(c.name)} AS {c.duckdb_type})" for c in self.keys)
        self.load_sql = (f"SELECT {', '.join(c.select_sql for c in columns)} "
                         f"FROM {self.table} AS t JOIN {_KEYS} AS k ON {key_match}")
        self.delete_sql = f"DELETE FROM {self.table} AS t USING {_KEYS} AS k WHERE {key_match}"
        self.insert_sql = f"INSERT INTO {self.table} ({column_list}) SELECT {column_list} FROM {_STAGED}"
        self.upsert_sql = f"INSERT OR REPLACE INTO {self.table} ({column_list}) SELECT {column_list} FROM {_STAGED}"
        # Changelog: -1 for the old rows (every column of the table, so it matches what was stored), +1 for new.
        every_column = ", ".join(quote_ident(c) for c in table_columns)
        old_columns = ", ".join(f"t.{quote_ident(c)}" for c in table_columns)
        self.retract_sql = {name: f"INSERT INTO {changelog} (hr_timestamp, hr_diff, {every_column}) "
                                  f"SELECT $1, -1, {old_columns} FROM {self.table} AS t "
                                  f"JOIN {name} AS k ON {key_match}" for name in (_KEYS, _STAGED)}
        self.add_sql = (f"INSERT INTO {changelog} (hr_timestamp, hr_diff, {column_list}) "
                        f"SELECT $1, 1, {column_list} FROM {_STAGED}")
        self.columns = columns

    def keys_table(self, keys: list[list[Any]]) -> pa.Table:
        return pa.table({c.name: _arrow_array(c, [key[i] for key in keys]) for i, c in enumerate(self.keys)})

    def rows_table(self, stores: list[Store]) -> pa.Table:
        arrays = {c.name: _arrow_array(c, [s.key[i] for s in stores]) for i, c in enumerate(self.keys)}
        for i, c in enumerate(self.values):
            arrays[c.name] = _arrow_array(c, [s.values[i] for s in stores])
        return pa.table(arrays)

    def columnar_table(self, cursor: duckdb.DuckDBPyConnection, table: pa.Table, keys_only: bool = False,
                       refused: list[list[Any]] | None = None) -> pa.Table:
        """A StoreColumns table in the staged form of `rows_table`: the binding's columns in order, each cast to its
        Arrow type (int64 microseconds -> timestamp; an absent value column -> NULLs); JSON text is validated and
        normalized by DuckDB's json() (as the JSON path's orjson would print the parsed value).

        `refused` (a source's rows): instead of failing the whole table on JSON the store refuses, the refused rows
        are found by bisection, left out, and appended there as quarantine entries (store/quarantine.py)."""
        columns = self.keys if keys_only else self.columns
        arrays: dict[str, pa.Array | pa.ChunkedArray] = {}
        json_columns = []
        for column in columns:
            if column.name not in table.column_names:
                if column in self.keys:
                    raise DataError(f"columnar Store for {self.table} lacks key column {column.name!r}")
                arrays[column.name] = pa.nulls(table.num_rows, column.arrow_type)
                continue
            values = table[column.name]
            try:
                if column.duckdb_type == "JSON":
                    json_columns.append(column.name)
                    arrays[column.name] = values.cast(pa.string())
                elif column.duckdb_type == "TIMESTAMPTZ" and pa.types.is_integer(values.type):
                    arrays[column.name] = values.cast(pa.int64()).cast(column.arrow_type)
                else:
                    arrays[column.name] = values.cast(column.arrow_type)
            except _CONVERSION_ERRORS as exc:
                raise DataError(f"column {column.name!r} ({column.duckdb_type}) cannot hold a {values.type} column: "
                                f"{exc}", hint=_EXPECTED.get(column.duckdb_type)) from exc
        converted = pa.table(arrays)
        if not json_columns:
            return converted
        select = ", ".join(f"CAST(json({quote_ident(c.name)}) AS VARCHAR) AS {quote_ident(c.name)}"
                           if c.name in json_columns else quote_ident(c.name) for c in columns)
        try:
            result = _convert_json(cursor, select, converted)
        except (duckdb.ConversionException, duckdb.InvalidInputException) as exc:
            if refused is None or "log_offset" not in converted.column_names:
                raise DataError(f"a JSON column of {self.table} holds text that is not JSON: {exc}") from exc
            bad = refused_rows(lambda part: _convert_json(cursor, select, part), converted, _JSON_REFUSALS)
            refused.extend(quarantine_entries(converted, bad))
            kept = converted.filter(pa.array([index not in bad for index in range(converted.num_rows)]))
            result = _convert_json(cursor, select, kept)
        return result.cast(converted.schema)

    @property
    def is_source_rows(self) -> bool:
        """A webhook source's table (keyed by log offset): rows the store refuses are quarantined, not fatal."""
        return self.binding.key == ("log_offset",) and self.binding.resource_path[-1].startswith("source_")

    def loaded(self, binding_index: int, table: pa.Table) -> list[Loaded]:
        """Loaded documents from the load query's Arrow result, converted column by column (fewer Python calls
        than row by row)."""
        columns = []
        for column, values in zip(self.columns, table.columns):
            python_values = values.to_pylist()
            if column.from_sql is not None:
                python_values = [column.from_sql(v) for v in python_values]
            columns.append(python_values)
        names = [c.name for c in self.columns]
        key_count = len(self.keys)
        return [Loaded(binding_index, list(row[:key_count]), dict(zip(names, row))) for row in zip(*columns)]


_JSON_REFUSALS = (duckdb.ConversionException, duckdb.InvalidInputException)


def _convert_json(cursor: duckdb.DuckDBPyConnection, select: str, table: pa.Table) -> pa.Table:
    cursor.register(_COLUMNAR, table)
    try:
        return cursor.execute(f"SELECT {select} FROM {_COLUMNAR}").fetch_arrow_table()
    finally:
        cursor.unregister(_COLUMNAR)


def _columnar_load_sql(plan: _BindingPlan) -> str:
    """The load query of a columnar Load: StoreColumns' conventions, so a loaded row can be stored back as it is."""
    selects = []
    for column in plan.columns:
        quoted = f"t.{quote_ident(column.name)}"
        if column.duckdb_type == "JSON":
            quoted = f"CAST({quoted} AS VARCHAR)"
        elif column.duckdb_type == "TIMESTAMPTZ":
            quoted = f"epoch_us({quoted})"
        selects.append(f"{quoted} AS {quote_ident(column.name)}")
    return plan.load_sql.replace(plan.load_sql[:plan.load_sql.index(" FROM ")], f"SELECT {', '.join(selects)}", 1)


def _arrow_array(column: _Column, values: list[Any]) -> pa.Array:
    try:
        return _convert(column, values)
    except _CONVERSION_ERRORS as exc:
        culprit = next((v for v in values if not _converts(column, v)), "?")
        raise DataError(f"column {column.name!r} ({column.duckdb_type}) cannot hold {culprit!r}: {exc}",
                        hint=_EXPECTED.get(column.duckdb_type)) from exc


_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)
_EXPECTED = {"VARCHAR": "expected a string", "JSON": "expected any JSON value",
             "TIMESTAMPTZ": "expected integer microseconds since the epoch (UTC)", "BIGINT": "expected an integer",
             "INTEGER": "expected a 32-bit integer", "DOUBLE": "expected a number", "BOOLEAN": "expected a boolean",
             "BLOB": "expected base64 text of the bytes"}


def _convert(column: _Column, values: list[Any]) -> pa.Array:
    if column.to_arrow is not None:
        values = [column.to_arrow(v) for v in values]
    return pa.array(values, type=column.arrow_type)


def _converts(column: _Column, value: Any) -> bool:
    """Whether one value converts on its own (to name the culprit in an error)."""
    try:
        _convert(column, [value])
    except _CONVERSION_ERRORS:
        return False
    return True


@dataclass(slots=True)
class _StagedRows:
    """One binding's Stores of the open transaction, as Arrow tables appended per hand-over batch."""

    deleted_keys: list[pa.Table] = field(default_factory=list)
    new_rows: list[pa.Table] = field(default_factory=list)
    existing_rows: list[pa.Table] = field(default_factory=list)


class ServingTransactor:
    """Transactor of one runtime connection to the serving store (see module docstring for the pattern)."""

    def __init__(self, store: ServingStore) -> None:
        self._store = store
        self._cursor: duckdb.DuckDBPyConnection | None = None
        self._plans: list[_BindingPlan] = []
        self._name = ""
        self._key_range = (0, 0)
        self._fence = 0
        self._staged: dict[int, _StagedRows] = {}  # per binding index
        self._refused: list[list[Any]] = []  # source rows the store refused in this transaction: quarantined

    def open(self, open: Open) -> Opened:
        self._plans = []
        for binding in open.spec.bindings:
            self._store.apply(binding)  # idempotent: a no-op once Apply ran
            table_columns = self._store.columns(binding.resource_path)
            assert table_columns is not None
            self._plans.append(_BindingPlan(binding, list(table_columns)))
        self._name = open.spec.name
        self._key_range = (open.key_begin, open.key_end)
        self._cursor = cursor = self._store.cursor()
        cursor.begin()
        try:
            checkpoint = self._fence_off_others(cursor)
            cursor.commit()
        except BaseException:
            cursor.rollback()
            raise
        return Opened(runtime_checkpoint=None if checkpoint is None else json.loads(checkpoint))

    def _fence_off_others(self, cursor: duckdb.DuckDBPyConnection) -> str | None:
        """Bump the fence of every overlapping range (as Flow's SQL drivers do, so split parents are fenced
        too), then take the narrowest covering row's fence and checkpoint; insert our row if it is absent."""
        begin, end = self._key_range
        cursor.execute(f"UPDATE {CHECKPOINTS_TABLE} SET fence = fence + 1 "
                       "WHERE materialization = ? AND key_begin <= ? AND key_end >= ?", [self._name, end, begin])
        covering = cursor.execute(
            f"SELECT key_begin, key_end, fence, checkpoint FROM {CHECKPOINTS_TABLE} "
            "WHERE materialization = ? AND key_begin <= ? AND key_end >= ? "
            "ORDER BY key_end - key_begin LIMIT 1", [self._name, begin, end]).fetchone()
        checkpoint: str | None = None if covering is None else covering[3]
        if covering is not None and (covering[0], covering[1]) == (begin, end):
            self._fence = int(covering[2])
            return checkpoint
        # A new range inherits the covering parent's (bumped) fence and checkpoint; a new materialization starts.
        self._fence = 1 if covering is None else int(covering[2])
        cursor.execute(f"INSERT INTO {CHECKPOINTS_TABLE} (materialization, key_begin, key_end, fence, checkpoint) "
                       "VALUES (?, ?, ?, ?, ?)",
                       [self._name, begin, end, self._fence, checkpoint])
        return checkpoint

    def load(self, loads: list[Load]) -> Iterable[Loaded]:
        """One join per binding against an Arrow table of the requested keys; absent keys yield nothing."""
        cursor = self._active()
        keys_by_binding: dict[int, list[list[Any]]] = {}
        for load in loads:
            keys_by_binding.setdefault(load.binding, []).append(load.key)
        loaded: list[Loaded] = []
        for binding_index, keys in keys_by_binding.items():
            plan = self._plans[binding_index]
            cursor.register(_KEYS, plan.keys_table(keys))
            try:
                result = cursor.execute(plan.load_sql).fetch_arrow_table()
            finally:
                cursor.unregister(_KEYS)
            loaded.extend(plan.loaded(binding_index, result))
        return loaded

    def load_columns(self, request: LoadColumns) -> LoadedColumns:
        """A columnar Load: one join against the requested keys, answered as Arrow without per-row Python (JSON as
        text, TIMESTAMPTZ as int64 microseconds, other columns as DuckDB returns them)."""
        cursor = self._active()
        plan = self._plans[request.binding]
        cursor.register(_KEYS, plan.columnar_table(cursor, request.keys, keys_only=True))
        try:
            docs = cursor.execute(_columnar_load_sql(plan)).fetch_arrow_table()
        finally:
            cursor.unregister(_KEYS)
        return LoadedColumns(request.binding, docs)

    def store(self, stores: list[Store]) -> None:
        """Convert each handed-over batch to Arrow at once: staged rows then cost columnar bytes, not Python
        objects (which would also make every cyclic-GC pass of the server rescan them)."""
        by_binding: dict[int, list[Store]] = {}
        for store in stores:
            by_binding.setdefault(store.binding, []).append(store)
        for binding_index, group in by_binding.items():
            plan = self._plans[binding_index]
            staged = self._staged.setdefault(binding_index, _StagedRows())
            if plan.binding.delta_updates:
                if any(s.delete for s in group):
                    raise FeatureNotSupported("deletions cannot be stored in a delta-updates (append-only) table")
                staged.new_rows.append(plan.rows_table(group))
                continue
            deleted = [s.key for s in group if s.delete]
            new = [s for s in group if not s.delete and not s.exists]
            existing = [s for s in group if not s.delete and s.exists]
            if deleted:
                staged.deleted_keys.append(plan.keys_table(deleted))
            if new:
                staged.new_rows.append(plan.rows_table(new))
            if existing:
                staged.existing_rows.append(plan.rows_table(existing))

    def store_columns(self, message: StoreColumns) -> None:
        """A columnar Store (protocol.StoreColumns): its tables join the staged rows as they are."""
        plan = self._plans[message.binding]
        cursor = self._active()
        staged = self._staged.setdefault(message.binding, _StagedRows())
        if plan.binding.delta_updates and (message.deleted is not None or message.updated is not None):
            raise FeatureNotSupported("a delta-updates (append-only) table takes new rows only")
        for table, target, keys_only in ((message.deleted, staged.deleted_keys, True),
                                         (message.rows, staged.new_rows, False),
                                         (message.updated, staged.existing_rows, False)):
            if table is not None and table.num_rows:
                refused = self._refused if plan.is_source_rows and not keys_only else None
                target.append(plan.columnar_table(cursor, table, keys_only, refused))

    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit:
        """Commit staged Stores and the checkpoint in one transaction, checkpoint (fence check) last."""
        cursor = self._active()
        staged, self._staged = self._staged, {}
        refused, self._refused = self._refused, []
        timestamp = self._store.next_commit_timestamp()
        cursor.begin()
        try:
            for binding_index, stores in staged.items():
                self._apply_stores(cursor, self._plans[binding_index], stores, timestamp)
            record_quarantined(cursor, self._name, runtime_checkpoint, refused)  # rows set aside, if any
            errors_changed = record_view_errors(cursor, runtime_checkpoint)  # views' errors (store/view_errors.py)
            updated = cursor.execute(
                f"UPDATE {CHECKPOINTS_TABLE} SET checkpoint = ?, committed_at = ? "
                "WHERE materialization = ? AND key_begin = ? AND key_end = ? AND fence = ?",
                [json.dumps(runtime_checkpoint, separators=(",", ":")), timestamp, self._name, *self._key_range,
                 self._fence]).fetchone()
            if updated is None or updated[0] != 1:
                raise self._fenced_off()
            if errors_changed:
                commit_starting(self)
            try:
                cursor.commit()
            finally:
                if errors_changed:
                    commit_ended(self)
            self._store.note_committed()  # in-memory indexes catch up (store/arrangements.py)
        except duckdb.TransactionException:
            # A write conflict with another runtime's open or commit is fencing too; anything else is re-raised.
            cursor.rollback()
            if self._current_fence() != self._fence:
                raise self._fenced_off() from None
            raise
        except BaseException:
            cursor.rollback()
            raise
        return StartedCommit(state=None)

    @staticmethod
    def _apply_stores(cursor: duckdb.DuckDBPyConnection, plan: _BindingPlan, staged: _StagedRows,
                      timestamp: int) -> None:
        """Deletions, then new rows by plain INSERT, then existing rows by INSERT OR REPLACE (an in-place update),
        each with its changelog rows: old rows retracted before they change, new rows added.

        Not DELETE + INSERT for updates: in DuckDB 1.4 deleting 100k keyed rows from a 400k-row table took
        3.9 s, the in-place upsert 0.1 s. A plain INSERT for new keys keeps a PRIMARY KEY violation loud if a
        row exists that Load did not see (that would mean a second writer)."""
        for name, tables, sql, retract, add in (
                (_KEYS, staged.deleted_keys, plan.delete_sql, True, False),
                (_STAGED, staged.new_rows, plan.insert_sql, False, True),
                (_STAGED, staged.existing_rows, plan.upsert_sql, True, True)):
            if tables:
                cursor.register(name, pa.concat_tables(tables))
                try:
                    if retract:
                        cursor.execute(plan.retract_sql[name], [timestamp])
                    cursor.execute(sql)
                    if add:
                        cursor.execute(plan.add_sql, [timestamp])
                finally:
                    cursor.unregister(name)

    def acknowledge(self) -> Acknowledged:
        return Acknowledged(state=None)  # start_commit already committed; nothing is left to apply

    def close(self) -> None:
        self._staged = {}  # uncommitted Stores are simply dropped: nothing of them reached the database
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    def _fenced_off(self) -> FencedOff:
        return FencedOff(f"materialization {self._name} fenced off by another runtime (fence {self._fence})")

    def _current_fence(self) -> int | None:
        row = self._active().execute(
            f"SELECT fence FROM {CHECKPOINTS_TABLE} WHERE materialization = ? AND key_begin = ? AND key_end = ?",
            [self._name, *self._key_range]).fetchone()
        return None if row is None else int(row[0])

    def _active(self) -> duckdb.DuckDBPyConnection:
        if self._cursor is None:
            raise MaterializationError(f"transactor of {self._name or 'a materialization'} is not open")
        return self._cursor


class ServingConnector:
    """Spec, Validate and Apply for the serving store (see the module docstring)."""

    def __init__(self, store: ServingStore) -> None:
        self._store = store

    def spec(self, spec: Spec) -> SpecResponse:
        return SpecResponse(protocol=PROTOCOL_VERSION, config_schema={"type": "object"}, resource_config_schema={
            "type": "object", "required": ["table"],
            "properties": {"schema": {"type": "string", "default": "public"}, "table": {"type": "string"},
                           "delta_updates": {"type": "boolean", "default": False, "x-delta-updates": True}}})

    def validate(self, validate: Validate) -> Validated:
        """Key fields are required; names the changelog uses are forbidden; a type the store cannot hold, or
        one that differs from an existing column's, is incompatible; every other field is recommended."""
        answers = []
        for proposal in validate.bindings:
            existing = self._store.columns(proposal.resource_path) or {}
            constraints: dict[str, FieldConstraint] = {}
            for name, type_name in proposal.fields.items():
                type_name = type_name.upper()
                constraints[name] = field_constraint(
                    name, proposal.key,
                    forbidden="the name is reserved for the changelog" if name in CHANGELOG_COLUMNS else None,
                    incompatible=f"type {type_name} cannot be stored" if type_name not in SUPPORTED_TYPES
                    else f"the existing column has type {existing[name][0]}, not {type_name}"
                    if name in existing and existing[name][0] != type_name else None)
            answers.append(ValidatedBinding(proposal.resource_path, constraints, proposal.delta_updates))
        return Validated(tuple(answers))

    def apply(self, apply: Apply) -> Applied:
        """Create or migrate every binding's table and changelog; applying the same spec again does nothing."""
        actions: list[str] = []
        for binding in apply.materialization.bindings:
            actions += self._store.apply(binding)
        return Applied(action_description="; ".join(actions) if actions else "no changes")
