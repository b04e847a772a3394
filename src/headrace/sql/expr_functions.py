"""The functions and operators webhook CHECKs need, with PostgreSQL's names, types and results:
hmac, digest, constant_time_eq, decode/encode, convert_to/convert_from, split_part, to_timestamp,
now(), timestamp and interval arithmetic, extract, regexp_match, ~, position, substring, length,
left/right, replace, starts_with, md5/sha*, CASE, BETWEEN, IN, subscripts ([]).

Each compiler registers itself in expr.py's table. Overloaded functions are resolved the way
PostgreSQL does for these cases: an argument of a parameter's exact type matches, an untyped
literal adopts it, and the first matching signature (text before bytea) wins.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac as hmac_module
import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal, DivisionByZero, InvalidOperation, localcontext
from typing import Any

from sqlglot import exp

from headrace.errors import DataError, FeatureNotSupported, HeadraceError
from headrace.sql import expr_types as xt
from headrace.sql.expr import (
    NOW,
    Columns,
    Compiled,
    Row,
    _cast,
    _compile,
    _compiles,
    _constant,
    _fold,
    common_type,
    map_lookup,
)
from headrace.sql.expr_values import INTEGER_TYPES, NUMBER_TYPES, SqlType, fits, step

T = SqlType
Implementation = Callable[..., Any]
Signature = tuple[tuple[SqlType, ...], SqlType, Implementation]


def _no_function(name: str, arguments: Sequence[Compiled]) -> HeadraceError:
    shown = ", ".join(a.sql_type.value for a in arguments)
    return HeadraceError(f"function {name}({shown}) does not exist", sqlstate="42883", http_status=400,
                         hint="no function matches the given name and argument types; add explicit casts")


def _accepts(parameter: SqlType, argument: SqlType) -> bool:
    if argument is parameter or argument is SqlType.UNKNOWN:
        return True
    if parameter is SqlType.DOUBLE:
        return argument in NUMBER_TYPES  # integers and numeric widen implicitly
    if parameter in (SqlType.INTEGER, SqlType.BIGINT):
        return argument in (SqlType.SMALLINT, SqlType.INTEGER) or (parameter is SqlType.BIGINT and argument is SqlType.BIGINT)
    return False


def _call(name: str, arguments: Sequence[Compiled], signatures: Sequence[Signature]) -> Compiled:
    """Resolve an overloaded, strict function (NULL in, NULL out) and build its closure."""
    for parameters, result, implementation in signatures:
        if len(parameters) == len(arguments) and all(map(_accepts, parameters, arguments_types(arguments))):
            getters = [_cast(a, p).evaluate for a, p in zip(arguments, parameters, strict=True)]
            constant = all(a.constant for a in arguments)
            return _fold(Compiled(_strict(implementation, getters), result, constant))
    raise _no_function(name, arguments)


def arguments_types(arguments: Sequence[Compiled]) -> list[SqlType]:
    return [a.sql_type for a in arguments]


def _strict(implementation: Implementation, getters: list[Callable[[Row], Any]]) -> Callable[[Row], Any]:
    if len(getters) == 1:
        (get,) = getters
        return lambda row: None if (v := get(row)) is None else implementation(v)
    if len(getters) == 2:
        get_a, get_b = getters

        def call2(row: Row) -> Any:
            a = get_a(row)
            if a is None:
                return None
            b = get_b(row)
            return None if b is None else implementation(a, b)

        return call2

    def call(row: Row) -> Any:
        values = []
        for get in getters:
            value = get(row)
            if value is None:
                return None
            values.append(value)
        return implementation(*values)

    return call


def _arguments(nodes: Sequence[exp.Expression | None], columns: Columns) -> list[Compiled]:
    return [_compile(node, columns) for node in nodes if node is not None]


# -- hashing and signatures -----------------------------------------------------------------------

_DIGESTS = {"md5": "md5", "sha1": "sha1", "sha224": "sha224", "sha256": "sha256", "sha384": "sha384",
            "sha512": "sha512"}


def _digest_name(name: str) -> str:
    found = _DIGESTS.get(name.lower())
    if found is None:
        raise DataError(f'Cannot use "{name}": No such hash algorithm', sqlstate="39000")
    return found


def _utf8(text: str) -> bytes:
    return text.encode("utf-8")


def _hmac_text(data: str, key: str, kind: str) -> bytes:
    return hmac_module.new(_utf8(key), _utf8(data), _digest_name(kind)).digest()


def _hmac_bytes(data: bytes, key: bytes, kind: str) -> bytes:
    return hmac_module.new(key, data, _digest_name(kind)).digest()


def _digest_text(data: str, kind: str) -> bytes:
    return hashlib.new(_digest_name(kind), _utf8(data)).digest()


def _digest_bytes(data: bytes, kind: str) -> bytes:
    return hashlib.new(_digest_name(kind), data).digest()


_ANONYMOUS: dict[str, list[Signature]] = {
    # pgcrypto's hmac(data, key, type) and digest(data, type)
    "hmac": [((T.TEXT, T.TEXT, T.TEXT), T.BYTEA, _hmac_text), ((T.BYTEA, T.BYTEA, T.TEXT), T.BYTEA, _hmac_bytes)],
    "digest": [((T.TEXT, T.TEXT), T.BYTEA, _digest_text), ((T.BYTEA, T.TEXT), T.BYTEA, _digest_bytes)],
    # Materialize's constant_time_eq: comparison time does not depend on where the inputs differ
    "constant_time_eq": [((T.TEXT, T.TEXT), T.BOOLEAN, lambda a, b: hmac_module.compare_digest(_utf8(a), _utf8(b))),
                         ((T.BYTEA, T.BYTEA), T.BOOLEAN, hmac_module.compare_digest)],
    "sha224": [((T.BYTEA,), T.BYTEA, lambda v: hashlib.sha224(v).digest())],
    "octet_length": [((T.TEXT,), T.INTEGER, lambda v: len(_utf8(v))), ((T.BYTEA,), T.INTEGER, len)],
}


@_compiles(exp.MD5)
def _md5(node: exp.MD5, columns: Columns) -> Compiled:
    return _call("md5", _arguments([node.this], columns),
                 [((T.TEXT,), T.TEXT, lambda v: hashlib.md5(_utf8(v)).hexdigest()),
                  ((T.BYTEA,), T.TEXT, lambda v: hashlib.md5(v).hexdigest())])


@_compiles(exp.SHA2Digest)
def _sha2(node: exp.Expression, columns: Columns) -> Compiled:
    bits = int(node.args["length"].this) if node.args.get("length") is not None else 256
    algorithm = f"sha{bits}"
    return _call(algorithm, _arguments([node.this], columns),
                 [((T.BYTEA,), T.BYTEA, lambda v: hashlib.new(algorithm, v).digest())])


# -- encodings ------------------------------------------------------------------------------------

def _encode(value: bytes, fmt: str) -> str:
    kind = fmt.lower()
    if kind == "hex":
        return value.hex()
    if kind == "base64":
        text = base64.b64encode(value).decode("ascii")
        return "\n".join(text[i : i + 76] for i in range(0, len(text), 76))  # PostgreSQL wraps at 76
    if kind == "escape":
        return xt.encode_escape(value)
    raise DataError(f'unrecognized encoding: "{fmt}"', sqlstate="22023")


def _decode(text: str, fmt: str) -> bytes:
    kind = fmt.lower()
    if kind == "hex":
        return xt.parse_bytea("\\x" + text)
    if kind == "base64":
        compact = "".join(text.split())
        if not re.fullmatch(r"[A-Za-z0-9+/]*={0,2}", compact) or "=" in compact.rstrip("="):
            raise DataError("invalid symbol found while decoding base64 sequence", sqlstate="22023")
        if len(compact) % 4:
            raise DataError("invalid base64 end sequence", sqlstate="22023",
                            hint="Input data is missing padding, is truncated, or is otherwise corrupted.")
        try:
            return base64.b64decode(compact, validate=True)
        except binascii.Error:
            raise DataError("invalid base64 end sequence", sqlstate="22023") from None
    if kind == "escape":
        return xt.decode_escape(text)
    raise DataError(f'unrecognized encoding: "{fmt}"', sqlstate="22023")


_CODECS = {"utf8": "utf-8", "unicode": "utf-8", "latin1": "latin-1", "iso88591": "latin-1", "sqlascii": "ascii",
           "win1252": "cp1252", "latin9": "iso8859-15"}


def _codec(name: str, direction: str) -> str:
    codec = _CODECS.get(re.sub(r"[^a-z0-9]", "", name.lower()))
    if codec is None:
        raise DataError(f'invalid {direction} encoding name "{name}"', sqlstate="22023")
    return codec


def _convert_to(text: str, encoding: str) -> bytes:
    codec = _codec(encoding, "destination")
    try:
        return text.encode(codec)
    except UnicodeEncodeError as error:
        raise DataError(f'character with byte sequence {text[error.start].encode("utf-8").hex()} in encoding "UTF8" '
                        f'has no equivalent in encoding "{encoding.upper()}"', sqlstate="22P05") from None


def _convert_from(data: bytes, encoding: str) -> str:
    codec = _codec(encoding, "source")
    try:
        text = data.decode(codec)
    except UnicodeDecodeError as error:
        raise DataError(f'invalid byte sequence for encoding "UTF8": 0x{data[error.start]:02x}',
                        sqlstate="22021") from None
    if "\x00" in text:
        raise DataError('invalid byte sequence for encoding "UTF8": 0x00', sqlstate="22021")
    return text


_ANONYMOUS["convert_to"] = [((T.TEXT, T.TEXT), T.BYTEA, _convert_to)]
_ANONYMOUS["convert_from"] = [((T.BYTEA, T.TEXT), T.TEXT, _convert_from)]


@_compiles(exp.Encode)
def _encode_node(node: exp.Encode, columns: Columns) -> Compiled:
    return _call("encode", _arguments([node.this, node.args["charset"]], columns),
                 [((T.BYTEA, T.TEXT), T.TEXT, _encode)])


@_compiles(exp.Decode)
def _decode_node(node: exp.Decode, columns: Columns) -> Compiled:
    return _call("decode", _arguments([node.this, node.args["charset"]], columns),
                 [((T.TEXT, T.TEXT), T.BYTEA, _decode)])


# -- text -------------------------------------------------------------------------------------------

def _split_part(text: str, delimiter: str, field: int) -> str:
    if field == 0:
        raise DataError("field position must not be zero", sqlstate="22023")
    if delimiter == "":
        return text if field in (1, -1) else ""
    parts = text.split(delimiter)
    index = field - 1 if field > 0 else len(parts) + field
    return parts[index] if 0 <= index < len(parts) else ""


@_compiles(exp.SplitPart)
def _split_part_node(node: exp.SplitPart, columns: Columns) -> Compiled:
    arguments = _arguments([node.this, node.args.get("delimiter"), node.args.get("part_index")], columns)
    return _call("split_part", arguments, [((T.TEXT, T.TEXT, T.INTEGER), T.TEXT, _split_part)])


@_compiles(exp.StrPosition)
def _position(node: exp.StrPosition, columns: Columns) -> Compiled:
    arguments = _arguments([node.args["substr"], node.this], columns)
    return _call("position", arguments, [((T.TEXT, T.TEXT), T.INTEGER, lambda sub, text: text.find(sub) + 1),
                                         ((T.BYTEA, T.BYTEA), T.INTEGER, lambda sub, data: data.find(sub) + 1)])


def _substring_positional(value: Any, start: int, length: int | None = None) -> Any:
    """PostgreSQL's substring: positions before 1 still count towards the length."""
    if length is not None and length < 0:
        raise DataError("negative substring length not allowed", sqlstate="22011")
    begin = max(start, 1) - 1
    end = len(value) if length is None else max(start + length - 1, 0)
    return value[begin:end] if end > begin else value[:0]


