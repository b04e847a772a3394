"""Hashing, signatures and encodings for webhook CHECKs, with PostgreSQL's (and pgcrypto's) names and results:
hmac, digest, constant_time_eq, md5, sha224/256/384/512, octet_length, encode/decode (hex, base64, escape),
convert_to/convert_from, string_to_array; and headrace's constant_time_eq_any (a header with several signatures).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac as hmac_module
import re

from sqlglot import exp

from headrace.errors import DataError
from headrace.sql import expr_types as xt
from headrace.sql.expr import Columns, Compiled, _compiles
from headrace.sql.expr_calls import ANONYMOUS_FUNCTIONS, T, call_overloaded, compile_arguments

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


def _constant_time_eq_any(candidates: list[str | None], expected: str) -> bool:
    """Every element is compared in constant time and none is skipped after a match, so the time
    depends on the number and lengths of the candidates only, never on which one matched or where
    they differ. NULL elements match nothing."""
    wanted = _utf8(expected)
    matched = False
    for candidate in candidates:
        if candidate is not None:
            matched |= hmac_module.compare_digest(_utf8(candidate), wanted)
    return matched


def _string_to_array(text: str, delimiter: str) -> list[str | None]:
    """As PostgreSQL: '' is an empty array; an empty delimiter gives the whole string as one element."""
    if text == "":
        return []
    if delimiter == "":
        return [text]
    return list(text.split(delimiter))


ANONYMOUS_FUNCTIONS.update({
    # pgcrypto's hmac(data, key, type) and digest(data, type)
    "hmac": [((T.TEXT, T.TEXT, T.TEXT), T.BYTEA, _hmac_text), ((T.BYTEA, T.BYTEA, T.TEXT), T.BYTEA, _hmac_bytes)],
    "digest": [((T.TEXT, T.TEXT), T.BYTEA, _digest_text), ((T.BYTEA, T.TEXT), T.BYTEA, _digest_bytes)],
    # Materialize's constant_time_eq: comparison time does not depend on where the inputs differ
    "constant_time_eq": [((T.TEXT, T.TEXT), T.BOOLEAN, lambda a, b: hmac_module.compare_digest(_utf8(a), _utf8(b))),
                         ((T.BYTEA, T.BYTEA), T.BOOLEAN, hmac_module.compare_digest)],
    # headrace's constant_time_eq_any(candidates, expected): does any element equal `expected`?
    # For headers that carry several signatures (key rotation): see _constant_time_eq_any.
    "constant_time_eq_any": [((T.TEXT_ARRAY, T.TEXT), T.BOOLEAN, lambda a, b: _constant_time_eq_any(a, b))],
    "sha224": [((T.BYTEA,), T.BYTEA, lambda v: hashlib.sha224(v).digest())],
    "octet_length": [((T.TEXT,), T.INTEGER, lambda v: len(_utf8(v))), ((T.BYTEA,), T.INTEGER, len)],
})


@_compiles(exp.StringToArray)
def _string_to_array_node(node: exp.StringToArray, columns: Columns) -> Compiled:
    """PostgreSQL's string_to_array(text, delimiter): to split a header into its signatures."""
    arguments = compile_arguments([node.this, node.expression], columns)
    return call_overloaded("string_to_array", arguments, [((T.TEXT, T.TEXT), T.TEXT_ARRAY, _string_to_array)])


@_compiles(exp.MD5)
def _md5(node: exp.MD5, columns: Columns) -> Compiled:
    return call_overloaded("md5", compile_arguments([node.this], columns),
                 [((T.TEXT,), T.TEXT, lambda v: hashlib.md5(_utf8(v)).hexdigest()),
                  ((T.BYTEA,), T.TEXT, lambda v: hashlib.md5(v).hexdigest())])


@_compiles(exp.SHA2Digest)
def _sha2(node: exp.Expression, columns: Columns) -> Compiled:
    bits = int(node.args["length"].this) if node.args.get("length") is not None else 256
    algorithm = f"sha{bits}"
    return call_overloaded(algorithm, compile_arguments([node.this], columns),
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


ANONYMOUS_FUNCTIONS["convert_to"] = [((T.TEXT, T.TEXT), T.BYTEA, _convert_to)]
ANONYMOUS_FUNCTIONS["convert_from"] = [((T.BYTEA, T.TEXT), T.TEXT, _convert_from)]


@_compiles(exp.Encode)
def _encode_node(node: exp.Encode, columns: Columns) -> Compiled:
    return call_overloaded("encode", compile_arguments([node.this, node.args["charset"]], columns),
                 [((T.BYTEA, T.TEXT), T.TEXT, _encode)])


@_compiles(exp.Decode)
def _decode_node(node: exp.Decode, columns: Columns) -> Compiled:
    return call_overloaded("decode", compile_arguments([node.this, node.args["charset"]], columns),
                 [((T.TEXT, T.TEXT), T.BYTEA, _decode)])

