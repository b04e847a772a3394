"""Frontend (client -> server) messages and their incremental decoder.

Sans-I/O: `FrontendDecoder` takes bytes as they arrive and yields complete messages.
Reference: https://www.postgresql.org/docs/current/protocol-message-formats.html
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from headrace.errors import HeadraceError, ProtocolViolation

PROTOCOL_3_0 = 196608  # major 3 << 16 | minor 0
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
CANCEL_REQUEST_CODE = 80877102

# PostgreSQL's own limits (pqcomm.h): a startup packet, a "small" message (Sync, Execute, ...),
# and a large one (Query, Parse, Bind, CopyData). Bigger lengths mean garbage or abuse.
MAX_STARTUP_PACKET_LENGTH = 10_000
SMALL_MESSAGE_LIMIT = 10_000
LARGE_MESSAGE_LIMIT = (1 << 30) - 1
# Before authentication completes only a password / SASL response is expected: PostgreSQL reads it with
# PG_MAX_AUTH_TOKEN_LENGTH (auth.c), everything else with the small limit; a client that has not proven who it is
# cannot make the server buffer more than that.
MAX_AUTH_TOKEN_LENGTH = 65_535


class MessageTooLong(HeadraceError):
    """A message longer than the server's --max-message-bytes (within PostgreSQL's own 1 GB limit)."""

    sqlstate = "54000"  # program_limit_exceeded


# --- frontend messages -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StartupMessage:
    protocol_version: int  # 196608 for 3.0; any other version is still decoded so it can be refused
    parameters: dict[str, str]


@dataclass(frozen=True, slots=True)
class SSLRequest:
    pass


@dataclass(frozen=True, slots=True)
class GSSENCRequest:
    pass


@dataclass(frozen=True, slots=True)
class CancelRequest:
    process_id: int
    secret_key: int


@dataclass(frozen=True, slots=True)
class Query:
    sql: str


@dataclass(frozen=True, slots=True)
class Parse:
    statement: str
    sql: str
    param_types: tuple[int, ...]  # 0 = let the server infer


@dataclass(frozen=True, slots=True)
class Bind:
    portal: str
    statement: str
    param_formats: tuple[int, ...]  # empty = all text, one = for all, else one per parameter
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]  # same convention, per result column


@dataclass(frozen=True, slots=True)
class Describe:
    kind: Literal["S", "P"]
    name: str


@dataclass(frozen=True, slots=True)
class Execute:
    portal: str
    max_rows: int  # 0 = no limit


@dataclass(frozen=True, slots=True)
class Close:
    kind: Literal["S", "P"]
    name: str


@dataclass(frozen=True, slots=True)
class Sync:
    pass


@dataclass(frozen=True, slots=True)
class Flush:
    pass


@dataclass(frozen=True, slots=True)
class Terminate:
    pass


@dataclass(frozen=True, slots=True)
class CopyData:
    data: bytes


@dataclass(frozen=True, slots=True)
class CopyDone:
    pass


@dataclass(frozen=True, slots=True)
class CopyFail:
    message: str


@dataclass(frozen=True, slots=True)
class PasswordMessage:
    """'p': a password, SASLInitialResponse or SASLResponse; only the auth phase knows which."""

    payload: bytes


FrontendMessage = (StartupMessage | SSLRequest | GSSENCRequest | CancelRequest | Query | Parse | Bind
                   | Describe | Execute | Close | Sync | Flush | Terminate | CopyData | CopyDone
                   | CopyFail | PasswordMessage)


# --- decoding ----------------------------------------------------------------------------------

_INT16 = struct.Struct("!h")
_UINT16 = struct.Struct("!H")
_INT32 = struct.Struct("!i")
_UINT32 = struct.Struct("!I")
_TYPE_AND_LENGTH = struct.Struct("!ci")


class _Reader:
    """Reads the fields of one message body; any overrun is a malformed message."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, size: int) -> bytes:
        end = self._pos + size
        if size < 0 or end > len(self._data):
            raise ProtocolViolation("invalid message format")
        chunk = self._data[self._pos:end]
        self._pos = end
        return chunk

    def int16(self) -> int:
        return int(_INT16.unpack(self.take(2))[0])

    def int32(self) -> int:
        return int(_INT32.unpack(self.take(4))[0])

    def uint32(self) -> int:
        return int(_UINT32.unpack(self.take(4))[0])

    def byte(self) -> str:
        return chr(self.take(1)[0])

    def cstring(self) -> str:
        end = self._data.find(b"\0", self._pos)
        if end < 0:
            raise ProtocolViolation("invalid string in message")
        raw = self._data[self._pos:end]
        self._pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation("invalid byte sequence for encoding \"UTF8\"") from None

    def rest(self) -> bytes:
        return self.take(len(self._data) - self._pos)

    def end(self) -> None:
        if self._pos != len(self._data):
            raise ProtocolViolation("invalid message format")