def _posix_regex(pattern: str, flags: int = 0) -> re.Pattern[str]:
    try:
        return re.compile(pattern, flags)
    except re.error as error:
        raise DataError(f"invalid regular expression: {error}", sqlstate="2201B") from None


def _substring_regex(text: str, pattern: str) -> str | None:
    found = _posix_regex(pattern).search(text)
    if found is None:
        return None
    return found.group(1) if found.re.groups else found.group(0)


@_compiles(exp.Substring)
def _substring(node: exp.Substring, columns: Columns) -> Compiled:
    arguments = _arguments([node.this, node.args.get("start"), node.args.get("length")], columns)
    if len(arguments) == 2 and arguments[1].sql_type in (T.TEXT, T.UNKNOWN) and arguments[0].sql_type is not T.BYTEA:
        return _call("substring", arguments, [((T.TEXT, T.TEXT), T.TEXT, _substring_regex)])
    return _call("substring", arguments, [
        ((T.TEXT, T.INTEGER), T.TEXT, _substring_positional),
        ((T.TEXT, T.INTEGER, T.INTEGER), T.TEXT, _substring_positional),
        ((T.BYTEA, T.INTEGER), T.BYTEA, _substring_positional),
        ((T.BYTEA, T.INTEGER, T.INTEGER), T.BYTEA, _substring_positional),
    ])


