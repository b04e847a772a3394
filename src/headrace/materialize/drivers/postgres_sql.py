"""Types, COPY payloads and SQL expressions of the PostgreSQL sink driver (drivers/postgres.py).

Type map (DuckDB type of the binding -> PostgreSQL column type, as `format_type` spells it, so an existing column is
compared by name): BOOLEAN boolean, SMALLINT smallint, INTEGER integer, BIGINT bigint, HUGEINT numeric(39,0), DOUBLE
double precision, FLOAT real, DECIMAL(p,s) numeric(p,s), VARCHAR text, UUID uuid, JSON jsonb, TIMESTAMPTZ timestamp
with time zone, TIMESTAMP timestamp without time zone, DATE date, BLOB bytea, INTERVAL interval (staged from integer
microseconds, read back as them with 1 month = 30 days, as the documents carry it). Any other type has no equivalent.

Writes are CSV COPY payloads printed by `pyarrow.csv.write_csv` from Arrow columns in one staged type per column
(`staged_type`): Arrow's writer quotes every string (so "" is an empty string and an unquoted empty field NULL, as
PostgreSQL's CSV reads them), prints floats in their shortest exact form, decimals exactly, and timestamps as ISO text
with microseconds (timestamptz too, as a UTC wall clock: the session's TimeZone is UTC). bytea travels as `\\x` hex
text, built per value (the only per-value Python on the columnar path; BLOB columns are rare), JSON values of
Stores as orjson text. Columnar reads are `COPY (SELECT ...) TO STDOUT (FORMAT csv)` parsed by `pyarrow.csv.read_csv`
with explicit types (time as integer microseconds: extract(epoch) is exact numeric; dates as integer days; bytea as
hex); documents are JSON built by PostgreSQL (`document_object`)."""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pa_csv

from headrace.errors import DataError, FeatureNotSupported, InvalidParameterValue

_DECIMAL = re.compile(r"(?:DECIMAL|NUMERIC)(?:\((\d+),(\d+)\))?")
_ALIASES = {"INT": "INTEGER", "INT4": "INTEGER", "INT8": "BIGINT", "INT2": "SMALLINT", "BOOL": "BOOLEAN",
            "FLOAT8": "DOUBLE", "FLOAT4": "FLOAT", "REAL": "FLOAT", "TEXT": "VARCHAR", "STRING": "VARCHAR",
            "BYTEA": "BLOB", "TIMESTAMP WITH TIME ZONE": "TIMESTAMPTZ"}
_PG_TYPES = {"BOOLEAN": "boolean", "SMALLINT": "smallint", "INTEGER": "integer", "BIGINT": "bigint",
             "HUGEINT": "numeric(39,0)", "DOUBLE": "double precision", "FLOAT": "real", "VARCHAR": "text",
             "UUID": "uuid", "JSON": "jsonb", "TIMESTAMPTZ": "timestamp with time zone",
             "TIMESTAMP": "timestamp without time zone", "DATE": "date", "BLOB": "bytea",
             "INTERVAL": "interval"}
_INTEGERS = ("SMALLINT", "INTEGER", "BIGINT")
# Both stage as naive UTC wall clocks: the session's TimeZone is UTC, so PostgreSQL reads a timestamptz without zone
# as UTC; and Arrow prints a zoned timestamp ~25x slower (160 ms per 100,000 values).
_TIMES = {"TIMESTAMPTZ": pa.timestamp("us"), "TIMESTAMP": pa.timestamp("us")}
ORD = "headrace_ord"  # the Load's position, a column of the keys table (answers name their request)
MAX_IDENTIFIER_BYTES = 63  # PostgreSQL truncates longer names silently


def duckdb_type(type_name: str) -> str | None:
    """The canonical DuckDB type name the driver maps ("DECIMAL(18,2)", "BIGINT"), None if it has no PostgreSQL
    equivalent. DECIMAL without a shape is DuckDB's DECIMAL(18,3)."""
    name = " ".join(type_name.upper().split())
    name = _ALIASES.get(name, name)
    if name.startswith("VARCHAR("):
        return "VARCHAR"
    match = _DECIMAL.fullmatch(name.replace(" ", ""))
    if match:
        precision, scale = (int(match[1]), int(match[2])) if match[1] else (18, 3)
        return f"DECIMAL({precision},{scale})" if 0 < precision <= 38 and scale <= precision else None
    return name if name in _PG_TYPES else None


