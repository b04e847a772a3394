"""PostgreSQL types as the SQL layer names them (pg_type.typname), and the serving store's (DuckDB's)
types mapped onto them. The OIDs and array OIDs themselves live once, in headrace.pgwire.types."""

from __future__ import annotations

from headrace.pgwire import types as pg

OID_BY_TYPE_NAME: dict[str, int] = {
    "bool": pg.BOOL, "bytea": pg.BYTEA, "name": pg.NAME, "int8": pg.INT8, "int2": pg.INT2, "int4": pg.INT4,
    "text": pg.TEXT, "oid": pg.OID, "json": pg.JSON, "float4": pg.FLOAT4, "float8": pg.FLOAT8,
    "unknown": pg.UNKNOWN, "varchar": pg.VARCHAR, "date": pg.DATE, "timestamp": pg.TIMESTAMP,
    "timestamptz": pg.TIMESTAMPTZ, "interval": pg.INTERVAL, "numeric": pg.NUMERIC, "uuid": pg.UUID,
    "jsonb": pg.JSONB,
}
TEXT_OID = pg.TEXT

# DuckDB type names (str(DuckDBPyType)) -> PostgreSQL OID
_DUCKDB_TO_OID: dict[str, int] = {
    "BOOLEAN": pg.BOOL, "BLOB": pg.BYTEA, "BIGINT": pg.INT8, "SMALLINT": pg.INT2, "TINYINT": pg.INT2,
    "INTEGER": pg.INT4, "VARCHAR": pg.TEXT, "JSON": pg.JSONB, "FLOAT": pg.FLOAT4, "DOUBLE": pg.FLOAT8,
    "DATE": pg.DATE, "TIMESTAMP": pg.TIMESTAMP, "TIMESTAMP WITH TIME ZONE": pg.TIMESTAMPTZ,
    "INTERVAL": pg.INTERVAL, "UUID": pg.UUID, "HUGEINT": pg.NUMERIC, "UBIGINT": pg.NUMERIC,
    # UINTEGER: only headrace's system catalogs use it, for PostgreSQL's oid (unsigned 32-bit).
    "UINTEGER": pg.OID, "USMALLINT": pg.INT4, "UTINYINT": pg.INT2, "UHUGEINT": pg.NUMERIC,
    "\"NULL\"": pg.TEXT, "NULL": pg.TEXT,
}

# PostgreSQL OID -> the serving store's type, for typing parameters the client declared.
DUCKDB_TYPE_BY_OID: dict[int, str] = {
    pg.BOOL: "BOOLEAN", pg.BYTEA: "BLOB", pg.INT8: "BIGINT", pg.INT2: "SMALLINT", pg.INT4: "INTEGER",
    pg.TEXT: "VARCHAR", pg.VARCHAR: "VARCHAR", pg.JSON: "JSON", pg.JSONB: "JSON", pg.FLOAT4: "FLOAT",
    pg.FLOAT8: "DOUBLE", pg.NUMERIC: "DECIMAL(38, 10)", pg.DATE: "DATE", pg.TIMESTAMP: "TIMESTAMP",
    pg.TIMESTAMPTZ: "TIMESTAMPTZ", pg.INTERVAL: "INTERVAL", pg.UUID: "UUID",
    pg.OID: "UINTEGER", pg.NAME: "VARCHAR", pg.CHAR: "VARCHAR", pg.BPCHAR: "VARCHAR",
}
# Arrays of those: int4[] -> INTEGER[], oid[] -> UINTEGER[], ...
DUCKDB_TYPE_BY_OID.update({array_oid: f"{element}[]" for oid, element in list(DUCKDB_TYPE_BY_OID.items())
                           if (array_oid := pg.array_oid_of(oid)) is not None})


def oid_of_duckdb_type(type_name: str) -> int:
    name = type_name.upper()
    if name.endswith("[]"):
        return pg.array_oid_of(oid_of_duckdb_type(name[:-2])) or pg.array_oid_of(pg.TEXT) or pg.TEXT
    if name.startswith("DECIMAL"):
        return pg.NUMERIC
    if name.startswith("TIMESTAMP") and "TIME ZONE" not in name:
        return pg.TIMESTAMP
    return _DUCKDB_TO_OID.get(name, pg.TEXT)
