"""headrace's system relations as real relations of the store PostgreSQL (the PostgreSQL serving store; blocking).

`headrace_internal.webhook_counters`, `source_status`, `sink_status`, `view_errors` ... live in the server's
memory (store/system_tables.py). With the PostgreSQL serving store every other relation a user reads is
PostgreSQL's, so a query joining a system relation with a source, a view or `pg_class` must run there too: each
system relation is also a table of the store, `headrace_internal.<name>`, readable by every role (as in headrace),
written only by the store's admin. Its rows are the in-memory ones as of the statement that reads it: the
coordinator refreshes the relations a statement names, in one transaction of the admin's, just before the
statement runs (`refresh`), so a reader sees them as of its start, as headrace's own snapshots do."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import quote_ident
from headrace.store.system_tables import INSUFFICIENT_PRIVILEGE, SYSTEM_SCHEMA, SystemRelation, SystemTables

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# store/system_tables.py declares DuckDB types
_POSTGRES_TYPES = {"VARCHAR": "text", "BIGINT": "bigint", "INTEGER": "integer", "DOUBLE": "double precision",
                   "TIMESTAMPTZ": "timestamptz"}


class SystemRelationsMirror:
    def __init__(self, store: PostgresServingStore, system_tables: SystemTables) -> None:
        self._store = store
        self._system_tables = system_tables
        self._made: set[str] = set()
        self._lock = threading.Lock()  # one refresh at a time: the same rows, deleted and copied again

    def create_all(self) -> None:
        """Every system relation's table, empty until read (a statement's Parse needs it to exist)."""
        with self._lock, self._store.pool.connection() as conn:
            for name in self._system_tables.names():
                self._create(conn, name)

    def mirrors(self, schema: str | None, name: str) -> bool:
        return (schema or "").lower() == SYSTEM_SCHEMA and self._system_tables.relation(name) is not None

    def refresh(self, names: Iterable[str]) -> None:
        """Make the named system relations' tables hold their rows as of now (one transaction)."""
        wanted = sorted({name for name in names if self._system_tables.relation(name) is not None})
        if not wanted:
            return
        snapshots = {name: _rows(self._system_tables.relation(name)) for name in wanted}  # type: ignore[arg-type]
        with self._lock, self._store.pool.connection() as conn:
            for name in wanted:
                if name not in self._made:
                    self._create(conn, name)
            with conn.transaction():
                for name, rows in snapshots.items():
                    table = _rows_table(name, self._system_tables.relation(name))  # type: ignore[arg-type]
                    conn.execute(f"DELETE FROM {table}")  # not TRUNCATE: readers of the last rows go on
                    if rows:
                        with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
                            for row in rows:
                                copy.write_row(row)

    def _create(self, conn: object, name: str) -> None:
        relation = self._system_tables.relation(name)
        assert relation is not None
        columns = ", ".join(f"{quote_ident(column)} {_POSTGRES_TYPES[kind]}" for column, kind in relation.columns)
        table = _rows_table(name, relation)
        relation_name = f"{SYSTEM_SCHEMA}.{quote_ident(name)}"
        with conn.transaction():  # type: ignore[attr-defined]
            # made again at each start: an earlier version's columns may differ, and the rows are a snapshot anyway
            for kind, in conn.execute(  # type: ignore[attr-defined]
                    "SELECT relkind FROM pg_class WHERE relnamespace = %s::regnamespace AND relname = %s",
                    [SYSTEM_SCHEMA, name]).fetchall():
                conn.execute(f"DROP {'VIEW' if kind == 'v' else 'TABLE'} {relation_name}")  # type: ignore[attr-defined]
            conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[attr-defined]
            conn.execute(f"CREATE TABLE {table} ({columns})")  # type: ignore[attr-defined]
            conn.execute(f"REVOKE ALL ON {table} FROM PUBLIC")  # type: ignore[attr-defined]
            if relation.restricted is not None:
                # A view over the admin's table: its owner reads the rows, and `current_user` in it is the reader's,
                # so the restricted column shows only on the reader's own rows (or to pg_read_all_stats members), as
                # PostgreSQL's pg_stat_activity shows `query`.
                column, role_column = relation.restricted
                shown = ", ".join(
                    f"CASE WHEN {quote_ident(role_column)} = current_user OR "
                    f"pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER') THEN {quote_ident(name_)} "
                    f"ELSE '{INSUFFICIENT_PRIVILEGE}' END AS {quote_ident(name_)}" if name_ == column
                    else quote_ident(name_) for name_, _ in relation.columns)
                view = f"CREATE VIEW {relation_name} AS SELECT {shown} FROM {table}"
                conn.execute(view)  # type: ignore[attr-defined]
                conn.execute(f"REVOKE ALL ON {relation_name} FROM PUBLIC")  # type: ignore[attr-defined]
            conn.execute(f"GRANT SELECT ON {relation_name} TO PUBLIC")  # type: ignore[attr-defined]
            conn.execute(f"GRANT USAGE ON SCHEMA {SYSTEM_SCHEMA} TO PUBLIC")  # type: ignore[attr-defined]
        self._made.add(name)


def _rows_table(name: str, relation: SystemRelation) -> str:
    """Where the relation's rows are written: the relation itself, or for one with a restricted column the admin's
    table `<name>$rows` under its view."""
    return f"{SYSTEM_SCHEMA}.{quote_ident(name + '$rows' if relation.restricted is not None else name)}"


def _rows(relation: SystemRelation) -> list[tuple[Any, ...]]:
    """The relation's rows, its timestamps as datetimes (some relations keep microseconds since the epoch, which
    their Arrow snapshot reads as timestamps)."""
    stamps = [index for index, (_, kind) in enumerate(relation.columns) if kind == "TIMESTAMPTZ"]
    rows = [tuple(row) for row in relation.rows()]
    if not stamps:
        return rows
    return [tuple(_timestamp(value) if index in stamps else value for index, value in enumerate(row)) for row in rows]


def _timestamp(value: Any) -> Any:
    if isinstance(value, int):
        return _EPOCH + timedelta(microseconds=value)
    return value