def pg_type(canonical: str) -> str:
    if canonical.startswith("DECIMAL("):
        return "numeric" + canonical[len("DECIMAL"):]
    return _PG_TYPES[canonical]


def ident(name: str) -> str:
    if "\x00" in name or not name or len(name.encode()) > MAX_IDENTIFIER_BYTES:
        raise InvalidParameterValue(f"{name!r} is not a usable PostgreSQL name (1 to {MAX_IDENTIFIER_BYTES} bytes)")
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # canonical DuckDB type
    sql: str  # the quoted identifier

    @property
    def pg_type(self) -> str:
        return pg_type(self.type)


def column(name: str, type_name: str) -> Column:
    canonical = duckdb_type(type_name)
    if canonical is None:
        raise FeatureNotSupported(f"column {name!r}: type {type_name} has no PostgreSQL equivalent")
    return Column(name, canonical, ident(name))


# ------------------------------------------------------------------------------------------ writes (staged Arrow)

def staged_type(col: Column) -> pa.DataType:
    """The one Arrow type a column is staged in (so staged batches concatenate), printed as PostgreSQL reads it."""
    if col.type == "BOOLEAN":
        return pa.bool_()
    if col.type in _INTEGERS:
        return pa.int64()
    if col.type in ("DOUBLE", "FLOAT"):
        return pa.float64()  # a float32 widened prints more digits; PostgreSQL rounds them back to the same real
    return _TIMES.get(col.type, pa.string())  # numeric, text, uuid, json, date and bytea travel as text


def _data_error(col: Column, detail: str) -> DataError:
    return DataError(f"column {col.name!r} ({col.type}) cannot hold {detail}")


_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError,
                      OverflowError)


def _hex_bytea(values: Sequence[bytes | None]) -> pa.Array:
    return pa.array([None if v is None else "\\x" + v.hex() for v in values], pa.string())


def staged_from_values(col: Column, values: Sequence[Any]) -> pa.Array:
    """A row-path column (JSON-able values, shared contract conventions) in its staged Arrow type."""
    try:
        if col.type == "JSON":
            return pa.array([None if v is None else dump_json(v) for v in values], pa.string())
        if col.type == "BLOB":
            return _hex_bytea([None if v is None else base64.b64decode(v, validate=True) for v in values])
        if col.type == "HUGEINT" or col.type.startswith("DECIMAL("):
            return pa.array([v if v is None or type(v) is str else str(v) for v in values], pa.string())
        if col.type in _TIMES:
            micros = pa.array(values, pa.int64())
            infinite = _with_infinities(micros, col.type)
            return micros.cast(_TIMES[col.type]) if infinite is None else infinite
        if col.type == "INTERVAL":
            return _interval_text(pa.array(values, pa.int64()))
        if col.type == "DATE" and any(type(v) is int for v in values):  # days since the epoch, leniently
            days = pa.array(values, pa.int32())
            infinite = _with_infinities(days, col.type)
            return days.cast(pa.date32()).cast(pa.string()) if infinite is None else infinite
        return pa.array(values, staged_type(col))
    except _CONVERSION_ERRORS as exc:
        raise _data_error(col, f"these values: {exc}") from exc


def staged_from_arrow(col: Column, values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A columnar (Arrow) column in its staged type: DuckDB's Arrow types and the int64-microsecond convention."""
    kind = values.type
    try:
        if pa.types.is_dictionary(kind):
            values, kind = values.cast(kind.value_type), kind.value_type
        if col.type in _TIMES:
            if pa.types.is_integer(kind):
                infinite = _with_infinities(values.cast(pa.int64()), col.type)
                return values.cast(pa.int64()).cast(_TIMES[col.type]) if infinite is None else infinite
            if kind == pa.timestamp("us") or kind == pa.timestamp("us", "UTC"):
                infinite = _with_infinities(values.cast(pa.int64()), col.type)
                if infinite is not None:
                    return infinite
            return values.cast(_TIMES[col.type], safe=False)  # nanoseconds: PostgreSQL keeps microseconds anyway
        if col.type == "DATE":
            if pa.types.is_integer(kind):
                infinite = _with_infinities(values.cast(pa.int32()), col.type)
                if infinite is not None:
                    return infinite
                values = values.cast(pa.int32()).cast(pa.date32())
            return values.cast(pa.string())
        if col.type == "INTERVAL":
            return _interval_text(values.cast(pa.int64()))  # duration("us") or integer microseconds
        if col.type == "BLOB":
            if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)):
                raise TypeError(f"expected binary, got {kind}")
            return _hex_bytea(values.to_pylist())
        if col.type == "UUID" and (pa.types.is_fixed_size_binary(kind) or isinstance(kind, pa.BaseExtensionType)):
            return pa.array([None if v is None else str(v if isinstance(v, uuid.UUID) else uuid.UUID(bytes=v))
                             for v in values.to_pylist()], pa.string())  # arrow.uuid or its 16 bytes
        return values.cast(staged_type(col))
    except _CONVERSION_ERRORS as exc:
        raise _data_error(col, f"a {kind} column: {exc}") from exc


