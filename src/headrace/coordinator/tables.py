"""Tables in the coordinator: CREATE / DROP TABLE, INSERT / UPDATE / DELETE / COPY FROM, transaction blocks
and read-your-writes.

A table is a catalog item with its own durable log (one directory per table id, headrace.log as sources
use it), materialized by the pipeline into the serving store like a source (pipeline/table_batches.py).

Writes. Each statement computes row changes against the table's current contents: the serving store's rows,
plus the acknowledged log records it has not applied yet (the overlay, table_log_state.py), plus this
transaction's own pending changes; writes to one table are serialized by a per-table lock, so duplicate keys
are caught across sessions. Autocommit: the statement's changes are one log record, appended (fsync) before
its tag is returned. Inside BEGIN ... COMMIT the changes stay in the session; COMMIT takes the locks of every
touched table (in id order), checks that no other transaction changed the rows this one changed since it
read them (else 40001), and appends one record per table; ROLLBACK drops them. One record per table is
atomic for that table (whole or absent in the log, one materialization transaction in the pipeline). Across
tables of one COMMIT, every statement that starts after COMMIT returned sees all of them (read-your-writes
waits for each); a multi-table COMMIT writes a durable commit intent before its appends, so a crash between
them is completed at start (coordinator/table_commits.py, docs/tables.md).

Read-your-writes: every acknowledged write raises its table's `acked_end`; a SELECT / COPY TO / SUBSCRIBE
first waits until the serving store's checkpoint of each table it may read has `log_end >= acked_end`."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlglot import exp

from headrace.catalog.catalog import Catalog
from headrace.catalog.tables import HIDDEN_ROW_ID, HIDDEN_VERSION, Table
from headrace import failpoints
from headrace.coordinator import table_changes as changes
from headrace.coordinator import table_blocks as blocks
from headrace.coordinator import table_commits as commits
from headrace.coordinator import table_own_reads as own_reads
from headrace.coordinator import table_upserts as upserts
from headrace.coordinator.responses import Column, CommandComplete, ExecuteResponse, SendingRows, StatementDescription
from headrace.coordinator.session import Session
from headrace.coordinator.table_log_state import TableLog
from headrace.coordinator.table_writes import WriteComputer, column_document, defaults_document
from headrace.errors import DuplicateObject, HeadraceError, QueryCanceled, UndefinedObject
from headrace.sql import table_statements as grammar
from headrace.sql.parser import parse_client_statement, parse_statement
from headrace.store import table_reads_postgres as on_postgres
from headrace.store import table_relation_postgres as public_relation
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import CHECKPOINTS_TABLE, quote_ident
from headrace.store.table_log import ValueError_, encode_changes
from headrace.store.table_reads import (
    Store,
    applied_checkpoints,
    applied_ends,
    public_relation_sql,
    row_values,
    rows_for_keys,
    table_binding,
)

log = logging.getLogger(__name__)

WRONG_OBJECT_TYPE = "42809"
VISIBILITY_TIMEOUT_S = 60.0  # a read waits this long for the pipeline to apply acknowledged writes
_PENDING_ATTRIBUTE = blocks.PENDING_ATTRIBUTE


def handles(ast: exp.Expr) -> bool:
    return grammar.is_create_table(ast) or grammar.is_drop_table(ast) or grammar.is_write(ast)


class Tables:
    def __init__(self, catalog: Catalog, store: Store, executor: ThreadPoolExecutor, data_root: Path,
                 ddl_lock: asyncio.Lock, on_tables_changed: Callable[[], None],
                 relation_exists: Callable[[str, str], bool]) -> None:
        self.catalog = catalog
        self.store = store
        self.executor = executor
        self.data_root = data_root
        self._ddl_lock = ddl_lock
        self._on_tables_changed = on_tables_changed
        self.views: Any = None  # coordinator/views.py ViewDdl: DROP TABLE refused / CASCADE while views read it
        self._logs: dict[str, TableLog] = {}
        self._applied: dict[str, int] = {}  # table id -> log end the store is known to hold
        self._included: dict[str, frozenset[str]] = {}  # table id -> views its stored checkpoint includes
        self._settled: dict[str | None, tuple[int, int]] = {}  # statement text -> when behind() found nothing
        self._row_ids = _RowIds()
        self.writes = WriteComputer(store, executor, relation_exists)

    # ---- lifecycle ----------------------------------------------------------------------------------
    async def open_all(self) -> None:
        """Start-up: each table's store table, public relation and log (repairing what a crash left half-made),
        after completing the multi-table COMMITs a crash interrupted (coordinator/table_commits.py)."""
        live = {table.id: table for table in self.catalog.tables()}
        await self._run(commits.recover, commits.intents_directory(self.data_root),
                        lambda table_id: self._log_dir(live[table_id]) if table_id in live else None)
        for table in self.catalog.tables():
            try:
                await self._ensure(table)
            except Exception:  # noqa: BLE001 - one broken table must not keep the server from starting
                log.exception("table %s: cannot open its resources", table.name)

    async def close_all(self) -> None:
        logs, self._logs = list(self._logs.values()), {}
        for table_log in logs:
            await table_log.close()
        if isinstance(self.store, PostgresServingStore):
            await self._run(on_postgres.close_write_pool, self.store)

    async def _ensure(self, table: Table) -> None:
        await self._run(self._ensure_store, table)
        if table.id not in self._logs:
            table_log = TableLog(table, self._log_dir(table))
            applied = (await self._run(applied_ends, self.store, [table.materialization]))[table.materialization]
            self._applied[table.id] = applied
            if applied < table_log.acked_end:
                count = await self._run(table_log.load_unapplied, applied)
                log.info("table %s: %d log records not yet in the serving store", table.name, count)
            self._logs[table.id] = table_log

    def _ensure_store(self, table: Table) -> None:
        self.store.apply(table_binding(table))
        if isinstance(self.store, PostgresServingStore):
            public_relation.ensure(self.store, table, on_postgres.storage_name(table))
            on_postgres.ensure_write_role(self.store)
            return
        with self.store.cursor() as cursor:
            cursor.execute(public_relation_sql(table))

    def log_end(self, table_id: str) -> int | None:
        """The end of a table's log as acknowledged (headrace_internal.materializations: what the pipeline must
        commit up to); None for a table not open."""
        table_log = self._logs.get(table_id)
        return None if table_log is None else table_log.acked_end

    def _log_dir(self, table: Table) -> Path:
        return self.data_root / "logs" / table.id

    # ---- prepare ------------------------------------------------------------------------------------
    async def describe(self, ast: exp.Expr, param_types: Sequence[int]) -> StatementDescription:
        if not grammar.is_write(ast):
            return StatementDescription(tuple(param_types), None)
        if isinstance(ast, exp.TruncateTable):
            self._write_table(ast)  # 42P01 / 42809 now
            return StatementDescription(tuple(param_types), None)
        table = self._write_table(ast)
        types = await self.writes.param_types(table, ast, param_types)
        returning = grammar.returning_columns(ast, table)
        columns = None if returning is None else _columns(table, returning)
        return StatementDescription(types, columns)

    # ---- execute ------------------------------------------------------------------------------------
    async def execute(self, session: Session, ast: exp.Expr, sql: str, params: Sequence[Any]) -> ExecuteResponse:
        if grammar.is_create_table(ast):
            assert isinstance(ast, exp.Create)
            response = await self.create(ast, sql)
            if session.in_block and not response.notices:  # made now, not skipped: ROLLBACK drops it again
                created = self.catalog.find_table(*grammar.table_name(
                    ast.this.this if isinstance(ast.this, exp.Schema) else ast.this))
                if created is not None:
                    blocks.note_created(session, created.id)
            return response
        if grammar.is_drop_table(ast):
            assert isinstance(ast, exp.Drop)
            return await self.drop(ast)
        truncating = isinstance(ast, exp.TruncateTable)
        if truncating:  # a DELETE of every row, through the log (views over the table follow)
            ast = grammar.truncate_as_delete(ast)
        grammar.refuse_unsupported(ast, joins_allowed=isinstance(self.store, PostgresServingStore))
        table = self._write_table(ast)
        table_log = self._logs.get(table.id)
        if table_log is None:
            raise HeadraceError(f'table "{table.name}" is not open', sqlstate="55000")
        in_block = session.in_block
        pending = blocks.pending_writes(session).setdefault(table.id, changes.PendingTable(table)) if in_block \
            else changes.PendingTable(table)
        # Other tables it reads (INSERT ... SELECT, subqueries): read-your-writes as for a SELECT. Its own
        # table needs no wait: its unapplied writes are in the overlay.
        await self.wait_visible(sql, exclude=table.id)
        async with table_log.lock:
            overlay = await self._overlay(table, table_log, pending)
            count, rows = await self._compute(table, ast, params, session, pending, overlay)
            if not in_block:
                record = pending.changes()
                if record:
                    await table_log.append(record)
        return CommandComplete("TRUNCATE TABLE") if truncating else self._result(table, ast, count, rows)

    async def _compute(self, table: Table, ast: exp.Expr, params: Sequence[Any], session: Session,
                       pending: changes.PendingTable, overlay: dict[Any, Any]) -> tuple[int, list[dict[str, Any]]]:
        if isinstance(ast, exp.Insert):
            documents = await self.writes.insert_documents(table, ast, params, session, overlay)
            self._assign_row_ids(table, documents)
            upsert = upserts.conflict_clause(ast, table)
            if upsert is not None:
                return await self._upsert(table, ast, upsert, documents, params, session, pending, overlay)
            existing = {} if table.has_hidden_key else \
                await self._existing(table, [changes.row_key(table, d) for d in documents], overlay)
            return changes.insert(pending, documents, existing), documents
        if isinstance(ast, exp.Update):
            pairs = await self.writes.update_pairs(table, ast, params, session, overlay)
            for _, new in pairs:
                new[HIDDEN_VERSION] = self._row_ids.next()  # a new row version
            moved = [changes.row_key(table, new) for old, new in pairs
                     if changes.row_key(table, old) != changes.row_key(table, new)]
            existing = await self._existing(table, moved, overlay)
            return changes.update(pending, pairs, existing), [new for _, new in pairs]
        assert isinstance(ast, exp.Delete)
        rows = await self.writes.delete_rows(table, ast, params, session, overlay)
        return changes.delete(pending, rows), rows

    async def _upsert(self, table: Table, ast: exp.Insert, upsert: upserts.Upsert, documents: list[dict[str, Any]],
                      params: Sequence[Any], session: Session, pending: changes.PendingTable,
                      overlay: dict[Any, Any]) -> tuple[int, list[dict[str, Any]]]:
        """INSERT ... ON CONFLICT (coordinator/table_upserts.py): insert the new keys, skip or update the others."""
        for document in documents:
            changes.check_not_null(table, document)
        keys = [changes.row_key(table, d) for d in documents]
        existing = {} if table.has_hidden_key else await self._existing(table, keys, overlay)
        split = upserts.split_proposals(table, upsert, documents, keys, existing)
        updated = await self.writes.upsert_pairs(table, ast, upsert, split.conflicts, params, session)
        pairs = [pair for pair in updated if pair is not None]
        upserts.check_keys_kept(table, pairs)
        for _, new in pairs:
            new[HIDDEN_VERSION] = self._row_ids.next()
        count = changes.insert(pending, split.inserts, existing)
        count += changes.update(pending, pairs, {})
        rows = [split.inserts[i] if not is_conflict else updated[i][1]  # type: ignore[index]
                for is_conflict, i in split.order if not is_conflict or updated[i] is not None]
        return count, rows

    def _result(self, table: Table, ast: exp.Expr, count: int, rows: list[dict[str, Any]]) -> ExecuteResponse:
        verb = {"insert": "INSERT 0", "update": "UPDATE", "delete": "DELETE"}[ast.key]
        returning = grammar.returning_columns(ast, table)
        if returning is None:
            return CommandComplete(f"{verb} {count}")
        columns = _columns(table, returning)
        return SendingRows(columns, [row_values(table, row, returning) for row in rows], tag_verb=verb)

    async def _overlay(self, table: Table, table_log: TableLog, pending: changes.PendingTable) -> dict[Any, Any]:
        """Acknowledged rows the store may lack, then this transaction's own: applied over the store's rows."""
        applied = (await self._run(applied_ends, self.store, [table.materialization]))[table.materialization]
        self._applied[table.id] = max(self._applied.get(table.id, 0), applied)
        overlay = table_log.overlay(applied)
        overlay.update(pending.current)
        return overlay

    async def _existing(self, table: Table, keys: list[Any], overlay: dict[Any, Any]) -> dict[Any, Any]:
        """Current rows of `keys` (overlay first, then the store)."""
        existing = {key: overlay[key] for key in keys if key in overlay}
        missing = [key for key in keys if key not in overlay]
        if missing:
            existing.update(await self._run(rows_for_keys, self.store, table, missing))
        return existing

    def _assign_row_ids(self, table: Table, documents: list[dict[str, Any]]) -> None:
        """Inserted rows: their version, and their hidden row id when the table has no primary key."""
        for document in documents:
            if table.has_hidden_key:
                document[HIDDEN_ROW_ID] = self._row_ids.next()
            document[HIDDEN_VERSION] = self._row_ids.next()

    def _write_table(self, ast: exp.Expr) -> Table:
        target = grammar.write_target(ast)
        return self.table_named(target.schema, target.name)

    def table_named(self, schema: str, name: str) -> Table:
        table = self.catalog.find_table(schema, name)
        if table is not None:
            return table
        if self.catalog.find(schema, name) is not None:
            raise HeadraceError(f'"{name}" is not a table', sqlstate=WRONG_OBJECT_TYPE,
                                detail=f'"{name}" is a source: it takes data from its webhook endpoint only')
        if self.catalog.find_view(schema, name) is not None:
            raise HeadraceError(f'"{name}" is not a table', sqlstate=WRONG_OBJECT_TYPE,
                                detail=f'"{name}" is a materialized view: the pipeline maintains it')
        raise UndefinedObject(f'relation "{name}" does not exist')

    # ---- COPY FROM (coordinator/copy.py CopyTargets) --------------------------------------------------
    def copy_columns(self, schema: str, name: str, columns: Sequence[str]) -> tuple[Column, ...]:
        table = self.table_named(schema, name)
        names = list(columns) or table.column_names()
        for column in names:
            if table.column(column) is None:
                raise HeadraceError(f'column "{column}" of relation "{name}" does not exist', sqlstate="42703")
        return _columns(table, names)

    async def insert_rows(self, session: Session, target: tuple[str, str], columns: Sequence[Column],
                          rows: list[tuple[Any, ...]]) -> int:
        table = self.table_named(*target)
        table_columns = [table.column(c.name) for c in columns]
        documents = []
        now = datetime.datetime.now(datetime.timezone.utc)
        try:
            for row in rows:
                document: dict[str, Any] = defaults_document(table, now)
                for column, value in zip(table_columns, row):
                    assert column is not None
                    document[column.name] = column_document(column, value)
                documents.append(document)
        except ValueError_ as error:
            detail = f"COPY {table.name}, line {len(documents) + 1}" + (f": {error.detail}" if error.detail else "")
            raise HeadraceError(error.message, sqlstate=error.sqlstate, detail=detail) from None
        self._assign_row_ids(table, documents)
        table_log = self._logs[table.id]
        in_block = session.in_block
        pending = blocks.pending_writes(session).setdefault(table.id, changes.PendingTable(table)) if in_block \
            else changes.PendingTable(table)
        async with table_log.lock:
            overlay = await self._overlay(table, table_log, pending)
            existing = {} if table.has_hidden_key else \
                await self._existing(table, [changes.row_key(table, d) for d in documents], overlay)
            count = changes.insert(pending, documents, existing)
            if not in_block and pending:
                await table_log.append(pending.changes())
        return count

    # ---- transaction blocks -------------------------------------------------------------------------
    async def end_transaction(self, session: Session, committed: bool) -> None:
        """COMMIT appends the block's writes (one record per table, each fsync'd, all before the tag);
        ROLLBACK forgets them. A failed COMMIT (40001) rolls the whole block back."""
        pending: dict[str, changes.PendingTable] = getattr(session, _PENDING_ATTRIBUTE, None) or {}
        setattr(session, _PENDING_ATTRIBUTE, {})
        if not committed:
            await self._drop_created(blocks.take_created(session))
            return
        created = blocks.take_created(session)
        touched = [p for _, p in sorted(pending.items(), key=lambda item: int(item[0][1:])) if p.changes()]
        if not touched:
            return
        try:
            async with contextlib.AsyncExitStack() as stack:
                logs = []
                for part in touched:
                    table_log = self._logs.get(part.table.id)
                    if table_log is None:
                        raise HeadraceError(f'table "{part.table.name}" was dropped', sqlstate="40001")
                    await stack.enter_async_context(table_log.lock)
                    logs.append(table_log)
                for part, table_log in zip(touched, logs):
                    overlay = await self._overlay(part.table, table_log, changes.PendingTable(part.table))
                    # Rows this block inserted under a fresh hidden row id cannot have been touched by others.
                    checked = [key for key, before in part.base.items()
                               if before is not None or not part.table.has_hidden_key]
                    committed_rows = await self._existing(part.table, checked, overlay)
                    if changes.conflicts(part, committed_rows, checked):
                        raise changes.serialization_failure(part.table)
                await self._append_commit(touched, logs)
        except BaseException:
            session.end_transaction(committed=False)
            await self._drop_created(created)
            raise

    def savepoint(self, session: Session) -> blocks.WritesSnapshot:
        """SAVEPOINT: the block's table writes and created tables as they are now."""
        return blocks.snapshot(session)

    async def rollback_to(self, session: Session, saved: blocks.WritesSnapshot) -> None:
        """ROLLBACK TO SAVEPOINT: the writes as they were; tables created since are dropped."""
        await self._drop_created(blocks.restore(session, saved))

    async def _drop_created(self, table_ids: list[str]) -> None:
        """Tables a rolled-back block created, newest first, with whatever was made over them since."""
        for table_id in table_ids:
            table = next((t for t in self.catalog.tables() if t.id == table_id), None)
            if table is None:  # dropped within the block already
                continue
            try:
                drop = parse_statement(f"DROP TABLE IF EXISTS {quote_ident(table.schema)}.{quote_ident(table.name)} "
                                       "CASCADE")
                assert isinstance(drop, exp.Drop)
                await self.drop(drop)
            except HeadraceError as exc:
                log.warning("table %s created in a rolled-back block not dropped: %s", table.name, exc.message)

    async def _append_commit(self, touched: list[changes.PendingTable], logs: list[TableLog]) -> None:
        """One table: its record. Several: a durable commit intent first (coordinator/table_commits.py), so a
        crash between the per-table appends is completed at start; the first append alone, then the others."""
        if len(touched) == 1:
            await logs[0].append(touched[0].changes())
            return
        transaction = commits.new_transaction_id()
        intent = commits.CommitIntent(transaction, {
            part.table.id: (table_log.next_offset, encode_changes(part.changes(), transaction))
            for part, table_log in zip(touched, logs)})
        path = await self._run(commits.write_intent, commits.intents_directory(self.data_root), intent)
        # A failure from here on leaves the intent: the transaction is decided and completes at the next start.
        await logs[0].append(touched[0].changes(), transaction)
        failpoints.reached("between_table_appends")
        await asyncio.gather(*(table_log.append(part.changes(), transaction)
                               for part, table_log in zip(touched[1:], logs[1:])))
        await self._run(commits.remove_intent, path)

    # ---- read-your-writes ---------------------------------------------------------------------------
    def behind(self, statement_sql: str | None = None,
               exclude: str | frozenset[str] | None = None) -> dict[str, tuple[int, frozenset[str]]]:
        """Tables the statement may read (named in its text, directly or through a view over them; all when
        the text is unknown) that the store has not caught up with: id -> (acknowledged end, ids of the views
        over it the statement names, which must be in the store's checkpoint: created and backfilled).
        `exclude`: tables whose unapplied writes the statement reads from the overlay (no wait)."""
        excluded = frozenset((exclude,)) if isinstance(exclude, str) else exclude or frozenset()
        if exclude is None:
            # Nothing acknowledged and no catalog change since this text last found everything caught up:
            # still caught up (the store only moves forward). The per-query path: one dictionary lookup.
            settled_at = (self.catalog.generation, TableLog.acknowledgements)
            if self._settled.get(statement_sql) == settled_at:
                return {}
        result = {}
        lowered = statement_sql.lower() if statement_sql is not None else None
        for table_id, table_log in self._logs.items():
            if table_id in excluded:
                continue
            table = table_log.table
            named_views = [v for v in self._views_over(table) if lowered is None or v.name.lower() in lowered]
            if lowered is not None and not named_views and table.name.lower() not in lowered:
                continue
            views = frozenset(v.id for v in named_views)
            included = self._included.get(table_id, frozenset())
            if table_log.acked_end <= self._applied.get(table_id, 0) and views <= included:
                continue
            result[table_id] = (table_log.acked_end, views)
        if not result and exclude is None:
            if len(self._settled) >= 4096:
                self._settled.clear()
            self._settled[statement_sql] = settled_at
        return result

    def has_pending_writes(self, session: Session) -> bool:
        """Whether the session's open transaction block holds writes not yet committed."""
        pending: dict[str, changes.PendingTable] | None = getattr(session, _PENDING_ATTRIBUTE, None)
        return bool(pending) and any(pending.values())  # type: ignore[union-attr]

    def refuse_read_of_own_writes(self, session: Session, statement_sql: str | None) -> None:
        """A read inside a transaction block of a table the block has written to (or of a view over it) that
        cannot see those writes (they reach the store at COMMIT): refused rather than answered wrongly, as
        Materialize refuses reads in a write transaction. (On the PostgreSQL store a query reading the table
        itself sees them: `statement_with_own_writes`.)"""
        if not self.has_pending_writes(session):
            return
        lowered = statement_sql.lower() if statement_sql is not None else None
        for pending in getattr(session, _PENDING_ATTRIBUTE).values():
            if not pending:
                continue
            table = pending.table
            names = [table.name, *(view.name for view in self._views_over(table))]
            if lowered is None or any(_names_word(name, lowered) for name in names):
                raise own_reads.refusal(table.name)

    async def statement_with_own_writes(self, session: Session, ast: exp.Expr | None,
                                        statement_sql: str) -> tuple[str, frozenset[str]] | None:
        """A read in a transaction block that wrote to tables it reads, on the PostgreSQL store: its text with
        those tables as this transaction sees them (coordinator/table_own_reads.py) and their ids (the overlay
        holds their unapplied writes: the read need not wait for them); None when it reads none of them. A view over a written table, a table without a key, a statement that is no query: 25000."""
        if not self.has_pending_writes(session):
            return None
        lowered = statement_sql.lower()
        overlays = []
        for pending in getattr(session, _PENDING_ATTRIBUTE).values():
            if not pending:
                continue
            table = pending.table
            for view in self._views_over(table):
                if _names_word(view.name, lowered):
                    raise own_reads.refusal(view.name, "materialized view")
            if not _names_word(table.name, lowered):
                continue
            if not isinstance(self.store, PostgresServingStore):
                raise own_reads.refusal(table.name)
            if ast is None:  # a shape the store ran before, prepared without parsing (coordinator.prepare)
                ast = parse_client_statement(statement_sql)
            if own_reads.references(ast, table):
                table_log = self._logs.get(table.id)
                if table_log is None:
                    raise HeadraceError(f'table "{table.name}" is not open', sqlstate="55000")
                overlays.append((table, await self._overlay(table, table_log, pending)))
        if not overlays:
            return None
        return own_reads.with_own_writes(ast, overlays), frozenset(table.id for table, _ in overlays)

    def _views_over(self, table: Table) -> list[Any]:
        return [v for v in self.catalog.views() if (v.input_schema, v.input_name) == (table.schema, table.name)]

    async def wait_visible(self, statement_sql: str | None = None, timeout_s: float = VISIBILITY_TIMEOUT_S,
                           exclude: str | frozenset[str] | None = None, cancel: asyncio.Event | None = None,
                           statement_timeout_s: float = 0.0) -> float:
        """_wait_applied; then a statement reading a materialized view holding an error (a SELECT, or a write's
        INSERT ... SELECT / subquery) fails with it (coordinator/views.py refuse_view_errors)."""
        waited = await self._wait_applied(statement_sql, timeout_s, exclude, cancel, statement_timeout_s)
        from headrace.coordinator.views import refuse_view_errors

        await refuse_view_errors(self.catalog, self.store, self._run, statement_sql)  # type: ignore[arg-type]
        return waited

    async def _wait_applied(self, statement_sql: str | None, timeout_s: float, exclude: str | frozenset[str] | None,
                            cancel: asyncio.Event | None, statement_timeout_s: float) -> float:
        """Wait until the serving store holds every acknowledged write to the tables the statement may read
        (and the views over them it names are backfilled). Returns the seconds waited (0.0 on the fast path:
        nothing outstanding, no store query). A cancel (CancelRequest, the client gone) and the session's
        statement_timeout end the wait with 57014, as they end a running statement."""
        targets = self.behind(statement_sql, exclude)
        if not targets:
            return 0.0
        started = time.monotonic()
        delay = 0.001
        by_materialization = {self._logs[t].table.materialization: t for t in targets}

        def caught_up(table_id: str) -> bool:
            end, views = targets[table_id]
            return self._applied.get(table_id, 0) >= end and views <= self._included.get(table_id, frozenset())

        while True:
            for dropped in [t for t in targets if t not in self._logs]:  # dropped meanwhile: nothing to wait for
                del targets[dropped]                                   # (the read then finds no such relation)
                by_materialization = {m: t for m, t in by_materialization.items() if t != dropped}
            if not targets:
                return time.monotonic() - started
            found = await self._run(applied_checkpoints, self.store, list(by_materialization))
            if any(end > self._applied.get(by_materialization[m], 0) for m, (end, _) in found.items()):
                # The driver counts a commit (note_committed) just after it becomes visible: this poll may
                # have seen it first. Count it now, or an index would think itself current without it.
                self.store.note_committed()
            for materialization, (end, views) in found.items():
                table_id = by_materialization[materialization]
                self._applied[table_id] = max(self._applied.get(table_id, 0), end)
                self._included[table_id] = views
            if all(caught_up(t) for t in targets):
                return time.monotonic() - started
            if cancel is not None and cancel.is_set():
                raise QueryCanceled("canceling statement due to user request")
            if statement_timeout_s > 0 and time.monotonic() - started > statement_timeout_s:
                raise QueryCanceled("canceling statement due to statement timeout")
            if time.monotonic() - started > timeout_s:
                lagging = [f"{self._logs[t].table.name} (applied up to offset {self._applied.get(t, 0)} of "
                           f"{targets[t][0]})" for t in targets if not caught_up(t)]
                raise HeadraceError(f"timed out after {timeout_s:.0f} s waiting for the pipeline to apply "
                                    f"acknowledged writes to {', '.join(lagging)}", sqlstate="57P03",
                                    hint="the pipeline process may be down or restarting; the writes are durable "
                                         "and will show once it catches up")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.01)

    # ---- DDL ----------------------------------------------------------------------------------------
    async def create(self, ast: exp.Create, sql: str) -> CommandComplete:
        async with self._ddl_lock:
            schema, name = grammar.table_name(ast.this.this if isinstance(ast.this, exp.Schema) else ast.this)
            holder = self.catalog.kind_of_name(schema, name)
            if holder is not None:
                kind = "table" if holder == "table" else "relation"
                if ast.args.get("exists"):
                    return CommandComplete("CREATE TABLE", (f'{kind} "{name}" already exists, skipping',))
                raise DuplicateObject(f'relation "{name}" already exists', detail=f'"{name}" is a {holder}')
            if isinstance(self.store, PostgresServingStore) and \
                    await self._run(public_relation.exists, self.store, schema, name):
                # a relation only the store has (a plain table or view a session created there)
                if ast.args.get("exists"):
                    return CommandComplete("CREATE TABLE", (f'relation "{name}" already exists, skipping',))
                raise DuplicateObject(f'relation "{name}" already exists')
            grammar.table_from_create("pending", ast, sql)  # a bad definition fails before an id is taken
            table = grammar.table_from_create(self.catalog.allocate_id(), ast, sql)
            self.catalog.add_table(table)  # durable first: start-up repairs missing resources
            await self._ensure(table)
            self._on_tables_changed()
            return CommandComplete("CREATE TABLE")

    async def drop(self, ast: exp.Drop) -> CommandComplete:
        async with self._ddl_lock:
            notices: list[str] = []
            targets: list[Table] = []
            for node in ast.args.get("tables") or ast.expressions:
                schema, name = grammar.table_name(node)
                table = self.catalog.find_table(schema, name)
                if table is None:
                    if self.catalog.find(schema, name) is not None or self.catalog.find_view(schema, name) is not None:
                        raise HeadraceError(f'"{name}" is not a table', sqlstate=WRONG_OBJECT_TYPE,
                                            hint="use DROP SOURCE or DROP MATERIALIZED VIEW")
                    if ast.args.get("exists"):
                        notices.append(f'table "{name}" does not exist, skipping')
                        continue
                    raise UndefinedObject(f'table "{name}" does not exist')
                targets.append(table)
            cascade = bool(ast.args.get("cascade"))
            if not cascade and isinstance(self.store, PostgresServingStore):
                for table in targets:
                    await self._run(self._refuse_drop_with_dependents, table)
            if self.views is not None:
                for table in targets:
                    if not cascade:
                        self.views.refuse_drop_of_input(table.schema, table.name, kind="table")
                for table in targets:
                    notices.extend(await self.views.drop_readers_of(table.schema, table.name))
            for table in targets:
                self.catalog.remove_table(table.id)
                table_log = self._logs.pop(table.id, None)
                if table_log is not None:
                    async with table_log.lock:
                        await table_log.close()
                self._applied.pop(table.id, None)
                await self._run(self._remove_files, table, cascade)
            if targets:
                self._on_tables_changed()
            return CommandComplete("DROP TABLE", tuple(notices))

    def _refuse_drop_with_dependents(self, table: Table) -> None:
        """PostgreSQL's 2BP01 when plain views users created in the store read the table (CASCADE drops them)."""
        assert isinstance(self.store, PostgresServingStore)
        dependents = public_relation.dependent_views(self.store, table)
        if dependents:
            raise HeadraceError(f"cannot drop table {table.name} because other objects depend on it",
                                sqlstate="2BP01", hint="Use DROP ... CASCADE to drop the dependent objects too.",
                                detail="\n".join(f"{d} depends on table {table.name}" for d in dependents))

    def _remove_files(self, table: Table, cascade: bool = False) -> None:
        if isinstance(self.store, PostgresServingStore):
            public_relation.remove(self.store, table, cascade)
        else:
            with self.store.cursor() as cursor:
                cursor.execute(f'DROP VIEW IF EXISTS "{table.schema}"."{table.name}"')
                cursor.execute(f"DELETE FROM {CHECKPOINTS_TABLE} WHERE materialization = ?", [table.materialization])
        self.store.drop(table_binding(table).resource_path)
        shutil.rmtree(self._log_dir(table), ignore_errors=True)
        shutil.rmtree(self.data_root / "pipeline" / "checkpoints" / table.materialization, ignore_errors=True)

    async def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)


def _names_word(name: str, lowered_sql: str) -> bool:
    """Whether the statement's text names `name` as a word (a cheap look before parsing anything)."""
    return re.search(rf"(?<![\w$]){re.escape(name.lower())}(?![\w$])", lowered_sql) is not None


def _columns(table: Table, names: Sequence[str]) -> tuple[Column, ...]:
    columns = []
    for name in names:
        column = table.column(name)
        assert column is not None
        columns.append(Column(name, column.type_oid))
    return tuple(columns)


class _RowIds:
    """Hidden row ids (tables without a primary key) and row versions: microseconds since the epoch, strictly
    increasing in this process (so unique across restarts unless the clock goes back by more than the downtime)."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._last = max(self._last + 1, time.time_ns() // 1000)
            return self._last


__all__ = ["Tables", "handles"]