def _regexp_match(text: str, pattern: str, flags: str = "") -> list[str | None] | None:
    if "g" in flags:
        raise DataError('regexp_match() does not support the "global" option', sqlstate="22023",
                        hint="Use the regexp_matches function instead.")
    unknown = set(flags) - {"i", "c", "n", "s", "x"}
    if unknown:
        raise DataError(f'invalid regular expression option: "{sorted(unknown)[0]}"', sqlstate="22023")
    case = re.IGNORECASE if "i" in flags.replace("c", "") else 0
    found = _posix_regex(pattern, case).search(text)
    if found is None:
        return None
    return list(found.groups()) if found.re.groups else [found.group(0)]


_ANONYMOUS["regexp_match"] = [((T.TEXT, T.TEXT), T.TEXT_ARRAY, _regexp_match),
                              ((T.TEXT, T.TEXT, T.TEXT), T.TEXT_ARRAY, _regexp_match)]


@_compiles(exp.RegexpLike, exp.RegexpILike)
def _regexp_like(node: exp.Expression, columns: Columns) -> Compiled:
    flags = re.IGNORECASE if isinstance(node, exp.RegexpILike) else 0
    return _call("~", _arguments([node.this, node.expression], columns),
                 [((T.TEXT, T.TEXT), T.BOOLEAN, lambda text, pattern: _posix_regex(pattern, flags).search(text) is not None)])