# The documents' range that Arrow prints as PostgreSQL reads it (years 1 to 9999, as microseconds / days since 1970);
# beyond it (BC, year 10000 on, +-infinity: store/table_types.py) a value is printed by headrace.
_ISO_RANGE = {"TIMESTAMP": (-62_135_596_800_000_000, 253_402_300_799_999_999),
              "TIMESTAMPTZ": (-62_135_596_800_000_000, 253_402_300_799_999_999), "DATE": (-719_162, 2_932_896)}


def _with_infinities(numbers: pa.Array | pa.ChunkedArray, type_name: str) -> pa.Array | pa.ChunkedArray | None:
    """Integer microseconds (days for DATE) as PostgreSQL's input text when some lie beyond years 1..9999 (BC,
    10000 on, 'infinity', '-infinity'); None when none does (the common case: staged as Arrow timestamps)."""
    import pyarrow.compute as pc

    from headrace.store.table_types import date_text, time_text

    low, high = _ISO_RANGE[type_name]
    if not pc.any(pc.or_(pc.less(numbers, low), pc.greater(numbers, high))).as_py():
        return None
    text = date_text if type_name == "DATE" else (lambda value: time_text(value, with_zone=False))
    return pa.array([None if value is None else text(value) for value in numbers.to_pylist()], pa.string())


MICROS_PER_DAY = 86_400_000_000


def interval_input(micros: int) -> str:
    """One value as _interval_text writes it."""
    days = abs(micros) // MICROS_PER_DAY * (1 if micros >= 0 else -1)  # toward zero, as pyarrow's divide
    return f"{days} days {micros - days * MICROS_PER_DAY} microseconds"


def _interval_text(micros: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Integer microseconds as PostgreSQL's interval input, whole days apart ("1 days 7200000000 microseconds"; the
    days truncated toward zero, so both parts share one sign); NULL stays NULL. headrace's interval value is a
    duration (a timedelta), in which 24 hours are a day: PostgreSQL then prints `1 day 02:00:00` as headrace's
    codec does (store/table_types.py), not `26:00:00`."""
    import pyarrow.compute as pc

    days = pc.divide(micros, MICROS_PER_DAY)  # integer division truncates toward zero
    rest = pc.subtract(micros, pc.multiply(days, MICROS_PER_DAY))
    return pc.binary_join_element_wise(days.cast(pa.string()), pa.scalar(" days "), rest.cast(pa.string()),
                                       pa.scalar(" microseconds"), "")


def csv_payload(table: pa.Table | pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(table, sink, pa_csv.WriteOptions(include_header=False, batch_size=8192))
    return sink.getvalue()


def dump_json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # integers beyond 64 bits
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ------------------------------------------------------------------------------------------ reads

@dataclass(frozen=True, slots=True)
class Read:
    """How one column is selected, parsed from CSV, and finished into its LoadedColumns type (None: as parsed)."""

    select: str
    parse_type: pa.DataType
    finish: Callable[[pa.ChunkedArray], pa.ChunkedArray] | None = None


def _epoch_us(expr: str) -> str:
    return f"(extract(epoch from {expr}) * 1000000)::bigint"


_INFINITIES = {"TIMESTAMP": ((1 << 63) - 1, -(1 << 63)), "DATE": ((1 << 31) - 1, -(1 << 31))}


def _time_us(expr: str) -> str:
    """A timestamp(tz) as integer microseconds, +-infinity as the extreme integers the documents carry."""
    high, low = _INFINITIES["TIMESTAMP"]
    return f"CASE WHEN {expr} = 'infinity' THEN {high} WHEN {expr} = '-infinity' THEN {low} ELSE {_epoch_us(expr)} END"


def _date_days(expr: str) -> str:
    high, low = _INFINITIES["DATE"]
    return (f"CASE WHEN {expr} = 'infinity' THEN {high} WHEN {expr} = '-infinity' THEN {low} "
            f"ELSE ({expr} - date '1970-01-01') END")


def _from_hex(values: pa.ChunkedArray) -> pa.Array:
    return pa.array([None if v is None else bytes.fromhex(v) for v in values.to_pylist()], pa.binary())


def columnar_read(col: Column, expr: str) -> Read:
    """LoadedColumns' conventions: JSON as text, TIMESTAMPTZ as int64 microseconds, BLOB as binary, the others as
    DuckDB's own Arrow types (so a loaded row can be stored back as it is)."""
    if col.type == "TIMESTAMPTZ":
        return Read(_time_us(expr), pa.int64())
    if col.type == "TIMESTAMP":
        return Read(_time_us(expr), pa.int64(), lambda a: a.cast(pa.timestamp("us")))
    if col.type == "DATE":
        return Read(_date_days(expr), pa.int32(), lambda a: a.cast(pa.date32()))
    if col.type == "INTERVAL":
        return Read(_epoch_us(expr), pa.int64(), lambda a: a.cast(pa.duration("us")))
    if col.type == "BLOB":
        return Read(f"encode({expr}, 'hex')", pa.string(), _from_hex)
    if col.type in ("JSON", "UUID"):
        return Read(f"{expr}::text", pa.string())
    if col.type == "HUGEINT":
        return Read(expr, pa.decimal128(38, 0))
    if col.type.startswith("DECIMAL("):
        precision, scale = col.type[len("DECIMAL("):-1].split(",")
        return Read(expr, pa.decimal128(int(precision), int(scale)))
    arrow = {"BOOLEAN": pa.bool_(), "SMALLINT": pa.int16(), "INTEGER": pa.int32(), "BIGINT": pa.int64(),
             "DOUBLE": pa.float64(), "FLOAT": pa.float32(), "VARCHAR": pa.string()}[col.type]
    return Read(expr, arrow)


