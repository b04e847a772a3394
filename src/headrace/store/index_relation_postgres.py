"""A headrace index as a PostgreSQL index too, on the PostgreSQL serving store (blocking: run in the executor).

headrace answers point lookups from the index's in-memory arrangement (store/arrangements.py). On the PostgreSQL
store the same index is also made a real btree index wherever PostgreSQL has a table to put it on, so psql's `\\d`
and `\\di`, `pg_indexes`, DBeaver and EXPLAIN see it, and queries PostgreSQL runs itself (joins, ranges, a lookup
inside a transaction block) use it:
- a table with a primary key is a real table (store/table_relation_postgres.py): the index goes on it;
- a source's public relation is an empty parent its storage inherits (store/source_relation_postgres.py): the
  index goes on the parent, where catalog clients look, and on the storage, whose rows a SELECT of the parent
  scans (`<name>_storage` in headrace_internal, never on a search path);
- a materialized view or a table without a key is a PostgreSQL view, which cannot be indexed: only the
  arrangement serves it.
Names are PostgreSQL's: an index shares the namespace of relations, so a store relation of that name is 42P07."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import quote_ident
from headrace.store.table_relation_postgres import relkind

STORAGE_SUFFIX = "_storage"


def _children(conn: psycopg.Connection[Any], relation: str) -> list[tuple[str, str]]:
    """The (quoted schema, quoted name) of the tables inheriting `relation` (a source's storage)."""
    rows = conn.execute(
        "SELECT quote_ident(n.nspname), quote_ident(c.relname) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE i.inhparent = to_regclass(%s)", [relation]).fetchall()
    return [(str(row[0]), str(row[1])) for row in rows]


def create(store: PostgresServingStore, schema: str, relation: str, name: str, columns: Sequence[str]) -> bool:
    """CREATE INDEX `name` on the relation (and its storage) if PostgreSQL can index it; whether it did.
    A PostgreSQL error (e.g. 42P07, the name is a store relation's) is raised as a HeadraceError."""
    qualified = f"{quote_ident(schema)}.{quote_ident(relation)}"
    keys = ", ".join(quote_ident(column) for column in columns)
    with store.pool.connection() as conn:
        kind = relkind(conn, qualified)
        children = _children(conn, qualified) if kind == "r" else []
        conn.rollback()
    if kind not in ("r", "p"):
        return False
    statements = [f"CREATE INDEX {quote_ident(name)} ON {qualified} USING btree ({keys})"]
    statements += [f"CREATE INDEX IF NOT EXISTS {quote_ident(name + STORAGE_SUFFIX)} ON {child_schema}.{child} USING btree ({keys})"
                   for child_schema, child in children]
    store.execute(*statements)
    return True


def drop(store: PostgresServingStore, schema: str, relation: str, name: str) -> None:
    """DROP the index and its storage twin if they exist (the relation may be gone already)."""
    qualified = f"{quote_ident(schema)}.{quote_ident(relation)}"
    with store.pool.connection() as conn:
        children = _children(conn, qualified)
        conn.rollback()
    statements = [f"DROP INDEX IF EXISTS {quote_ident(schema)}.{quote_ident(name)}"]
    statements += [f"DROP INDEX IF EXISTS {child_schema}.{quote_ident(name + STORAGE_SUFFIX)}"
                   for child_schema, _ in children]
    store.execute(*statements)
