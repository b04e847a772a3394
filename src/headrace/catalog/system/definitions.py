"""The shape of PostgreSQL 15's system catalogs, as recorded from a real server by
scripts/gen_system_catalog.py into pg15.json, and how each column type is held in DuckDB.

OID-valued columns are UINTEGER (PostgreSQL's oid is an unsigned 32-bit integer), which the result
description maps back to oid; names and other text-like types are VARCHAR (text)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_FILE = Path(__file__).with_name("pg15.json")

# DuckDB database (attached in memory) and its schemas holding headrace's system catalogs.
SYSTEM_DATABASE = "hr_system"
SCHEMA_IN_STORE = {"pg_catalog": "catalog_pg", "information_schema": "catalog_info"}
MACRO_SCHEMA = f"{SYSTEM_DATABASE}.main"

# regproc is kept as the function's name (its text form): headrace catalogs no functions to number.
_OID_TYPES = {"oid", "regclass", "regtype", "regnamespace", "regrole", "regoper",
              "regconfig", "regdictionary", "xid", "cid", "xid8"}
_SCALAR_TYPES = {
    "boolean": "BOOLEAN", "smallint": "SMALLINT", "integer": "INTEGER", "bigint": "BIGINT", "real": "FLOAT",
    "double precision": "DOUBLE", "numeric": "DECIMAL(38, 10)", "bytea": "BLOB", "interval": "INTERVAL",
    "timestamp with time zone": "TIMESTAMPTZ", "information_schema.time_stamp": "TIMESTAMPTZ",
    "information_schema.cardinal_number": "INTEGER",
}
_ARRAY_LIKE = {"int2vector": "SMALLINT[]", "oidvector": "UINTEGER[]"}


def duckdb_type(pg_type_name: str) -> str:
    """The DuckDB column type holding values of this PostgreSQL type (format_type spelling)."""
    if pg_type_name in _ARRAY_LIKE:
        return _ARRAY_LIKE[pg_type_name]
    if pg_type_name.endswith("[]"):
        element = pg_type_name[:-2]
        if element in ("aclitem", "pg_statistic", "anyarray"):
            return "VARCHAR[]"
        return duckdb_type(element) + "[]"
    if pg_type_name in _OID_TYPES:
        return "UINTEGER"
    return _SCALAR_TYPES.get(pg_type_name, "VARCHAR")  # name, text, "char", pg_node_tree, sql_identifier, ...


@dataclass(frozen=True, slots=True)
class SystemRelation:
    schema: str  # "pg_catalog" or "information_schema"
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, PostgreSQL type as format_type prints it)

    @property
    def store_name(self) -> str:
        """The relation's DuckDB name, fully qualified."""
        return f'{SYSTEM_DATABASE}.{SCHEMA_IN_STORE[self.schema]}."{self.name}"'

    def create_sql(self) -> str:
        columns = ", ".join(f'"{name}" {duckdb_type(type_name)}' for name, type_name in self.columns)
        return f"CREATE TABLE {self.store_name} ({columns})"


@functools.cache
def _data() -> dict[str, Any]:
    return json.loads(DATA_FILE.read_text())  # type: ignore[no-any-return]


@functools.cache
def system_relations() -> dict[tuple[str, str], SystemRelation]:
    relations: dict[tuple[str, str], SystemRelation] = {}
    for qualified, columns in _data()["relations"].items():
        schema, name = qualified.split(".", 1)
        relations[(schema, name)] = SystemRelation(schema, name, tuple((c, t) for c, t in columns))
    return relations


def find_system_relation(schema: str | None, name: str) -> SystemRelation | None:
    """pg_catalog comes first on PostgreSQL's search path, so an unqualified name finds it too."""
    relations = system_relations()
    if schema is None:
        return relations.get(("pg_catalog", name))
    return relations.get((schema, name))


def static_rows() -> dict[tuple[str, str], list[list[str | None]]]:
    """Rows (as PostgreSQL's text output) of the catalogs describing PostgreSQL's built-in objects."""
    return {tuple(key.split(".", 1)): rows for key, rows in _data()["rows"].items()}  # type: ignore[misc]