def document_expr(col: Column, expr: str, hugeint_as_text: bool = False) -> str:
    """A JSON value expression of the column in the documents' conventions (shared contract). json_build_object
    keeps float8's own shortest text (jsonb would turn 1e300 into 301 digits); HUGEINT as text reads back exactly
    (orjson would turn an integer beyond 64 bits into a float)."""
    if col.type in _TIMES:
        return _time_us(expr)
    if col.type == "INTERVAL":
        return _epoch_us(expr)
    if col.type == "DATE":
        return f"CASE WHEN isfinite({expr}) THEN to_char({expr}, 'YYYY-MM-DD') ELSE {expr}::text END"
    if col.type == "BLOB":  # PostgreSQL's base64 breaks lines every 76 characters
        return f"translate(encode({expr}, 'base64'), E'\\n', '')"
    if col.type == "UUID" or col.type.startswith("DECIMAL(") or (hugeint_as_text and col.type == "HUGEINT"):
        return f"{expr}::text"
    return expr


def document_object(columns: Sequence[Column], alias: str, function: str = "jsonb_build_object",
                    hugeint_as_text: bool = False) -> str:
    """{column: value} over the columns, in pieces of 50 pairs (a function takes at most 100 arguments)."""
    pieces = []
    for start in range(0, len(columns), 50):
        pairs = ", ".join(f"{literal(c.name)}, {document_expr(c, f'{alias}.{c.sql}', hugeint_as_text)}"
                          for c in columns[start:start + 50])
        pieces.append(f"{function}({pairs})")
    if function == "json_build_object" and len(pieces) > 1:  # json has no ||: merge as jsonb (rare: > 50 columns)
        pieces = [f"{p}::jsonb" for p in pieces]
    return " || ".join(pieces) if pieces else "'{}'::jsonb"


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def read_csv(data: bytes, reads: Sequence[tuple[str, Read]]) -> pa.Table:
    """Parse a COPY TO CSV result: an unquoted empty field is NULL, a quoted one an empty string."""
    names = [name for name, _ in reads]
    schema = pa.schema([(name, read.parse_type) for name, read in reads])
    if not data:
        table = schema.empty_table()
    else:
        table = pa_csv.read_csv(
            pa.py_buffer(data), read_options=pa_csv.ReadOptions(column_names=names, block_size=4 << 20),
            parse_options=pa_csv.ParseOptions(newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(column_types=schema, strings_can_be_null=True,
                                                  quoted_strings_can_be_null=False, null_values=[""],
                                                  true_values=["t"], false_values=["f"]))
    columns = [table[name] if read.finish is None else read.finish(table[name]) for name, read in reads]
    return pa.table(columns, names=names)
