"""Regenerates src/headrace/catalog/system/pg15.json from a real PostgreSQL 15 server.

    python scripts/gen_system_catalog.py "host=127.0.0.1 port=55432 user=postgres dbname=postgres"

It records the columns (name, type) of every pg_catalog and information_schema relation, and the
rows of the catalogs that describe PostgreSQL itself rather than the user's objects (built-in types,
access methods, collations, system schemas). headrace generates everything else from its own catalog.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg

OUTPUT = Path(__file__).resolve().parent.parent / "src" / "headrace" / "catalog" / "system" / "pg15.json"

# Static rows: built-in objects only (OIDs below FirstNormalObjectId = 16384).
STATIC_ROWS = {
    "pg_catalog.pg_type": "SELECT * FROM pg_catalog.pg_type WHERE oid < 16384 ORDER BY oid",
    "pg_catalog.pg_am": "SELECT * FROM pg_catalog.pg_am ORDER BY oid",
    "pg_catalog.pg_range": "SELECT * FROM pg_catalog.pg_range ORDER BY rngtypid",
    "pg_catalog.pg_collation": "SELECT * FROM pg_catalog.pg_collation WHERE collname IN ('default', 'C', 'POSIX', 'ucs_basic') ORDER BY oid",
    "pg_catalog.pg_tablespace": "SELECT * FROM pg_catalog.pg_tablespace ORDER BY oid",
    "pg_catalog.pg_language": "SELECT * FROM pg_catalog.pg_language ORDER BY oid",
}


def main(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        relations: dict[str, list[list[str]]] = {}
        for schema, name in conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname IN ('pg_catalog', 'information_schema') AND c.relkind IN ('r', 'v') "
            "AND c.relname NOT LIKE '\\_%' ORDER BY 1, 2"
        ).fetchall():
            columns = conn.execute(
                "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a "
                "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                [f'"{schema}"."{name}"'],
            ).fetchall()
            relations[f"{schema}.{name}"] = [[column, type_name] for column, type_name in columns]
        rows: dict[str, list[list[object]]] = {}
        for relation, query in STATIC_ROWS.items():
            with conn.cursor() as cursor:
                # Every value as text: the loader casts to the column type, as PostgreSQL's own input would.
                cursor.execute(f"SELECT * FROM ({query}) q LIMIT 0")
                names = [d.name for d in cursor.description or []]
                text_query = f"SELECT {', '.join(f'q.{n}::text' for n in names)} FROM ({query}) q"
                rows[relation] = [list(row) for row in conn.execute(text_query).fetchall()]
        # format_type(oid, NULL) of every built-in type: the names PostgreSQL prints for types.
        type_names = [list(row) for row in conn.execute(
            "SELECT oid::int8, format_type(oid, NULL) FROM pg_type WHERE oid < 16384 ORDER BY oid").fetchall()]
        settings = [list(row) for row in conn.execute(
            "SELECT name, category, short_desc, context, vartype, unit FROM pg_settings ORDER BY name").fetchall()]
    document = {"relations": relations, "rows": rows, "type_names": type_names, "settings": settings}
    OUTPUT.write_text(json.dumps(document, separators=(",", ":")) + "\n")
    print(f"wrote {OUTPUT}: {len(relations)} relations, {sum(len(r) for r in rows.values())} static rows")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "host=127.0.0.1 port=55432 user=headrace dbname=headrace")