def _decode_startup(body: bytes) -> FrontendMessage:
    reader = _Reader(body)
    code = reader.int32() & 0xFFFFFFFF
    if code == SSL_REQUEST_CODE:
        reader.end()
        return SSLRequest()
    if code == GSSENC_REQUEST_CODE:
        reader.end()
        return GSSENCRequest()
    if code == CANCEL_REQUEST_CODE:
        process_id, secret_key = reader.uint32(), reader.uint32()
        reader.end()
        return CancelRequest(process_id, secret_key)
    if code >> 16 != 3:
        return StartupMessage(code, {})  # another protocol's layout: decoded only to be refused
    parameters: dict[str, str] = {}
    while (name := reader.cstring()) != "":
        parameters[name] = reader.cstring()
    reader.end()
    return StartupMessage(code, parameters)


def _decode_describe_or_close(reader: _Reader, factory: type[Describe] | type[Close]) -> FrontendMessage:
    kind = reader.byte()
    if kind not in ("S", "P"):
        raise ProtocolViolation(f"invalid {factory.__name__.upper()} message subtype {ord(kind)}")
    name = reader.cstring()
    reader.end()
    return factory(kind, name)  # type: ignore[arg-type]


def _decode_parse(reader: _Reader) -> FrontendMessage:
    statement, sql = reader.cstring(), reader.cstring()
    param_types = tuple(reader.uint32() for _ in range(reader.int16()))
    reader.end()
    return Parse(statement, sql, param_types)


def _decode_bind(reader: _Reader) -> FrontendMessage:
    portal, statement = reader.cstring(), reader.cstring()
    param_formats = tuple(reader.int16() for _ in range(reader.int16()))
    params: list[bytes | None] = []
    for _ in range(reader.int16()):
        size = reader.int32()
        params.append(None if size == -1 else reader.take(size))
    result_formats = tuple(reader.int16() for _ in range(reader.int16()))
    reader.end()
    return Bind(portal, statement, param_formats, tuple(params), result_formats)


def _decode_execute(reader: _Reader) -> FrontendMessage:
    portal = reader.cstring()
    max_rows = reader.int32()
    reader.end()
    return Execute(portal, max_rows)


def _decode_string_message(factory: Callable[[str], FrontendMessage]) -> Callable[[_Reader], FrontendMessage]:
    def decode(reader: _Reader) -> FrontendMessage:
        text = reader.cstring()
        reader.end()
        return factory(text)
    return decode


def _decode_empty_message(message: FrontendMessage) -> Callable[[_Reader], FrontendMessage]:
    def decode(reader: _Reader) -> FrontendMessage:
        reader.end()
        return message
    return decode