@_compiles(exp.Length)
def _length(node: exp.Length, columns: Columns) -> Compiled:
    return _call("length", _arguments([node.this], columns), [((T.TEXT,), T.INTEGER, len), ((T.BYTEA,), T.INTEGER, len)])


def _left(text: str, count: int) -> str:
    return text[:count] if count >= 0 else text[: max(len(text) + count, 0)]


def _right(text: str, count: int) -> str:
    return (text[-count:] if count else "") if count >= 0 else text[min(-count, len(text)):]


@_compiles(exp.Left, exp.Right)
def _left_right(node: exp.Expression, columns: Columns) -> Compiled:
    name, implementation = ("left", _left) if isinstance(node, exp.Left) else ("right", _right)
    return _call(name, _arguments([node.this, node.expression], columns), [((T.TEXT, T.INTEGER), T.TEXT, implementation)])


@_compiles(exp.Replace)
def _replace(node: exp.Replace, columns: Columns) -> Compiled:
    arguments = _arguments([node.this, node.expression, node.args.get("replacement")], columns)
    return _call("replace", arguments, [((T.TEXT, T.TEXT, T.TEXT), T.TEXT,
                                         lambda text, old, new: text.replace(old, new) if old else text)])


@_compiles(exp.StartsWith)
def _starts_with(node: exp.StartsWith, columns: Columns) -> Compiled:
    return _call("starts_with", _arguments([node.this, node.expression], columns),
                 [((T.TEXT, T.TEXT), T.BOOLEAN, str.startswith)])


