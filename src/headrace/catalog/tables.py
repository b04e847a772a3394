"""The Table catalog item: CREATE TABLE t (col type [NOT NULL], ..., PRIMARY KEY (...)), as data.

Like a source, a table is persisted as its CREATE statement and rebuilt from it (sql/table_statements.py);
`id` names its log directory (<data>/logs/<id>), its Spark checkpoint and its serving-store table, so DROP +
CREATE of the same name starts afresh. A table without a primary key is keyed by a hidden `hr_row_id`
(unique per inserted row), which the public relation does not show."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.catalog.items import DEFAULT_DATABASE, DEFAULT_SCHEMA

HIDDEN_ROW_ID = "hr_row_id"
# Every row version's identity (increasing, given at write time): the old row a change retracts carries the
# version it was inserted with, so views' order-sensitive aggregates (first, last, array_agg) retract exactly.
HIDDEN_VERSION = "hr_version"

# PostgreSQL type name (canonical) -> (serving-store DuckDB type, PostgreSQL type OID). Every type is held exactly
# by a native DuckDB type; numeric's is DECIMAL(p,s) of the column's precision and scale (store/table_types.py).
COLUMN_TYPES: dict[str, tuple[str, int]] = {
    "int2": ("INTEGER", 21), "int4": ("INTEGER", 23), "int8": ("BIGINT", 20),
    "float4": ("DOUBLE", 700), "float8": ("DOUBLE", 701),
    "text": ("VARCHAR", 25), "varchar": ("VARCHAR", 1043), "bpchar": ("VARCHAR", 1042),
    "bool": ("BOOLEAN", 16), "timestamptz": ("TIMESTAMPTZ", 1184),
    "json": ("JSON", 114), "jsonb": ("JSON", 3802), "bytea": ("BLOB", 17),
    "numeric": ("DECIMAL", 1700), "date": ("DATE", 1082), "timestamp": ("TIMESTAMP", 1114), "uuid": ("UUID", 2950),
    "interval": ("INTERVAL", 1186),
}
TYPE_ALIASES = {
    "smallint": "int2", "integer": "int4", "int": "int4", "bigint": "int8", "real": "float4",
    "double precision": "float8", "double": "float8", "float": "float8", "character varying": "varchar",
    "character": "bpchar", "char": "bpchar", "boolean": "bool", "timestamp with time zone": "timestamptz",
    "decimal": "numeric", "timestamp without time zone": "timestamp",
}


@dataclass(frozen=True, slots=True)
class TableColumn:
    name: str
    pg_type: str  # canonical PostgreSQL name: int4, text, varchar, timestamptz, ...
    not_null: bool = False
    max_length: int | None = None  # varchar(n) / char(n)
    # numeric(p,s) (None: unconstrained numeric, held as DECIMAL(38,10)); timestamp(p) / timestamptz(p): p
    # fractional digits of the seconds (None: 6)
    precision: int | None = None
    scale: int | None = None
    default: str | None = None  # DEFAULT: the expression's SQL (coordinator/table_defaults.py evaluates it)

    @property
    def store_type(self) -> str:
        """The DuckDB type of the column in the serving store."""
        if self.pg_type == "numeric":
            from headrace.store.table_types import duckdb_type

            return duckdb_type("numeric", self.precision, self.scale)
        return COLUMN_TYPES[self.pg_type][0]

    @property
    def type_oid(self) -> int:
        return COLUMN_TYPES[self.pg_type][1]

    @property
    def type_sql(self) -> str:
        """The type as PostgreSQL writes it (varchar(10), numeric(10,2), int4, ...)."""
        if self.pg_type == "numeric" and self.precision is not None:
            return f"numeric({self.precision},{self.scale or 0})"
        if self.pg_type in ("timestamp", "timestamptz") and self.precision is not None:
            return f"{self.pg_type}({self.precision})"
        return f"{self.pg_type}({self.max_length})" if self.max_length is not None else self.pg_type


@dataclass(frozen=True, slots=True)
class Table:
    id: str
    name: str
    columns: tuple[TableColumn, ...]
    primary_key: tuple[str, ...]  # empty: keyed by the hidden HIDDEN_ROW_ID
    create_sql: str
    schema: str = DEFAULT_SCHEMA
    database: str = DEFAULT_DATABASE
    kind: str = "table"  # catalog/system describes items by kind

    @property
    def materialization(self) -> str:
        return f"table_{self.id}"

    @property
    def store_key(self) -> tuple[str, ...]:
        """The key of the serving-store table (and of every change record)."""
        return self.primary_key or (HIDDEN_ROW_ID,)

    @property
    def has_hidden_key(self) -> bool:
        return not self.primary_key

    @property
    def not_null_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.not_null or c.name in self.primary_key)

    def column_names(self) -> list[str]:
        """The user-visible columns, in declared order."""
        return [column.name for column in self.columns]

    def column(self, name: str) -> TableColumn | None:
        return next((c for c in self.columns if c.name == name), None)

    def store_columns(self) -> dict[str, str]:
        """Every serving-store column (the key first) -> its DuckDB type."""
        types = {c.name: c.store_type for c in self.columns}
        if self.has_hidden_key:
            return {HIDDEN_ROW_ID: "BIGINT", **types, HIDDEN_VERSION: "BIGINT"}
        keys = {k: types[k] for k in self.primary_key}
        return {**keys, **{c: t for c, t in types.items() if c not in keys}, HIDDEN_VERSION: "BIGINT"}

    def to_entry(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "create_sql": self.create_sql}
