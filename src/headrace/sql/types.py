"""PostgreSQL type OIDs by name, and the serving store's (DuckDB's) types mapped onto them."""

from __future__ import annotations

OID_BY_TYPE_NAME: dict[str, int] = {
    "bool": 16, "bytea": 17, "name": 19, "int8": 20, "int2": 21, "int4": 23, "text": 25, "oid": 26,
    "json": 114, "float4": 700, "float8": 701, "unknown": 705, "varchar": 1043, "date": 1082,
    "timestamp": 1114, "timestamptz": 1184, "interval": 1186, "numeric": 1700, "uuid": 2950, "jsonb": 3802,
}
TEXT_OID = OID_BY_TYPE_NAME["text"]

# DuckDB type names (str(DuckDBPyType)) -> PostgreSQL OID
_DUCKDB_TO_OID: dict[str, int] = {
    "BOOLEAN": 16, "BLOB": 17, "BIGINT": 20, "SMALLINT": 21, "TINYINT": 21, "INTEGER": 23, "VARCHAR": 25,
    "JSON": 3802, "FLOAT": 700, "DOUBLE": 701, "DATE": 1082, "TIMESTAMP": 1114,
    "TIMESTAMP WITH TIME ZONE": 1184, "INTERVAL": 1186, "UUID": 2950, "HUGEINT": 1700, "UBIGINT": 1700,
    "UINTEGER": 20, "USMALLINT": 23, "UTINYINT": 21, "UHUGEINT": 1700, "\"NULL\"": 25, "NULL": 25,
}
# Array OIDs of the element types above (PostgreSQL's _int4 etc.)
_ARRAY_OID: dict[int, int] = {16: 1000, 17: 1001, 20: 1016, 21: 1005, 23: 1007, 25: 1009, 700: 1021, 701: 1022,
                              1082: 1182, 1114: 1115, 1184: 1185, 1186: 1187, 1700: 1231, 2950: 2951, 3802: 3807}


def oid_of_duckdb_type(type_name: str) -> int:
    name = type_name.upper()
    if name.endswith("[]"):
        return _ARRAY_OID.get(oid_of_duckdb_type(name[:-2]), 1009)
    if name.startswith("DECIMAL"):
        return 1700
    if name.startswith("TIMESTAMP") and "TIME ZONE" not in name:
        return 1114
    return _DUCKDB_TO_OID.get(name, TEXT_OID)


# PostgreSQL OID -> the serving store's type, for typing parameters the client declared.
DUCKDB_TYPE_BY_OID: dict[int, str] = {
    16: "BOOLEAN", 17: "BLOB", 20: "BIGINT", 21: "SMALLINT", 23: "INTEGER", 25: "VARCHAR", 1043: "VARCHAR",
    114: "JSON", 3802: "JSON", 700: "FLOAT", 701: "DOUBLE", 1700: "DECIMAL(38, 10)", 1082: "DATE",
    1114: "TIMESTAMP", 1184: "TIMESTAMPTZ", 1186: "INTERVAL", 2950: "UUID",
}
