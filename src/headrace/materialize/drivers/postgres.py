"""The POSTGRES sink driver. Commit pattern: the remote store is authoritative, with fencing.

Config (`MaterializationSpec.config` / `Validate.config`): `{"url": "postgresql://...", "document_column": name}`
(the latter optional: a jsonb column holding each row's full document). `Binding.resource_path` is (schema, table).

PostgreSQL holds, per materialization key range, a row of `headrace_sink_checkpoints` (in the schema of the first
binding's table) with the runtime checkpoint and a fence. `open` bumps the fence of every overlapping range in one
PostgreSQL transaction (fencing off every earlier runtime) and returns the stored checkpoint (None if the range never
committed). Stores are staged in the driver as Arrow tables; `start_commit` applies the whole transaction in ONE
PostgreSQL transaction: per binding, deletions (keys COPYed into a temporary table, one DELETE ... USING), updates
(rows COPYed into a temporary table, one UPDATE ... FROM) and new keys (COPY straight into the table); then the last
statement updates the checkpoint row only WHERE the fence is still ours and, only then, appends the commit to the
history `headrace_sink_transactions` (one row per committed transaction; the newest 100,000 per materialization are
kept, pruned every 1,000 commits of a connection, so at most 100,999 stay).
Zero rows updated means a newer runtime opened: the transaction rolls back and FencedOff is raised, so a zombie
commits nothing.

Guarantee: exactly once. When StartedCommit is sent, the transaction's rows and its checkpoint are committed together
(durable as PostgreSQL's commit is); a crash or lost connection before then leaves nothing of the transaction (nothing
touches PostgreSQL before StartCommit), and the next Open returns the last committed checkpoint. A crash while the
commit is in flight leaves it applied whole or not at all, and Open's checkpoint says which. Nothing is left to apply
at Acknowledge. Delta-updates bindings are append-only tables without a primary key (COPY only; exactly once as well,
by the same checkpoint).

Loads are answered at Flush, read-committed, with one query per binding (none when the table is empty): the keys are
COPYed into a temporary table and joined. Row-path documents come back as ONE JSON text built by PostgreSQL, each
naming its Load by number (so its key is exactly the Load's); columnar Loads as CSV parsed by pyarrow. A Store with
exists=False must find its key absent (COPY fails loudly on a duplicate key: a second writer); an update of a key
someone deleted meanwhile changes nothing. Columns of the table the binding does not name are left as they are (NULL
in new rows). Types and value conventions: postgres_sql.py; tables and statements: postgres_tables.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
import pyarrow as pa
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from headrace.errors import DataError, FeatureNotSupported, InvalidParameterValue, ServiceUnavailable
from headrace.materialize.drivers.postgres_sql import (
    Column,
    duckdb_type,
    dump_json,
    ident,
    pg_type,
    staged_from_arrow,
    staged_from_values,
    staged_type,
)
from headrace.materialize.drivers.postgres_tables import (
    CHECKPOINTS,
    HISTORY,
    TablePlan,
    apply_binding,
    ensure_driver_tables,
    existing_columns,
)
from headrace.materialize.protocol import (
    FIELD_FORBIDDEN, INCOMPATIBLE, LOCATION_RECOMMENDED, LOCATION_REQUIRED, PROTOCOL_VERSION, Acknowledged, Applied,
    Apply, FencedOff, FieldConstraint, Load, LoadColumns, Loaded, LoadedColumns, MaterializationError,
    MaterializationSpec, Open, Opened, Spec, SpecResponse, StartedCommit, Store, StoreColumns, Validate, Validated,
    ValidatedBinding, field_constraint)

HISTORY_LIMIT = 100_000  # history rows kept per materialization
PRUNE_EVERY = 1_000  # commits of one connection between prunes of the history
LOAD_CHUNK = 50_000  # keys per Load query: its documents come back as one JSON text (PostgreSQL's limit: 1 GB)
APPLICATION_NAME = "headrace-sink"
_CONFIG_KEYS = ("url", "document_column")
# UTC and ISO: COPY payloads carry timestamptz as UTC wall clocks, documents read dates as ISO text. Bulk joins of a
# transaction's keys: work_mem keeps a 100,000-key hash join in one batch, temp_buffers the staging tables in memory
# (set before the session's first temporary table, which fixes temp_buffers).
_SESSION = ("SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET extra_float_digits = 1; SET work_mem = '64MB'; "
            "SET temp_buffers = '256MB'")

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["url"], "additionalProperties": False,
    "properties": {"url": {"type": "string", "description": "libpq connection URL", "secret": True},
                   "document_column": {"type": "string", "description": "jsonb column holding the full document"}}}
RESOURCE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["table"],
    "properties": {"schema": {"type": "string", "default": "public"}, "table": {"type": "string"},
                   "delta_updates": {"type": "boolean", "default": False, "x-delta-updates": True}}}


def parse_config(config: dict[str, Any]) -> tuple[str, str | None]:
    """(url, document column) of an endpoint config; never echoes the URL (it may hold a password)."""
    unknown = sorted(set(config) - set(_CONFIG_KEYS))
    if unknown:
        raise InvalidParameterValue(f"unknown POSTGRES sink option(s) {', '.join(unknown)} "
                                    f"(expected {', '.join(_CONFIG_KEYS)})")
    url = config.get("url")
    if not isinstance(url, str) or not url.strip():
        raise InvalidParameterValue("the POSTGRES sink needs a url option (postgresql://user@host:port/database)")
    document_column = config.get("document_column")
    if document_column is not None and (not isinstance(document_column, str) or not document_column):
        raise InvalidParameterValue("document_column must be a column name")
    if document_column is not None:
        ident(document_column)
    return url, document_column


def connect(config: dict[str, Any]) -> psycopg.Connection[Any]:
    url, _ = parse_config(config)
    try:
        where = conninfo_to_dict(url)
    except psycopg.Error:
        raise InvalidParameterValue("the url option is not a valid PostgreSQL connection URL") from None
    target = f"{where.get('host', 'localhost')}:{where.get('port', 5432)}/{where.get('dbname', '')}"
    # Named in pg_stat_activity unless the URL names it; a URL's own connect_timeout wins too.
    options = {name: value for name, value in (("application_name", APPLICATION_NAME), ("connect_timeout", 10))
               if name not in where}
    try:
        conn = psycopg.connect(url, autocommit=False, **options)
    except psycopg.OperationalError as exc:  # libpq's message names host and port, never the password
        # PostgreSQL's own code for a server it cannot reach (postgres_fdw, dblink): 08001
        raise ServiceUnavailable(f"cannot connect to PostgreSQL at {target}: {str(exc).strip()}",
                                 sqlstate="08001") from None
    conn.execute(_SESSION)
    conn.commit()
    return conn


def _sql_error(exc: psycopg.Error, doing: str) -> Exception:
    message = f"PostgreSQL sink: {doing} failed: {str(exc).strip()}"
    if isinstance(exc, (psycopg.DataError, psycopg.IntegrityError)):
        return DataError(message)
    if isinstance(exc, psycopg.OperationalError):
        return ServiceUnavailable(message)
    return MaterializationError(message)


def _schema_of(spec: MaterializationSpec) -> str:
    """Where the driver's own tables live: the schema of the first binding's table."""
    return resource(spec.bindings[0].resource_path)[0] if spec.bindings else "public"


def resource(path: tuple[str, ...]) -> tuple[str, str]:
    if len(path) == 1:
        return "public", path[0]
    if len(path) != 2:
        raise InvalidParameterValue(f"a POSTGRES sink resource is (schema, table), not {'.'.join(path)}")
    return path[0], path[1]


class PostgresConnector:
    """Spec, Validate and Apply (each on its own short connection)."""

    def spec(self, spec: Spec) -> SpecResponse:
        return SpecResponse(PROTOCOL_VERSION, CONFIG_SCHEMA, RESOURCE_SCHEMA)

    def validate(self, validate: Validate) -> Validated:
        """Keys LOCATION_REQUIRED, other fields LOCATION_RECOMMENDED; a type with no PostgreSQL equivalent or
        differing from an existing column INCOMPATIBLE; the document column's name FIELD_FORBIDDEN."""
        _, document_column = parse_config(validate.config)
        answers = []
        with connect(validate.config) as conn:
            for proposal in validate.bindings:
                existing = existing_columns(conn, *resource(proposal.resource_path))
                constraints: dict[str, FieldConstraint] = {}
                for name, type_name in proposal.fields.items():
                    canonical = duckdb_type(type_name)
                    have = existing.get(name)
                    constraints[name] = field_constraint(
                        name, proposal.key,
                        forbidden="the name of the document column" if name == document_column else None,
                        incompatible=f"type {type_name} has no PostgreSQL equivalent" if canonical is None
                        else f"the existing column has type {have}, not {pg_type(canonical)}"
                        if have is not None and have != pg_type(canonical) else None)
                answers.append(ValidatedBinding(proposal.resource_path, constraints, proposal.delta_updates))
        return Validated(tuple(answers))

    def apply(self, apply: Apply) -> Applied:
        """Create the schema, tables and the driver's tables, add new value columns; "no changes" when none."""
        actions = apply_spec(apply.materialization)
        return Applied(action_description="; ".join(actions) if actions else "no changes")