# type byte -> (maximum length, decoder)
_TYPED_DECODERS: dict[bytes, tuple[int, Callable[[_Reader], FrontendMessage]]] = {
    b"Q": (LARGE_MESSAGE_LIMIT, _decode_string_message(Query)),
    b"P": (LARGE_MESSAGE_LIMIT, _decode_parse),
    b"B": (LARGE_MESSAGE_LIMIT, _decode_bind),
    b"D": (SMALL_MESSAGE_LIMIT, lambda reader: _decode_describe_or_close(reader, Describe)),
    b"E": (SMALL_MESSAGE_LIMIT, _decode_execute),
    b"C": (SMALL_MESSAGE_LIMIT, lambda reader: _decode_describe_or_close(reader, Close)),
    b"S": (SMALL_MESSAGE_LIMIT, _decode_empty_message(Sync())),
    b"H": (SMALL_MESSAGE_LIMIT, _decode_empty_message(Flush())),
    b"X": (SMALL_MESSAGE_LIMIT, _decode_empty_message(Terminate())),
    b"d": (LARGE_MESSAGE_LIMIT, lambda reader: CopyData(reader.rest())),
    b"c": (SMALL_MESSAGE_LIMIT, _decode_empty_message(CopyDone())),
    b"f": (SMALL_MESSAGE_LIMIT, _decode_string_message(CopyFail)),
    b"p": (LARGE_MESSAGE_LIMIT, lambda reader: PasswordMessage(reader.rest())),
}


# --- unchecked fast decoders for the per-query messages -------------------------------------------
# The checked decoders above build a _Reader per message; these read the body in place. On any
# malformed input they raise (ValueError, IndexError, struct.error) and the checked decoder runs
# instead, so error messages stay exactly PostgreSQL's.

_SYNC = Sync()
_FLUSH = Flush()
_EMPTY_TUPLE: tuple[int, ...] = ()
_NO_PARAMS: tuple[bytes | None, ...] = ()
_unpack_int16 = _INT16.unpack_from
_unpack_int32 = _INT32.unpack_from


def _fast_string(buffer: bytes | bytearray, start: int, end: int) -> tuple[str, int]:
    """The NUL-terminated UTF-8 string at `start` (before `end`) and the offset after it (ValueError if none /
    invalid)."""
    stop = buffer.index(0, start, end)
    return buffer[start:stop].decode("utf-8"), stop + 1


def _fast_int16_list(buffer: bytes | bytearray, position: int, end: int) -> tuple[tuple[int, ...], int]:
    count = _unpack_int16(buffer, position)[0]
    position += 2
    if count == 0:
        return _EMPTY_TUPLE, position
    if count < 0 or position + 2 * count > end:
        raise ValueError("bad count")
    return struct.unpack_from(f"!{count}h", buffer, position), position + 2 * count


# Parse and Bind bodies are read in place, from a message body or from the decoder's buffer (peek_bound_group).

def _parse_fields(buffer: bytes | bytearray, at: int, end: int) -> tuple[str, str, tuple[int, ...]]:
    """(statement, sql, parameter type OIDs) of the Parse body at buffer[at:end]."""
    statement, at = _fast_string(buffer, at, end)
    sql, at = _fast_string(buffer, at, end)
    count = _unpack_int16(buffer, at)[0]
    at += 2
    if count < 0 or at + 4 * count != end:
        raise ValueError("bad count")
    return statement, sql, struct.unpack_from(f"!{count}I", buffer, at) if count else _EMPTY_TUPLE


def _bind_fields(buffer: bytes | bytearray, at: int,
                 end: int) -> tuple[str, str, tuple[int, ...], tuple[bytes | None, ...], tuple[int, ...]]:
    """(portal, statement, parameter formats, parameters, result formats) of the Bind body at buffer[at:end]."""
    portal, at = _fast_string(buffer, at, end)
    statement, at = _fast_string(buffer, at, end)
    param_formats, at = _fast_int16_list(buffer, at, end)
    count = _unpack_int16(buffer, at)[0]
    at += 2
    if count < 0:
        raise ValueError("bad count")
    params: tuple[bytes | None, ...] = _NO_PARAMS
    if count:
        values: list[bytes | None] = []
        for _ in range(count):
            size = _unpack_int32(buffer, at)[0]
            at += 4
            if size == -1:
                values.append(None)
                continue
            if size < 0 or at + size > end:
                raise ValueError("bad size")
            values.append(bytes(buffer[at:at + size]))
            at += size
        params = tuple(values)
    result_formats, at = _fast_int16_list(buffer, at, end)
    if at != end:
        raise ValueError("trailing bytes")
    return portal, statement, param_formats, params, result_formats


