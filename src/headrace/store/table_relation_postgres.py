"""A table's public relation on the PostgreSQL serving store: what psql's `\\d`, information_schema, SQLAlchemy and
DBeaver see of it (blocking: run in the executor).

The serving driver writes the table's rows into its storage, headrace_internal.table_<id>, with the binding's
types and the hidden columns (hr_version, hr_row_id). PostgreSQL has no hidden columns, so `public.<name>` is:

  * for a table with a primary key, a real PostgreSQL table, created as the same CREATE TABLE would create it
    (declared types, NOT NULL, DEFAULT, PRIMARY KEY "<name>_pkey"), kept equal to the storage by statement-level
    triggers on it (AFTER INSERT / UPDATE / DELETE, with transition tables: set-based, in the driver's own
    transaction, so a reader sees a commit's rows in both or in neither). psql then shows "Table", its NOT NULL
    columns and its primary key index, and SQLAlchemy reflects the table and its key. Cost: the rows are written
    once more per commit.
  * for a table without one (keyed by the hidden hr_row_id; rows may repeat) or one whose key PostgreSQL could not
    index (a json column), a view casting each column to its declared type: `format_type` of its columns is still
    PostgreSQL's for the same CREATE TABLE, but psql says "View".

Made at CREATE TABLE and at each start (`ensure`): a missing relation is created and filled from the storage under
a lock that keeps the driver out meanwhile; one that is a view where a table is wanted (an older data directory)
is replaced unless other views depend on it."""

from __future__ import annotations

from typing import Any

import psycopg

from headrace.catalog.tables import Table
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import CHECKPOINTS_TABLE, INTERNAL_SCHEMA, quote_ident

_TRIGGER_EVENTS = ("INSERT", "UPDATE", "DELETE")


def public_name(table: Table) -> str:
    return f"{quote_ident(table.schema)}.{quote_ident(table.name)}"


def _mirror_function(table: Table) -> str:
    return f"{quote_ident(INTERNAL_SCHEMA)}.{quote_ident('mirror_' + table.materialization)}"


def is_mirrored(table: Table) -> bool:
    """Whether the public relation is a real table kept by triggers (else a view)."""
    return bool(table.primary_key) and all(
        column is not None and column.pg_type != "json" for column in map(table.column, table.primary_key))


def view_sql(table: Table, storage: str) -> str:
    """The public relation as a view: the declared columns in order, each cast back to its declared type."""
    columns = ", ".join(f"CAST({quote_ident(c.name)} AS {c.type_sql}) AS {quote_ident(c.name)}"
                        for c in table.columns)
    return f"CREATE OR REPLACE VIEW {public_name(table)} AS SELECT {columns} FROM {storage}"


def _casts(table: Table, alias: str) -> str:
    return ", ".join(f"CAST({alias}.{quote_ident(c.name)} AS {c.type_sql})" for c in table.columns)


def table_sql(table: Table) -> str:
    """CREATE TABLE of the mirrored public relation, as PostgreSQL would create the user's table."""
    from headrace.coordinator.table_defaults import default_ast  # the catalog's DEFAULT, checked at CREATE TABLE

    definitions = []
    for column in table.columns:
        definition = f"{quote_ident(column.name)} {column.type_sql}"
        if column.not_null or column.name in table.primary_key:
            definition += " NOT NULL"
        node = default_ast(column)
        if node is not None:
            definition += f" DEFAULT {node.sql(dialect='postgres')}"
        definitions.append(definition)
    definitions.append(f"PRIMARY KEY ({', '.join(quote_ident(k) for k in table.primary_key)})")
    return f"CREATE TABLE {public_name(table)} ({', '.join(definitions)})"


def mirror_function_sql(table: Table) -> str:
    """The trigger function keeping the public table equal to the storage (old_rows / new_rows: the statement's
    transition tables)."""
    target = public_name(table)
    match = " AND ".join(f"p.{quote_ident(k)} = CAST(o.{quote_ident(k)} AS {table.column(k).type_sql})"  # type: ignore[union-attr]
                         for k in table.primary_key)
    columns = ", ".join(quote_ident(c.name) for c in table.columns)
    return (f"CREATE OR REPLACE FUNCTION {_mirror_function(table)}() RETURNS trigger LANGUAGE plpgsql AS $mirror$\n"
            "BEGIN\n"
            "  IF TG_OP IN ('UPDATE', 'DELETE') THEN\n"
            f"    DELETE FROM {target} p USING old_rows o WHERE {match};\n"
            "  END IF;\n"
            "  IF TG_OP IN ('UPDATE', 'INSERT') THEN\n"
            f"    INSERT INTO {target} ({columns}) SELECT {_casts(table, 'n')} FROM new_rows n;\n"
            "  END IF;\n"
            "  RETURN NULL;\n"
            "END\n$mirror$")