def apply_spec(spec: MaterializationSpec) -> list[str]:
    _, document_column = parse_config(spec.config)
    with connect(spec.config) as conn:
        try:
            actions = ensure_driver_tables(conn, _schema_of(spec))
            for binding in spec.bindings:
                actions += apply_binding(conn, *resource(binding.resource_path), binding, document_column)
            conn.commit()
        except psycopg.Error as exc:
            raise _sql_error(exc, "apply") from exc
    return actions


class _Staged:
    """One binding's Stores of the open transaction: (kind, has document, CSV-ready table) in arrival order."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, bool, pa.Table]] = []

    def add(self, kind: str, with_document: bool, table: pa.Table) -> None:
        if table.num_rows:
            self.parts.append((kind, with_document, table))

    def tables(self, kind: str, with_document: bool) -> pa.Table | None:
        tables = [t for k, d, t in self.parts if k == kind and d == with_document]
        if len(tables) > 1 and any(t.schema != tables[0].schema for t in tables):
            # a timestamp column staged as text in some parts (it held +-infinity: postgres_sql._with_infinities)
            text = {f.name for t in tables for f in t.schema if pa.types.is_string(f.type)}
            tables = [t.cast(pa.schema([pa.field(f.name, pa.string()) if f.name in text else f for f in t.schema]))
                      for t in tables]
        return (pa.concat_tables(tables) if len(tables) > 1 else tables[0]) if tables else None


class PostgresTransactor:
    """Transactor of one runtime connection: one psycopg connection, autocommit off (see module docstring)."""

    def __init__(self, history_limit: int = HISTORY_LIMIT, prune_every: int = PRUNE_EVERY) -> None:
        if history_limit < 2 or prune_every < 1:
            raise ValueError("history_limit must be at least 2 and prune_every at least 1")
        self._history_limit = history_limit
        self._prune_every = prune_every
        self._conn: psycopg.Connection[Any] | None = None
        self._plans: list[TablePlan] = []
        self._name = ""
        self._key_range = (0, 0)
        self._fence = 0
        self._schema = ""
        self._staged: dict[int, _Staged] = {}
        self._commits = 0

    @classmethod
    def factory(cls, open: Open) -> PostgresTransactor:
        return cls()

    def open(self, open: Open) -> Opened:
        spec = open.spec
        self._conn = conn = self._prepare(spec)
        self._name, self._key_range, self._schema = spec.name, (open.key_begin, open.key_end), _schema_of(spec)
        try:
            self._plans = self._make_plans(spec)
            for plan in self._plans:
                conn.execute(plan.create_temporary_sql)
            checkpoint = self._fence_off_others(conn)
            conn.commit()
        except psycopg.Error as exc:
            raise _sql_error(exc, "open") from exc
        return Opened(runtime_checkpoint=checkpoint)

    # The hooks the serving store's transactor (drivers/postgres_serving.py) overrides.

    def _prepare(self, spec: MaterializationSpec) -> psycopg.Connection[Any]:
        """Apply the spec (idempotent: nothing to do once Apply ran; refuses a table that no longer fits) and
        connect."""
        apply_spec(spec)
        return connect(spec.config)

    def _make_plans(self, spec: MaterializationSpec) -> list[TablePlan]:
        _, document_column = parse_config(spec.config)
        return [TablePlan(i, *resource(b.resource_path), b, document_column) for i, b in enumerate(spec.bindings)]

    @property
    def _checkpoints_table(self) -> str:
        return f"{ident(self._schema)}.{CHECKPOINTS}"

    def _commit_timestamp(self) -> int | None:
        """The commit's timestamp for changelog rows (None: the sink keeps no changelog)."""
        return None

    def _record_commit(self, cursor: psycopg.Cursor[Any], runtime_checkpoint: dict[str, Any],
                       timestamp: int | None) -> int:
        """The transaction's last statement: the fenced checkpoint update and, only if it matched, the history
        row. Returns the checkpoint rows updated (1, or 0 when fenced off)."""
        if self._commits % self._prune_every == 0:
            self._prune_history(cursor)
        history = f"{ident(self._schema)}.{HISTORY}"
        cursor.execute(
            f"WITH ours AS (UPDATE {self._checkpoints_table} SET checkpoint = %s, committed_at = now() "
            "WHERE materialization = %s AND key_begin = %s AND key_end = %s AND fence = %s "
            "RETURNING materialization, key_begin, key_end, fence, checkpoint, committed_at) "
            f"INSERT INTO {history} (materialization, key_begin, key_end, fence, checkpoint, committed_at) "
            "SELECT * FROM ours",
            [Jsonb(runtime_checkpoint), self._name, *self._key_range, self._fence])
        return cursor.rowcount

    def _committed(self) -> None:
        """Called once a commit is durable."""

    def _insert(self, cursor: psycopg.Cursor[Any], plan: TablePlan, rows: pa.Table, computed_document: bool,
                timestamp: int | None) -> None:
        plan.insert(cursor, rows, computed_document, timestamp)

    def _fence_off_others(self, conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
        """Bump the fence of every overlapping range (split parents too, as Flow's SQL drivers do), then take the
        narrowest covering row's fence and checkpoint; a new range's row inherits them."""
        begin, end = self._key_range
        table = self._checkpoints_table
        for _ in range(2):  # twice if another runtime inserted the new range's row meanwhile: then fence it off
            conn.execute(f"UPDATE {table} SET fence = fence + 1 "
                         "WHERE materialization = %s AND key_begin <= %s AND key_end >= %s", [self._name, end, begin])
            covering = conn.execute(
                f"SELECT key_begin, key_end, fence, checkpoint FROM {table} "
                "WHERE materialization = %s AND key_begin <= %s AND key_end >= %s "
                "ORDER BY key_end - key_begin LIMIT 1", [self._name, begin, end]).fetchone()
            checkpoint = None if covering is None else covering[3]
            if covering is not None and (covering[0], covering[1]) == (begin, end):
                self._fence = int(covering[2])
                return checkpoint
            self._fence = 1 if covering is None else int(covering[2])
            inserted = conn.execute(
                f"INSERT INTO {table} (materialization, key_begin, key_end, fence, checkpoint) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [self._name, begin, end, self._fence, None if checkpoint is None else Jsonb(checkpoint)])
            if inserted.rowcount == 1:
                return checkpoint
        raise MaterializationError(f"materialization {self._name}: its checkpoint row keeps changing (concurrent "
                                   "Opens); retry")

    # ------------------------------------------------------------------------------------------ loads

    def load(self, loads: list[Load]) -> Iterable[Loaded]:
        """One query per binding (per LOAD_CHUNK keys): the keys, numbered, COPYed into a temporary table and
        joined; each answer names its Load by number, so it carries the key exactly as the runtime sent it."""
        conn = self._active()
        by_binding: dict[int, list[Load]] = {}
        for load in loads:
            by_binding.setdefault(load.binding, []).append(load)
        loaded: list[Loaded] = []
        try:
            with conn.cursor() as cursor:
                for binding, group in by_binding.items():
                    plan = self._plans[binding]
                    if plan.is_empty(cursor):
                        continue
                    for start in range(0, len(group), LOAD_CHUNK):
                        chunk = group[start:start + LOAD_CHUNK]
                        columns = list(zip(*(load.key for load in chunk)))
                        keys = {c.name: staged_from_values(c, columns[i]) for i, c in enumerate(plan.keys)}
                        plan.copy_keys(cursor, pa.table({**keys, "ord": pa.array(range(len(chunk)), pa.int64())}),
                                       with_ord=True)
                        loaded += [Loaded(binding, chunk[ord_].key, doc) for ord_, doc in plan.load_documents(cursor)]
            self._end(commit=True)  # ends the read (and empties the keys table)
        except psycopg.Error as exc:
            self._end(commit=False)
            raise _sql_error(exc, "load") from exc
        return loaded

    def load_columns(self, request: LoadColumns) -> LoadedColumns:
        conn = self._active()
        plan = self._plans[request.binding]
        keys = self._staged_table(plan, request.keys, plan.keys)
        try:
            with conn.cursor() as cursor:
                if plan.is_empty(cursor):
                    docs = plan.load_columns(None)
                else:
                    plan.copy_keys(cursor, keys, with_ord=False)
                    docs = plan.load_columns(cursor)
            self._end(commit=True)
        except psycopg.Error as exc:
            self._end(commit=False)
            raise _sql_error(exc, "columnar load") from exc
        return LoadedColumns(request.binding, docs)

    # ------------------------------------------------------------------------------------------ stores

    def store(self, stores: list[Store]) -> None:
        """Convert each handed-over batch to CSV-ready Arrow columns at once (one pa.array call per column)."""
        by_binding: dict[int, list[Store]] = {}
        for store in stores:
            by_binding.setdefault(store.binding, []).append(store)
        for binding, group in by_binding.items():
            plan = self._plans[binding]
            staged = self._staged.setdefault(binding, _Staged())
            if plan.delta:
                if any(s.delete for s in group):
                    raise FeatureNotSupported("deletions cannot be stored in a delta-updates (append-only) table")
                staged.add("new", plan.document is not None, self._rows_of(plan, group))
                continue
            deleted = list(zip(*(s.key for s in group if s.delete)))  # per key column
            if deleted:
                staged.add("deleted", False, pa.table({c.name: staged_from_values(c, deleted[i])
                                                       for i, c in enumerate(plan.keys)}))
            for kind, exists in (("new", False), ("updated", True)):
                chosen = [s for s in group if not s.delete and s.exists is exists]
                if chosen:
                    staged.add(kind, plan.document is not None, self._rows_of(plan, chosen))

    @staticmethod
    def _rows_of(plan: TablePlan, stores: list[Store]) -> pa.Table:
        keys = list(zip(*(s.key for s in stores)))  # transposed in C: a tuple per column
        values = list(zip(*(s.values for s in stores))) if plan.values else []
        arrays = {c.name: staged_from_values(c, keys[i]) for i, c in enumerate(plan.keys)}
        for i, c in enumerate(plan.values):
            arrays[c.name] = staged_from_values(c, values[i])
        if plan.document is not None:
            arrays[plan.document] = pa.array([dump_json(s.doc) for s in stores], pa.string())
        return pa.table(arrays)

    def store_columns(self, message: StoreColumns) -> None:
        plan = self._plans[message.binding]
        staged = self._staged.setdefault(message.binding, _Staged())
        if plan.delta and (message.deleted is not None or message.updated is not None):
            raise FeatureNotSupported("a delta-updates (append-only) table takes new rows only")
        for kind, table, columns in (("deleted", message.deleted, plan.keys), ("new", message.rows, plan.columns),
                                     ("updated", message.updated, plan.columns)):
            if table is not None and table.num_rows:
                staged.add(kind, False, self._staged_table(plan, table, columns))

    @staticmethod
    def _staged_table(plan: TablePlan, table: pa.Table, columns: list[Column]) -> pa.Table:
        arrays: dict[str, Any] = {}
        for c in columns:
            if c.name in table.column_names:
                arrays[c.name] = staged_from_arrow(c, table[c.name])
            elif c in plan.keys:
                raise DataError(f"columnar Store for {plan.display} lacks key column {c.name!r}")
            else:
                arrays[c.name] = pa.nulls(table.num_rows, staged_type(c))
        return pa.table(arrays)

    # ------------------------------------------------------------------------------------------ commit

    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit:
        """Apply every staged Store and the checkpoint in one transaction, the fenced checkpoint update last."""
        conn = self._active()
        staged, self._staged = self._staged, {}
        timestamp = self._commit_timestamp()
        try:
            with conn.cursor() as cursor:
                for binding, parts in staged.items():
                    plan = self._plans[binding]
                    for with_document in (False, True):
                        deleted = parts.tables("deleted", with_document)
                        if deleted is not None:
                            plan.delete(cursor, deleted, timestamp)
                        updated = parts.tables("updated", with_document)
                        if updated is not None:
                            plan.update(cursor, updated, not with_document, timestamp)
                        new = parts.tables("new", with_document)
                        if new is not None:
                            self._insert(cursor, plan, new, not with_document, timestamp)
                if self._record_commit(cursor, runtime_checkpoint, timestamp) != 1:
                    raise FencedOff(f"materialization {self._name} fenced off by another runtime "
                                    f"(fence {self._fence})")
            self._end(commit=True)
            self._committed()
        except psycopg.Error as exc:
            self._end(commit=False)
            raise _sql_error(exc, "commit") from exc
        except BaseException:
            self._end(commit=False)
            raise
        self._commits += 1
        return StartedCommit(state=None)

    def _prune_history(self, cursor: psycopg.Cursor[Any]) -> None:
        """Keep the newest history_limit rows (counting the one this commit adds)."""
        history = f"{ident(self._schema)}.{HISTORY}"
        cursor.execute(f"DELETE FROM {history} WHERE materialization = %s AND committed_at < ("
                       f"SELECT committed_at FROM {history} WHERE materialization = %s "
                       "ORDER BY committed_at DESC OFFSET %s LIMIT 1)",
                       [self._name, self._name, self._history_limit - 2])

    def acknowledge(self) -> Acknowledged:
        return Acknowledged(state=None)  # start_commit committed: nothing is left to apply

    def close(self) -> None:
        self._staged = {}  # uncommitted Stores are dropped: nothing of them reached PostgreSQL
        if self._conn is not None:
            self._end(commit=False)
            self._conn.close()
            self._conn = None

    def _end(self, commit: bool) -> None:
        """End the PostgreSQL transaction; the temporary tables are empty again either way."""
        for plan in self._plans:
            plan.transaction_ended()
        if self._conn is None or self._conn.closed:
            return
        if commit:
            self._conn.commit()
            return
        try:
            self._conn.rollback()
        except psycopg.Error:
            pass  # the connection is broken: PostgreSQL rolls the transaction back when it goes

    def _active(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise MaterializationError(f"transactor of {self._name or 'a materialization'} is not open")
        return self._conn