@_compiles(exp.Anonymous)
def _anonymous(node: exp.Anonymous, columns: Columns) -> Compiled:
    name = node.name.lower()
    signatures = _ANONYMOUS.get(name)
    if signatures is None:
        raise FeatureNotSupported(f"function {name}() is not supported in this expression")
    return _call(name, _arguments(node.expressions, columns), signatures)


# -- time ---------------------------------------------------------------------------------------------

@_compiles(exp.CurrentTimestamp)
def _now(node: exp.Expression, columns: Columns) -> Compiled:
    """now(): the request's arrival time (the row's NOW entry), the same for the whole request."""
    def now(row: Row) -> int:
        arrival = row.get(NOW)
        return time.time_ns() // 1000 if arrival is None else int(arrival)
    return Compiled(now, T.TIMESTAMPTZ)


@_compiles(exp.Interval)
def _interval(node: exp.Interval, columns: Columns) -> Compiled:
    text = node.this.name if node.this is not None else ""
    unit = node.args.get("unit")
    if unit is not None:
        text = f"{text} {unit.name}"
    return _constant(xt.parse_interval(text), T.INTERVAL)


@_compiles(exp.UnixToTime)
def _to_timestamp(node: exp.UnixToTime, columns: Columns) -> Compiled:
    if any(node.args.get(k) is not None for k in ("scale", "zone", "hours", "minutes", "format")):
        raise FeatureNotSupported("to_timestamp with these arguments")
    return _call("to_timestamp", _arguments([node.this], columns), [((T.DOUBLE,), T.TIMESTAMPTZ, xt.seconds_to_timestamp)])


@_compiles(exp.StrToTime)
def _to_timestamp_format(node: exp.Expression, columns: Columns) -> Compiled:
    raise FeatureNotSupported("to_timestamp(text, format); cast the text instead: '2024-01-01T00:00:00Z'::timestamptz")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROS = Decimal(1_000_000)