def _trigger_sql(table: Table, storage: str, event: str) -> str:
    transitions = {"INSERT": "NEW TABLE AS new_rows", "UPDATE": "OLD TABLE AS old_rows NEW TABLE AS new_rows",
                   "DELETE": "OLD TABLE AS old_rows"}[event]
    return (f"CREATE OR REPLACE TRIGGER {quote_ident('hr_mirror_' + event.lower())} AFTER {event} ON {storage} "
            f"REFERENCING {transitions} FOR EACH STATEMENT EXECUTE FUNCTION {_mirror_function(table)}()")


def relkind(conn: psycopg.Connection[Any], name: str) -> str | None:
    """pg_class.relkind of a relation by its quoted, qualified name; None when there is none."""
    row = conn.execute("SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)", [name]).fetchone()
    return None if row is None else str(row[0])


def _relkind(conn: psycopg.Connection[Any], table: Table) -> str | None:
    return relkind(conn, public_name(table))


def ensure(store: PostgresServingStore, table: Table, storage: str) -> None:
    """Create (or repair) the table's public relation: see the module docstring. Idempotent."""
    with store.pool.connection() as conn:
        kind = _relkind(conn, table)
        if not is_mirrored(table) or (kind == "v" and _has_dependents(conn, table)):
            conn.execute(view_sql(table, storage))  # (a view others depend on stays one)
            conn.commit()
            return
        conn.execute(f"LOCK TABLE {storage} IN SHARE ROW EXCLUSIVE MODE")  # no commit of the driver meanwhile
        if kind == "v":
            conn.execute(f"DROP VIEW {public_name(table)}")
            kind = None
        if kind is None:
            conn.execute(table_sql(table))
            columns = ", ".join(quote_ident(c.name) for c in table.columns)
            conn.execute(f"INSERT INTO {public_name(table)} ({columns}) SELECT {_casts(table, 's')} FROM {storage} s")
        conn.execute(mirror_function_sql(table))
        for event in _TRIGGER_EVENTS:
            conn.execute(_trigger_sql(table, storage, event))
        conn.commit()


def exists(store: PostgresServingStore, schema: str, name: str) -> bool:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                           [f"{quote_ident(schema)}.{quote_ident(name)}"]).fetchone()
    return bool(row and row[0])


_DEPENDENTS = ("SELECT DISTINCT format('%%s %%s', CASE c.relkind WHEN 'm' THEN 'materialized view' ELSE 'view' END, "
               "c.oid::regclass) FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid "
               "JOIN pg_class c ON c.oid = r.ev_class "
               "WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = to_regclass(%s) AND c.oid <> d.refobjid "
               "ORDER BY 1")


def has_dependents(conn: psycopg.Connection[Any], name: str) -> bool:
    """Whether views of the store (plain views users created there) depend on the relation `name`."""
    return bool(conn.execute(_DEPENDENTS, [name]).fetchall())


def _has_dependents(conn: psycopg.Connection[Any], table: Table) -> bool:
    return has_dependents(conn, public_name(table))


def dependent_views(store: PostgresServingStore, table: Table) -> list[str]:
    """Relations of the store (plain views users created there) that depend on the table's public relation."""
    with store.pool.connection() as conn:
        return [row[0] for row in conn.execute(_DEPENDENTS, [public_name(table)]).fetchall()]


def remove(store: PostgresServingStore, table: Table, cascade: bool) -> None:
    """Drop the public relation (CASCADE: the store's views over it too), its trigger function and checkpoints;
    the storage (and its triggers) is the store's to drop."""
    with store.pool.connection() as conn:
        kind = _relkind(conn, table)
        if kind is not None:
            conn.execute(f"DROP {'VIEW' if kind == 'v' else 'TABLE'} {public_name(table)}"
                         f"{' CASCADE' if cascade else ''}")
        conn.execute(f"DROP FUNCTION IF EXISTS {_mirror_function(table)}() CASCADE")  # and the storage's triggers
        conn.execute(f"DELETE FROM {CHECKPOINTS_TABLE} WHERE materialization = %s", [table.materialization])
        conn.commit()
