"""The serving store: one embedded DuckDB database file that SQL SELECTs read and materializations write.

Layout: schema `public` for user-visible objects, schema `headrace_internal` for materialized sources and the
`checkpoints` table, where each materialization key range keeps its runtime checkpoint and fence (see
materialize/drivers/serving.py for how they commit together with the data).
"""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb

from headrace.errors import FeatureNotSupported, InternalError
from headrace.materialize.protocol import Binding

INTERNAL_SCHEMA = "headrace_internal"
PUBLIC_SCHEMA = "public"
CHECKPOINTS_TABLE = f"{INTERNAL_SCHEMA}.checkpoints"

# The DuckDB column types a binding may use; anything else is refused rather than spliced into DDL.
SUPPORTED_TYPES = frozenset({"VARCHAR", "JSON", "TIMESTAMPTZ", "BIGINT", "INTEGER", "DOUBLE", "BOOLEAN"})


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def qualified_name(resource_path: tuple[str, ...]) -> str:
    """("headrace_internal", "source_u1") -> "headrace_internal"."source_u1"; a 1-part path lives in public."""
    if not 1 <= len(resource_path) <= 2:
        raise InternalError(f"resource path {resource_path!r} must be (table,) or (schema, table)")
    parts = resource_path if len(resource_path) > 1 else (PUBLIC_SCHEMA, *resource_path)
    return ".".join(quote_ident(part) for part in parts)


class ServingStore:
    """Owns the DuckDB database. Thread-safe: each thread or unit of work takes its own `cursor()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._connection = duckdb.connect(str(path))
        self._lock = threading.Lock()  # guards cursor creation and DDL on the shared root connection
        self._connection.execute(f"CREATE SCHEMA IF NOT EXISTS {INTERNAL_SCHEMA}")
        self._connection.execute(f"CREATE SCHEMA IF NOT EXISTS {PUBLIC_SCHEMA}")
        self._connection.execute(
            f"CREATE TABLE IF NOT EXISTS {CHECKPOINTS_TABLE} ("
            "materialization VARCHAR NOT NULL, key_begin BIGINT NOT NULL, key_end BIGINT NOT NULL, "
            "fence BIGINT NOT NULL, checkpoint VARCHAR, PRIMARY KEY (materialization, key_begin, key_end))"
        )

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to the same database, resolving unqualified names in `public`. Close it after use."""
        with self._lock:
            cursor = self._connection.cursor()
        cursor.execute(f"SET search_path = '{PUBLIC_SCHEMA}'")
        return cursor

    def apply(self, binding: Binding) -> None:
        """Create the binding's table if absent (idempotent); refuse an existing table with other columns."""
        missing = [c for c in binding.columns if c not in binding.column_types]
        if missing:
            raise InternalError(f"binding {binding.resource_path} has no type for columns {missing}")
        if len(set(binding.columns)) != len(binding.columns):
            raise InternalError(f"binding {binding.resource_path} names a column twice: {binding.columns}")
        definitions = []
        for column in binding.columns:
            type_name = binding.column_types[column].upper()
            if type_name not in SUPPORTED_TYPES:
                raise FeatureNotSupported(f"column type {type_name} of {column!r} is not supported",
                                          hint=f"supported: {', '.join(sorted(SUPPORTED_TYPES))}")
            not_null = " NOT NULL" if column in binding.key and not binding.delta_updates else ""
            definitions.append(f"{quote_ident(column)} {type_name}{not_null}")
        if binding.key and not binding.delta_updates:  # delta updates append, so keys repeat
            definitions.append(f"PRIMARY KEY ({', '.join(quote_ident(c) for c in binding.key)})")
        table = qualified_name(binding.resource_path)
        with self._lock:
            self._connection.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(definitions)})")
            existing = [row[0] for row in self._connection.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ? "
                "ORDER BY ordinal_position", [_schema_of(binding.resource_path), binding.resource_path[-1]],
            ).fetchall()]
        if existing != list(binding.columns):
            raise InternalError(f"table {table} exists with columns {existing}, the binding expects "
                                f"{list(binding.columns)}; drop it first")

    def drop(self, resource_path: tuple[str, ...]) -> None:
        with self._lock:
            self._connection.execute(f"DROP TABLE IF EXISTS {qualified_name(resource_path)}")

    def close(self) -> None:
        with self._lock:
            self._connection.close()


def _schema_of(resource_path: tuple[str, ...]) -> str:
    return resource_path[-2] if len(resource_path) > 1 else PUBLIC_SCHEMA