def _timestamp_field(field: str) -> Callable[[int], Decimal]:
    def moment(micros: int) -> datetime:
        return _EPOCH + timedelta(microseconds=micros)
    fields: dict[str, Callable[[int], Decimal]] = {
        "epoch": lambda us: (Decimal(us) / _MICROS).quantize(Decimal("0.000001")),
        "year": lambda us: Decimal(moment(us).year),
        "quarter": lambda us: Decimal((moment(us).month - 1) // 3 + 1),
        "month": lambda us: Decimal(moment(us).month),
        "day": lambda us: Decimal(moment(us).day),
        "hour": lambda us: Decimal(moment(us).hour),
        "minute": lambda us: Decimal(moment(us).minute),
        "second": lambda us: (Decimal(moment(us).second * 1_000_000 + moment(us).microsecond) / _MICROS).quantize(Decimal("0.000001")),
        "milliseconds": lambda us: (Decimal(moment(us).second * 1_000_000 + moment(us).microsecond) / 1000).quantize(Decimal("0.001")),
        "microseconds": lambda us: Decimal(moment(us).second * 1_000_000 + moment(us).microsecond),
        "dow": lambda us: Decimal(moment(us).isoweekday() % 7),
        "isodow": lambda us: Decimal(moment(us).isoweekday()),
        "doy": lambda us: Decimal(moment(us).timetuple().tm_yday),
    }
    aliases = {"millisecond": "milliseconds", "microsecond": "microseconds", "seconds": "second",
               "minutes": "minute", "hours": "hour", "days": "day", "months": "month", "years": "year"}
    found = fields.get(aliases.get(field, field))
    if found is None:
        raise FeatureNotSupported(f'unit "{field}" of extract for timestamp with time zone')
    return found


def _interval_field(field: str) -> Callable[[int], Decimal]:
    day = 86_400_000_000
    fields: dict[str, Callable[[int], Decimal]] = {
        "epoch": lambda us: (Decimal(us) / _MICROS).quantize(Decimal("0.000001")),
        "day": lambda us: Decimal(int(us / day)),
        "hour": lambda us: Decimal(int((us - int(us / day) * day) / 3_600_000_000)),
        "minute": lambda us: Decimal(int((us % (3_600_000_000 if us >= 0 else -3_600_000_000)) / 60_000_000)),
        "second": lambda us: (Decimal(us % (60_000_000 if us >= 0 else -60_000_000)) / _MICROS).quantize(Decimal("0.000001")),
    }
    found = fields.get(field)
    if found is None:
        raise FeatureNotSupported(f'unit "{field}" of extract for interval')
    return found


@_compiles(exp.Extract)
def _extract(node: exp.Extract, columns: Columns) -> Compiled:
    field = node.this.name.lower()
    source = _compile(node.expression, columns)
    if source.sql_type is T.UNKNOWN:
        source = _cast(source, T.TIMESTAMPTZ)
    if source.sql_type is T.TIMESTAMPTZ:
        get_field = _timestamp_field(field)
    elif source.sql_type is T.INTERVAL:
        get_field = _interval_field(field)
    else:
        raise FeatureNotSupported(f"extract from {source.sql_type.value}")
    get = source.evaluate
    return _fold(Compiled(lambda row: None if (v := get(row)) is None else get_field(v), T.NUMERIC, source.constant))


# -- arithmetic ---------------------------------------------------------------------------------------

def _integer_result(value: int, sql_type: SqlType) -> int:
    if not fits(value, sql_type.value):
        raise DataError(f"{sql_type.value} out of range", sqlstate="22003")
    return value


def _divide(a: Any, b: Any, integral: bool) -> Any:
    if b == 0:
        raise DataError("division by zero", sqlstate="22012")
    if integral:
        quotient = abs(a) // abs(b)
        return quotient if (a >= 0) == (b >= 0) else -quotient
    if isinstance(a, Decimal) and isinstance(b, Decimal) and a.is_finite() and b.is_finite() and a:
        return _numeric_divide(a, b)
    try:
        return a / b
    except (DivisionByZero, InvalidOperation):
        raise DataError("division by zero", sqlstate="22012") from None


def _numeric_divide(a: Decimal, b: Decimal) -> Decimal:
    """numeric / numeric with PostgreSQL's result scale (select_div_scale): at least 16 significant
    digits, and no fewer decimals than either input."""
    def weight_and_first_digit(value: Decimal) -> tuple[int, int]:
        weight = value.adjusted() // 4  # in base-10000 digits, as numeric stores them
        return weight, int(abs(value).scaleb(-4 * weight))
    weight1, first1 = weight_and_first_digit(a)
    weight2, first2 = weight_and_first_digit(b)
    quotient_weight = weight1 - weight2 - (1 if first1 <= first2 else 0)
    scale = max(16 - quotient_weight * 4, -a.as_tuple().exponent, -b.as_tuple().exponent, 0)  # type: ignore[operator]
    scale = min(scale, 1000)
    with localcontext() as context:
        context.prec = max(scale + max(a.adjusted() - b.adjusted(), 0) + 10, 28)
        return (a / b).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)


def _modulo(a: Any, b: Any, integral: bool) -> Any:
    if b == 0:
        raise DataError("division by zero", sqlstate="22012")
    return a - b * _divide(a, b, True) if integral else a % b  # Decimal's % keeps the dividend's sign


_SYMBOLS = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%"}


