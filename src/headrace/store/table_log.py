"""A table's durable log: the record codec, and the "document form" of row values.

One log record holds every change one autocommit statement or one COMMIT made to one table, so a
transaction is atomic for the pipeline (a record is whole or absent: CRC-framed by headrace.log) and
for readers (the pipeline applies a record in one materialization transaction):

    {"v": 1, "c": [[op, key, new, old], ...]}        (orjson)
    {"v": 1, "t": "<transaction id>", "c": [...]}    (a record of a COMMIT that changed several tables)

op is "i" (insert), "u" (update) or "d" (delete); key is the row's key values (primary key, or the hidden
row id); new is the row after (None for a delete), old the row before (None for an insert). Both are
documents: column -> value in the serving driver's JSON form (materialize/drivers/serving.py): integers,
floats, text, booleans, TIMESTAMPTZ as integer microseconds since the epoch (UTC), JSON as its JSON value,
BLOB as base64 text; numeric, date, timestamp, uuid and interval as store/table_types.py says (exact). The changes of one record are net per key (one change per key).

Pure stdlib + orjson: decoded in the Spark driver of the pipeline."""

from __future__ import annotations

import base64
import datetime
import struct
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import orjson

from headrace.store import table_types

RECORD_VERSION = 1
INSERT, UPDATE, DELETE = "i", "u", "d"
Document = dict[str, Any]
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


@dataclass(frozen=True, slots=True)
class RowChange:
    op: str
    key: tuple[Any, ...]
    new: Document | None
    old: Document | None


def encode_changes(changes: list[RowChange], transaction: str | None = None) -> bytes:
    record: dict[str, Any] = {"v": RECORD_VERSION, "c": [[c.op, list(c.key), c.new, c.old] for c in changes]}
    if transaction is not None:  # ties the per-table records of one COMMIT together (coordinator/table_commits.py)
        record["t"] = transaction
    return orjson.dumps(record)


def record_transaction(payload: bytes) -> str | None:
    """The transaction id a record carries (None for one-table writes)."""
    transaction = orjson.loads(payload).get("t")
    return str(transaction) if transaction is not None else None


def decode_changes(payload: bytes) -> list[RowChange]:
    record = orjson.loads(payload)
    if record.get("v") != RECORD_VERSION:
        raise ValueError(f"unknown table log record version {record.get('v')!r}")
    return [RowChange(op, tuple(key), new, old) for op, key, new, old in record["c"]]


def change_between(key: tuple[Any, ...], old: Document | None, new: Document | None) -> RowChange | None:
    """The net change from `old` to `new` (None when nothing changed)."""
    if old is None and new is None:
        return None
    if old is None:
        return RowChange(INSERT, key, new, None)
    if new is None:
        return RowChange(DELETE, key, None, old)
    if old == new:
        return None
    return RowChange(UPDATE, key, new, old)


# ---------------------------------------------------------------------------------------------- values

class ValueError_(Exception):
    """A value that does not fit its column: (sqlstate, message)."""

    def __init__(self, sqlstate: str, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail


_INT_RANGES = {"int2": (-(1 << 15), (1 << 15) - 1, "smallint"), "int4": (-(1 << 31), (1 << 31) - 1, "integer"),
               "int8": (-(1 << 63), (1 << 63) - 1, "bigint")}
_TRUE = {"t", "true", "y", "yes", "on", "1"}
_FALSE = {"f", "false", "n", "no", "off", "0"}
_TYPE_NAMES = {"int2": "smallint", "int4": "integer", "int8": "bigint", "float4": "real", "float8": "double precision",
               "bool": "boolean", "timestamptz": "timestamp with time zone", "bpchar": "character",
               "varchar": "character varying"}


def to_document(pg_type: str, value: Any, max_length: int | None = None, precision: int | None = None,
                scale: int | None = None) -> Any:
    """A Python value (from DuckDB, a COPY row or a parameter) as the document form of a column of `pg_type`.
    Text converts as PostgreSQL's input function would; bad input raises ValueError_ (22P02, 22003, 22001)."""
    if value is None:
        return None
    if pg_type in table_types.EXACT_TYPES:
        try:
            return table_types.to_document(pg_type, value, precision, scale)
        except table_types.TypeValueError as error:
            raise ValueError_(error.sqlstate, error.message, error.detail) from None
    if pg_type in _INT_RANGES:
        low, high, name = _INT_RANGES[pg_type]
        number = _integer(value, name)
        if not low <= number <= high:
            raise ValueError_("22003", f"{name} out of range")
        return number
    if pg_type in ("float4", "float8"):
        if isinstance(value, bool):
            raise _bad(pg_type, value)
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise _bad(pg_type, value) from None
        if pg_type == "float4":
            _check_real(value, number)
        return number
    if pg_type in ("text", "varchar", "bpchar"):
        text = value if isinstance(value, str) else _as_text(value)
        if max_length is not None:
            if pg_type == "bpchar":
                text = text.rstrip(" ") if len(text) > max_length else text
            if len(text) > max_length:
                shown = "character varying" if pg_type == "varchar" else "character"
                raise ValueError_("22001", f"value too long for type {shown}({max_length})")
        return text
    if pg_type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise _bad(pg_type, value)
    if pg_type == "timestamptz":
        return table_types.round_time(_micros(value), precision)
    if pg_type in ("json", "jsonb"):
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value).decode("utf-8")
        if isinstance(value, str):
            try:
                return orjson.loads(value)
            except orjson.JSONDecodeError:
                raise ValueError_("22P02", f"invalid input syntax for type json: {value[:40]!r}") from None
        return value
    if pg_type == "bytea":
        if isinstance(value, str):
            value = _bytea_from_text(value)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise _bad(pg_type, value)
        return base64.b64encode(bytes(value)).decode("ascii")
    raise ValueError_("0A000", f"type {pg_type} is not supported in tables")