def _fast_bind(body: bytes) -> FrontendMessage:
    return Bind(*_bind_fields(body, 0, len(body)))


def _fast_parse(body: bytes) -> FrontendMessage:
    return Parse(*_parse_fields(body, 0, len(body)))


def _fast_execute(body: bytes) -> FrontendMessage:
    portal, position = _fast_string(body, 0, len(body))
    if position + 4 != len(body):
        raise ValueError("bad length")
    return Execute(portal, _unpack_int32(body, position)[0])


def _fast_describe(body: bytes) -> FrontendMessage:
    kind = body[:1]
    name, position = _fast_string(body, 1, len(body))
    if position != len(body) or kind not in (b"S", b"P"):
        raise ValueError("bad describe")
    return Describe("S" if kind == b"S" else "P", name)


def _fast_query(body: bytes) -> FrontendMessage:
    sql, position = _fast_string(body, 0, len(body))
    if position != len(body):
        raise ValueError("trailing bytes")
    return Query(sql)


def _fast_empty(message: FrontendMessage) -> Callable[[bytes], FrontendMessage]:
    def decode(body: bytes) -> FrontendMessage:
        if body:
            raise ValueError("not empty")
        return message
    return decode


_FAST_DECODERS: dict[bytes, Callable[[bytes], FrontendMessage]] = {
    b"B": _fast_bind, b"P": _fast_parse, b"E": _fast_execute, b"D": _fast_describe, b"Q": _fast_query,
    b"S": _fast_empty(_SYNC), b"H": _fast_empty(_FLUSH),
}


@dataclass(slots=True)
class BoundGroup:
    """One query in the extended protocol as drivers send it in one packet: [Parse] Bind [Describe portal]
    Execute Sync, for the unnamed portal (pgbench -M prepared / extended, libpq, psycopg, asyncpg)."""

    statement: str
    parse_sql: str | None  # None: no Parse in the group
    parse_param_types: tuple[int, ...]
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]
    describe: bool
    max_rows: int
    size: int  # bytes the whole group occupies in the buffer


def peek_bound_group(buffer: bytes | bytearray, start: int = 0) -> BoundGroup | None:
    """The BoundGroup at `start` if the buffer holds exactly that shape, complete and well formed; None
    otherwise (incomplete, another shape, or malformed: the message-by-message path then handles it and
    reports any error). Reads the buffer in place: this runs once per query."""
    end = len(buffer)
    unpack_type = _TYPE_AND_LENGTH.unpack_from
    position = start
    try:
        type_byte, length = unpack_type(buffer, position)
        parse_sql: str | None = None
        parse_types: tuple[int, ...] = _EMPTY_TUPLE
        if type_byte == b"P":
            body_end = position + 1 + length
            if body_end > end:
                return None
            parsed_statement, parse_sql, parse_types = _parse_fields(buffer, position + 5, body_end)
            position = body_end
            type_byte, length = unpack_type(buffer, position)
        if type_byte != b"B":
            return None
        body_end = position + 1 + length
        if body_end > end:
            return None
        portal, statement, param_formats, params, result_formats = _bind_fields(buffer, position + 5, body_end)
        if portal or (parse_sql is not None and statement != parsed_statement):
            return None  # a named portal, or another statement than the one parsed: the general path
        if min(param_formats + result_formats, default=0) < 0:
            return None
        position = body_end
        describe = False
        if buffer[position:position + 7] == b"D\0\0\0\x06P\0":  # Describe of the unnamed portal
            describe = True
            position += 7
        if buffer[position:position + 6] != b"E\0\0\0\x09\0":  # Execute of the unnamed portal
            return None
        max_rows = _unpack_int32(buffer, position + 6)[0]
        position += 10
        if buffer[position:position + 5] != b"S\0\0\0\x04":
            return None
        return BoundGroup(statement, parse_sql, parse_types, param_formats, params, result_formats, describe,
                          max_rows, position + 5 - start)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError):
        return None


