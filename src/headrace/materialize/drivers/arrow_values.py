"""Arrow conversions the sink drivers share: a DuckDB column type's Arrow type, row-path values (the protocol's
JSON conventions: timestamps as integer microseconds, decimals as text, dates ISO, bytes base64) to and from Arrow
columns, and a columnar Store's rows as documents. PARQUET writes these types; REDIS and HTTP encode the documents.

Types: integers as such, HUGEINT decimal128(38,0), DOUBLE/FLOAT float64/float32, DECIMAL(p,s) decimal128(p,s),
VARCHAR/UUID/JSON string (JSON as its text), BOOLEAN, TIMESTAMPTZ timestamp[us, UTC], TIMESTAMP timestamp[us],
DATE date32, BLOB binary.
"""

from __future__ import annotations

import base64
import datetime
import json
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson
import pyarrow as pa

from headrace.errors import DataError, FeatureNotSupported
from headrace.store.table_types import decimal_shape

_EPOCH_DATE = datetime.date(1970, 1, 1)

_FIXED_TYPES: dict[str, pa.DataType] = {
    "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INTEGER": pa.int32(), "BIGINT": pa.int64(),
    "UTINYINT": pa.uint8(), "USMALLINT": pa.uint16(), "UINTEGER": pa.uint32(), "UBIGINT": pa.uint64(),
    "HUGEINT": pa.decimal128(38, 0), "DOUBLE": pa.float64(), "FLOAT": pa.float32(), "REAL": pa.float32(),
    "VARCHAR": pa.string(), "UUID": pa.string(), "JSON": pa.string(), "BOOLEAN": pa.bool_(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"), "TIMESTAMP": pa.timestamp("us"), "DATE": pa.date32(),
    "BLOB": pa.binary(),
}


def normalized_type(type_name: str) -> str:
    return " ".join(type_name.upper().split()).replace(", ", ",")


def arrow_type(type_name: str) -> pa.DataType | None:
    """The Arrow (and Parquet) type of a DuckDB column type, None if these sinks cannot hold it."""
    name = normalized_type(type_name)
    if name == "DECIMAL":
        return pa.decimal128(18, 3)  # DuckDB's default DECIMAL
    shape = decimal_shape(name)
    if shape is not None:
        return pa.decimal128(*shape) if 0 < shape[0] <= 38 and 0 <= shape[1] <= shape[0] else None
    return _FIXED_TYPES.get(name)


def required_arrow_type(name: str, type_name: str) -> pa.DataType:
    result = arrow_type(type_name)
    if result is None:
        raise FeatureNotSupported(f"column {name!r} has type {type_name}, which this sink cannot hold")
    return result


def dump_json(value: Any) -> str:
    """JSON text by orjson; the json module for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _decimal(value: Any) -> Decimal:
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number")
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def _date(value: Any) -> datetime.date:
    return datetime.date.fromisoformat(value) if isinstance(value, str) else _EPOCH_DATE + datetime.timedelta(days=value)


def _blob(value: Any) -> bytes:
    return value if isinstance(value, bytes) else base64.b64decode(value, validate=True)


def array_from_values(name: str, type_name: str, values: list[Any]) -> pa.Array:
    """Row-path values of one column as an Arrow array of its type (DataError naming the culprit)."""
    kind = required_arrow_type(name, type_name)
    convert = (_decimal if pa.types.is_decimal(kind) else dump_json if normalized_type(type_name) == "JSON"
               else _date if pa.types.is_date(kind) else _blob if pa.types.is_binary(kind) else None)
    try:
        if pa.types.is_timestamp(kind):
            return pa.array(values, pa.int64()).cast(kind)  # integer microseconds since the epoch
        return pa.array(values if convert is None else [None if v is None else convert(v) for v in values], kind)
    except (pa.ArrowException, TypeError, ValueError, OverflowError, InvalidOperation) as exc:
        culprit = next((v for v in values if not _converts(name, type_name, v)), "?")
        raise DataError(f"column {name!r} ({type_name}) cannot hold {culprit!r}: {exc}") from exc


def _converts(name: str, type_name: str, value: Any) -> bool:
    try:
        array_from_values(name, type_name, [value])
    except DataError:
        return False
    return True


def conform_column(name: str, type_name: str, column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A columnar-path column (StoreColumns conventions or DuckDB's own Arrow types) as the column's Arrow type."""
    kind = required_arrow_type(name, type_name)
    source = column.type
    try:
        if pa.types.is_timestamp(kind) and pa.types.is_integer(source):
            return column.cast(pa.int64()).cast(kind)
        if pa.types.is_date(kind) and pa.types.is_integer(source):
            return column.cast(pa.int32()).cast(kind)
        if normalized_type(type_name) == "UUID" and pa.types.is_fixed_size_binary(source):
            import uuid
            return pa.array([None if v is None else str(uuid.UUID(bytes=v)) for v in column.to_pylist()], kind)
        if isinstance(source, pa.ExtensionType):
            column = column.cast(source.storage_type)
        result = column.cast(kind)
    except (pa.ArrowException, ValueError) as exc:
        raise DataError(f"column {name!r} ({type_name}) cannot hold a {source} column: {exc}") from exc
    if normalized_type(type_name) == "JSON":  # JSON arrives as text: refuse text that is not JSON
        for text in (result.to_pylist() if result.null_count < len(result) else ()):
            if text is not None:
                try:
                    orjson.loads(text)
                except orjson.JSONDecodeError as exc:
                    raise DataError(f"column {name!r} (JSON) holds text that is not JSON: {text[:80]!r}") from exc
    return result


def values_from_array(type_name: str, column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """An Arrow column (its own type or conformed) as row-path values (protocol conventions)."""
    kind = column.type
    name = normalized_type(type_name)
    if pa.types.is_timestamp(kind) or (name in ("TIMESTAMPTZ", "TIMESTAMP") and pa.types.is_integer(kind)):
        return column.cast(pa.int64()).to_pylist()
    values = column.to_pylist()
    if name == "JSON":
        return [None if v is None else orjson.loads(v) for v in values]
    if pa.types.is_decimal(kind):
        if name == "HUGEINT":
            return [None if v is None else int(v) for v in values]
        return [None if v is None else format(v, "f") for v in values]
    if pa.types.is_date(kind):
        return [None if v is None else v.isoformat() for v in values]
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return [None if v is None else base64.b64encode(v).decode() for v in values]
    return values


def documents_from_table(columns: list[tuple[str, str]], table: pa.Table) -> list[dict[str, Any]]:
    """Rows of a columnar Store as row-path documents {column: value} (columns absent from the table: None)."""
    by_column = [(name, values_from_array(type_name, table[name]) if name in table.column_names
                  else [None] * table.num_rows) for name, type_name in columns]
    names = [name for name, _ in by_column]
    return [dict(zip(names, row)) for row in zip(*(values for _, values in by_column))]