def _number_operation(symbol: str, left: Compiled, right: Compiled) -> Compiled:
    result = common_type([left.sql_type, right.sql_type], symbol)
    integral = result in INTEGER_TYPES
    if integral:
        result = T.BIGINT if T.BIGINT in (left.sql_type, right.sql_type) else T.INTEGER
    convert: Callable[[Any], Any] = float if result is T.DOUBLE else (Decimal if result is T.NUMERIC else int)
    operations: dict[str, Callable[[Any, Any], Any]] = {
        "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
        "/": lambda a, b: _divide(a, b, integral), "%": lambda a, b: _modulo(a, b, integral),
    }
    operation = operations[symbol]
    if integral:
        implementation = lambda a, b: _integer_result(operation(a, b), result)  # noqa: E731
    else:
        implementation = lambda a, b: operation(convert(a), convert(b))  # noqa: E731
    return _fold(Compiled(_strict(implementation, [left.evaluate, right.evaluate]), result,
                          left.constant and right.constant))


def _timestamp_operation(symbol: str, left: Compiled, right: Compiled) -> Compiled:
    types = (left.sql_type, right.sql_type)
    time_types = {T.TIMESTAMPTZ, T.INTERVAL}
    if T.UNKNOWN in types and (set(types) - {T.UNKNOWN}) <= time_types:
        known = next(t for t in types if t is not T.UNKNOWN)
        # `ts + '5 minutes'` and `ts - '5 minutes'` read the literal as an interval
        adopt = T.INTERVAL if known is T.TIMESTAMPTZ and symbol in "+-" else known
        left, right = (_cast(left, adopt), right) if left.sql_type is T.UNKNOWN else (left, _cast(right, adopt))
        types = (left.sql_type, right.sql_type)
    ts, iv = T.TIMESTAMPTZ, T.INTERVAL
    table: dict[tuple[str, SqlType, SqlType], tuple[SqlType, Callable[[Any, Any], Any]]] = {
        ("+", ts, iv): (ts, lambda a, b: xt.check_timestamp(a + b)),
        ("+", iv, ts): (ts, lambda a, b: xt.check_timestamp(a + b)),
        ("-", ts, iv): (ts, lambda a, b: xt.check_timestamp(a - b)),
        ("-", ts, ts): (iv, lambda a, b: a - b),
        ("+", iv, iv): (iv, lambda a, b: a + b),
        ("-", iv, iv): (iv, lambda a, b: a - b),
    }
    for number in NUMBER_TYPES:
        table[("*", iv, number)] = (iv, lambda a, b: round(a * float(b)))
        table[("*", number, iv)] = (iv, lambda a, b: round(float(a) * b))
        table[("/", iv, number)] = (iv, lambda a, b: round(a / float(_nonzero(b))))
    found = table.get((symbol, *types))
    if found is None:
        raise HeadraceError(f"operator does not exist: {types[0].value} {symbol} {types[1].value}",
                            sqlstate="42883", http_status=400, hint="add an explicit cast")
    result, implementation = found
    return _fold(Compiled(_strict(implementation, [left.evaluate, right.evaluate]), result,
                          left.constant and right.constant))


def _nonzero(value: Any) -> Any:
    if value == 0:
        raise DataError("division by zero", sqlstate="22012")
    return value


@_compiles(*_SYMBOLS)
def _arithmetic(node: exp.Expression, columns: Columns) -> Compiled:
    symbol = _SYMBOLS[type(node)]
    left, right = _compile(node.this, columns), _compile(node.expression, columns)
    if {left.sql_type, right.sql_type} & {T.TIMESTAMPTZ, T.INTERVAL}:
        return _timestamp_operation(symbol, left, right)
    if left.sql_type is T.UNKNOWN:
        left = _cast(left, right.sql_type if right.sql_type in NUMBER_TYPES else T.NUMERIC)
    if right.sql_type is T.UNKNOWN:
        right = _cast(right, left.sql_type if left.sql_type in NUMBER_TYPES else T.NUMERIC)
    if left.sql_type not in NUMBER_TYPES or right.sql_type not in NUMBER_TYPES:
        raise HeadraceError(f"operator does not exist: {left.sql_type.value} {symbol} {right.sql_type.value}",
                            sqlstate="42883", http_status=400, hint="add an explicit cast")
    return _number_operation(symbol, left, right)


# -- conditionals and membership ----------------------------------------------------------------------