def peek_query(data: bytes) -> Query | None:
    """The Query that `data` is exactly (one whole message), else None."""
    if len(data) < 6 or data[0] != 0x51 or _unpack_int32(data, 1)[0] != len(data) - 1:
        return None
    try:
        return _fast_query(data[5:])  # type: ignore[return-value]
    except (ValueError, UnicodeDecodeError):
        return None


class FrontendDecoder:
    """Incremental decoder of what a client sends.

    The first packets of a connection are untyped (length + code); after a StartupMessage every
    message is typed (type byte + length). SSLRequest/GSSENCRequest keep the decoder in the
    startup phase, since the client sends its real StartupMessage next. Malformed input raises
    ProtocolViolation at the offending message; messages before it were already returned.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._offset = 0  # start of the first unconsumed byte; consumed bytes are dropped lazily
        self._startup_phase = True
        # Until `authenticated`: every typed message is capped at the pre-authentication limits.
        self._max_message_bytes: int | None = None

    def authenticated(self, max_message_bytes: int) -> None:
        """Authentication completed: from now on messages may be as long as PostgreSQL allows each type, but no
        longer than `max_message_bytes` (the length field included, as PostgreSQL counts)."""
        self._max_message_bytes = max_message_bytes

    def push(self, data: bytes) -> None:
        if self._offset:
            # Compact only when new bytes arrive, so draining many pipelined messages stays linear.
            del self._buffer[:self._offset]
            self._offset = 0
        self._buffer += data

    @property
    def buffered_size(self) -> int:
        """Bytes received but not yet decoded into a message."""
        return len(self._buffer) - self._offset

    def next_message(self) -> FrontendMessage | None:
        """The next complete message, or None until more bytes arrive."""
        buffer, start = self._buffer, self._offset
        available = len(buffer) - start
        if self._startup_phase:
            if available < 4:
                return None
            length = _INT32.unpack_from(buffer, start)[0]
            if not 8 <= length <= MAX_STARTUP_PACKET_LENGTH:
                raise ProtocolViolation("invalid length of startup packet")
            if available < length:
                return None
            message = _decode_startup(bytes(buffer[start + 4:start + length]))
            self._offset = start + length
            if isinstance(message, StartupMessage):
                self._startup_phase = False
            return message
        if available < 5:
            return None
        type_byte, length = _TYPE_AND_LENGTH.unpack_from(buffer, start)
        entry = _TYPED_DECODERS.get(type_byte)
        if entry is None:
            raise ProtocolViolation(f"invalid frontend message type {type_byte[0]}")
        max_length, decode = entry
        cap = self._max_message_bytes
        if cap is None:  # before authentication
            max_length = MAX_AUTH_TOKEN_LENGTH if type_byte == b"p" else min(max_length, SMALL_MESSAGE_LIMIT)
        if not 4 <= length <= max_length:
            raise ProtocolViolation("invalid message length")
        if cap is not None and length > cap:
            raise MessageTooLong(f"message of {length} bytes exceeds the server's limit of {cap} bytes",
                                 hint="the server's --max-message-bytes sets the limit")
        if available < length + 1:
            return None
        body = bytes(buffer[start + 5:start + length + 1])
        self._offset = start + length + 1
        fast = _FAST_DECODERS.get(type_byte)
        if fast is not None:
            try:
                return fast(body)
            except (ValueError, IndexError, struct.error):
                pass  # malformed: the checked decoder below says exactly how
        return decode(_Reader(body))

    def peek_bound_group(self) -> BoundGroup | None:
        """The buffered BoundGroup, if the next bytes are one (nothing consumed; see skip)."""
        if self._startup_phase or len(self._buffer) - self._offset < 5 or self._buffer[self._offset] not in b"PB":
            return None
        return peek_bound_group(self._buffer, self._offset)

    def skip(self, size: int) -> None:
        """Consume `size` bytes already handled as a whole (a BoundGroup answered at once)."""
        self._offset += size

    def feed(self, data: bytes) -> list[FrontendMessage]:
        """Push bytes and return every message now complete (raises on malformed input)."""
        self.push(data)
        messages = []
        while (message := self.next_message()) is not None:
            messages.append(message)
        return messages
