"""A webhook source's public relation on the PostgreSQL serving store: what psql's `\\d`, information_schema,
SQLAlchemy, DBeaver and pgjdbc see of it (blocking: run in the executor).

The serving driver writes a source's rows into its storage, headrace_internal."source_<id>", keyed by their log
offset (a column users never see). `public.<name>` is a real PostgreSQL table with the source's columns, of the
storage's types, which the storage *inherits* (ALTER TABLE ... INHERIT): PostgreSQL reads every row of a child table
as a row of its parent, so a SELECT of the source scans the storage, with no second copy of the rows and no trigger.
The parent holds no rows of its own; the source's NOT NULL columns and its primary key (idempotency_key, for an
IDEMPOTENT source: unique within the dedupe window) are declared on the parent alone (ALTER TABLE ONLY), as headrace
describes a source (catalog/system: item_not_null, item_primary_key), so psql says "Table", SQLAlchemy lists it among
the tables and reflects its key. PostgreSQL checks privileges on the parent only, so a reader needs no grant on the
storage; writes are headrace's to refuse (only its admin role may write either table).

Made at CREATE SOURCE and at each start (`ensure`): a source made by an older version, whose public relation is a
view, gets its table, unless a user's view depends on the old one (it then stays a view)."""

from __future__ import annotations

from typing import Any

import psycopg

from headrace.catalog.items import WebhookSource
from headrace.catalog.system import item_not_null, item_primary_key
from headrace.materialize.drivers.postgres_tables import existing_columns
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import quote_ident
from headrace.store.table_relation_postgres import has_dependents, relkind

def public_name(source: WebhookSource) -> str:
    return f"public.{quote_ident(source.name)}"


def ensure(store: PostgresServingStore, source: WebhookSource, storage: tuple[str, str]) -> None:
    """Create (or repair) the source's public table over its storage: see the module docstring. Idempotent."""
    public, child = public_name(source), f"{quote_ident(storage[0])}.{quote_ident(storage[1])}"
    with store.pool.connection() as conn:
        kind = relkind(conn, public)
        if kind == "r" and _inherits(conn, child, public):
            return
        stored = existing_columns(conn, *storage)
        columns = [(name, stored[name]) for name in source.column_names()]
        if kind == "v":
            if has_dependents(conn, public):  # a user's view over it: it stays
                names = ", ".join(quote_ident(name) for name, _ in columns)
                conn.execute(f"CREATE OR REPLACE VIEW {public} AS SELECT {names} FROM {child}")
                conn.commit()
                return
            conn.execute(f"DROP VIEW {public}")
        elif kind is not None:
            conn.execute(f"DROP TABLE {public}")  # a table that lost its storage (left by a failed start)
        conn.execute(f"CREATE TABLE {public} ({', '.join(f'{quote_ident(n)} {t}' for n, t in columns)})")
        conn.execute(f"ALTER TABLE {child} INHERIT {public}")
        for name in sorted(item_not_null(source) & set(source.column_names())):
            conn.execute(f"ALTER TABLE ONLY {public} ALTER COLUMN {quote_ident(name)} SET NOT NULL")
        key = item_primary_key(source)
        if key:
            conn.execute(f"ALTER TABLE ONLY {public} ADD CONSTRAINT {quote_ident(source.name + '_pkey')} "
                         f"PRIMARY KEY ({', '.join(quote_ident(k) for k in key)})")
        conn.commit()


def remove(store: PostgresServingStore, source: WebhookSource, storage: tuple[str, str]) -> None:
    """Drop the public relation, before the storage (its child) goes."""
    public, child = public_name(source), f"{quote_ident(storage[0])}.{quote_ident(storage[1])}"
    with store.pool.connection() as conn:
        kind = relkind(conn, public)
        if kind == "v":
            conn.execute(f"DROP VIEW {public}")
        elif kind is not None:
            if _inherits(conn, child, public):
                conn.execute(f"ALTER TABLE {child} NO INHERIT {public}")
            conn.execute(f"DROP TABLE {public}")
        conn.commit()


def _inherits(conn: psycopg.Connection[Any], child: str, parent: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s) AND inhparent = to_regclass(%s)",
                        [child, parent]).fetchone() is not None