@_compiles(exp.Between)
def _between(node: exp.Between, columns: Columns) -> Compiled:
    subject = node.this
    rewritten = exp.And(this=exp.GTE(this=subject.copy(), expression=node.args["low"].copy()),
                        expression=exp.LTE(this=subject.copy(), expression=node.args["high"].copy()))
    return _compile(rewritten, columns)


@_compiles(exp.In)
def _in(node: exp.In, columns: Columns) -> Compiled:
    if node.args.get("query") is not None or not node.expressions:
        raise FeatureNotSupported("IN with a subquery")
    comparisons = [exp.EQ(this=node.this.copy(), expression=item.copy()) for item in node.expressions]
    combined: exp.Expression = comparisons[0]
    for comparison in comparisons[1:]:
        combined = exp.Or(this=combined, expression=comparison)
    return _compile(combined, columns)


@_compiles(exp.Case)
def _case(node: exp.Case, columns: Columns) -> Compiled:
    operand = node.this
    conditions: list[Compiled] = []
    for branch in node.args["ifs"]:
        condition = branch.this if operand is None else exp.EQ(this=operand.copy(), expression=branch.this.copy())
        compiled = _compile(condition, columns)
        if compiled.sql_type is T.UNKNOWN:
            compiled = _cast(compiled, T.BOOLEAN)
        if compiled.sql_type is not T.BOOLEAN:
            raise HeadraceError(f"argument of CASE/WHEN must be type boolean, not type {compiled.sql_type.value}",
                                sqlstate="42804", http_status=400)
        conditions.append(compiled)
    default = node.args.get("default")
    results = [_compile(branch.args["true"], columns) for branch in node.args["ifs"]]
    results.append(_compile(default, columns) if default is not None else _constant(None, T.UNKNOWN))
    known = [r.sql_type for r in results if r.sql_type is not T.UNKNOWN]
    target = common_type(known, "CASE") if known else T.TEXT
    getters = [_cast(r, target).evaluate for r in results]
    tests = [c.evaluate for c in conditions]
    pairs = list(zip(tests, getters[:-1], strict=True))
    otherwise = getters[-1]

    def case(row: Row) -> Any:
        for test, get in pairs:
            if test(row) is True:  # NULL is not true: falls through, as in PostgreSQL
                return get(row)
        return otherwise(row)

    constant = all(c.constant for c in conditions) and all(r.constant for r in results)
    return _fold(Compiled(case, target, constant))


@_compiles(exp.Bracket)
def _subscript(node: exp.Bracket, columns: Columns) -> Compiled:
    subject = _compile(node.this, columns)
    if len(node.expressions) != 1 or isinstance(node.expressions[0], exp.Slice):
        raise FeatureNotSupported("slices and multi-dimensional subscripts")
    index_node = node.expressions[0]
    if subject.sql_type is T.MAP:
        return map_lookup(subject, index_node, columns)
    index = _compile(index_node, columns)
    # sqlglot stores a literal integer subscript 0-based; PostgreSQL's are 1-based for arrays
    shift = 1 if isinstance(index_node, exp.Literal) and not index_node.is_string else 0
    get_subject, get_index = subject.evaluate, index.evaluate
    if subject.sql_type is T.TEXT_ARRAY:
        if index.sql_type not in INTEGER_TYPES:
            raise HeadraceError("array subscript must have type integer", sqlstate="42804", http_status=400)

        def element(row: Row) -> str | None:
            values, position = get_subject(row), get_index(row)
            if values is None or position is None:
                return None
            position += shift
            return values[position - 1] if 1 <= position <= len(values) else None

        return Compiled(element, T.TEXT)
    if subject.sql_type is T.JSONB:
        def member(row: Row) -> Any:
            value, key = get_subject(row), get_index(row)
            if value is None or key is None:
                return None
            return step(value, key + shift if isinstance(key, int) else key)  # jsonb subscripts are 0-based

        return Compiled(member, T.JSONB)
    raise FeatureNotSupported(f"subscripting type {subject.sql_type.value}")