def from_store(store_type: str, value: Any) -> Any:
    """A value read from the serving store (DuckDB) as its document form."""
    if value is None:
        return None
    if store_type == "TIMESTAMPTZ":
        return _micros(value)
    if store_type == "BLOB":
        return base64.b64encode(bytes(value)).decode("ascii")
    if store_type == "JSON":
        return orjson.loads(value) if isinstance(value, (str, bytes)) else value
    exact = _EXACT_BY_STORE_TYPE.get(store_type.split("(")[0].upper())
    if exact is not None:
        return table_types.from_store(exact, value)
    return value


_EXACT_BY_STORE_TYPE = {"DECIMAL": "numeric", "DATE": "date", "TIMESTAMP": "timestamp", "UUID": "uuid",
                        "INTERVAL": "interval"}


def _check_real(value: Any, number: float) -> None:
    """A finite value beyond real's range (or so small it would become 0) is PostgreSQL's 22003, as float4in and
    the float8 -> float4 cast refuse it (never stored to fail every later read of the column as real)."""
    if number != number or number in (float("inf"), float("-inf")):
        return
    try:
        narrowed = struct.unpack("f", struct.pack("f", number))[0]
    except OverflowError:
        narrowed = float("inf")
    if narrowed in (float("inf"), float("-inf")) or (narrowed == 0.0 and number != 0.0):
        if isinstance(value, float):
            kind = "overflow" if narrowed != 0.0 else "underflow"
            raise ValueError_("22003", f"value out of range: {kind}")
        text = value.strip() if isinstance(value, str) else format(Decimal(value), "f")
        raise ValueError_("22003", f'"{text}" is out of range for type real')


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError_("22P02", f'invalid input syntax for type {name}: "{value}"')
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError_("22003", f"{name} out of range")
        return int(Decimal(value).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    if isinstance(value, Decimal):
        return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP))
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            raise ValueError_("22P02", f'invalid input syntax for type {name}: "{value}"') from None
    raise ValueError_("42804", f"column is of type {name} but expression is of type {type(value).__name__}")


def _micros(value: Any) -> int:
    if isinstance(value, table_types.Exact):
        return value.number
    if isinstance(value, str):
        from headrace.pgwire import types as pg
        from headrace.errors import HeadraceError

        try:
            value = pg.decode_parameter(pg.TIMESTAMPTZ, pg.TEXT_FORMAT, value.encode())
        except HeadraceError as error:
            raise ValueError_(error.sqlstate, error.message) from None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, datetime.date):
        return _micros(datetime.datetime(value.year, value.month, value.day, tzinfo=datetime.timezone.utc))
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _bad("timestamptz", value)


def _bytea_from_text(text: str) -> bytes:
    from headrace.pgwire import types as pg
    from headrace.errors import HeadraceError

    try:
        return bytes(pg.decode_parameter(pg.BYTEA, pg.TEXT_FORMAT, text.encode()))
    except HeadraceError as error:
        raise ValueError_(error.sqlstate, error.message) from None


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    return str(value)


def _bad(pg_type: str, value: Any) -> ValueError_:
    return ValueError_("22P02", f'invalid input syntax for type {_TYPE_NAMES.get(pg_type, pg_type)}: "{value}"')
