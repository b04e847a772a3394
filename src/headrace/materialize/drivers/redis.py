"""REDIS sink driver. Commit pattern: recovery log with a non-transactional store (at-least-once).

Config: `{"url": "redis://host:port/db", "key_prefix": "..."}` (also rediss:// and unix://). A binding's prefix is
the config's `key_prefix`, else its `resource_path` (one part: `(key_prefix,)`; several are joined by ':'); two
bindings of one sink may not share a prefix.

Keyed bindings: each document is a Redis hash at `<prefix><key>`, one hash field per column that is not NULL (an
absent field reads back as NULL). The key is its parts' text forms, each escaped ('\\' -> '\\\\', ':' -> '\\:')
and joined by ':', so distinct keys never collide (a part holds no unescaped ':'). Text forms of the fields (and
key parts), chosen so that Load gives back exactly what was stored:
  integers (BIGINT, INTEGER, HUGEINT, ...) and TIMESTAMPTZ / TIMESTAMP (integer microseconds since the epoch, UTC)
  as decimal text; DOUBLE / FLOAT as PostgreSQL's float8 text, the shortest that reads back ('0.1', '3', '1e+300',
  'Infinity'); DECIMAL(p,s) as exact decimal text at scale s ('12.50'); VARCHAR and UUID as themselves; BOOLEAN 'true' / 'false'; JSON as JSON
  text; DATE as ISO 'YYYY-MM-DD'; BLOB as its raw bytes (Loaded gives base64 back, the protocol's form).
Delta-updates bindings: each document is appended to the stream `<prefix>` by XADD, a field per non-NULL column
in the same text forms (with `hr_timestamp` and `hr_diff`); optional config `stream_max_length` trims it (~).

A transaction: each batch of Stores the connection loop hands over is written at once (so at the latest at
StartCommit) in one MULTI/EXEC: per key DEL + HSET of the whole document (a replacement, never a merge), DEL for a
deletion, XADD for delta updates. StartedCommit carries no state and Open returns no checkpoint: the runtime's
recovery log holds it, committed after StartedCommit. Load is one pipeline of HGETALLs, decoded by column type.

What holds after a crash: the transactions since the last recovery-log commit are written again (the runtime
replays them from its checkpoint), possibly after some or all of their writes already landed. Full documents are
last-write-wins, so the hashes end equal to the relation's (effectively once); a stream entry may appear twice
(at-least-once: dedupe on `hr_timestamp` and the key); and a value the sink's upstream reduced (a sum, a count) is
written as the full value, never incremented, so a replay never doubles it. Between a crash and the end of the
replay readers may see a transaction partly applied or a document newer than the checkpoint.

Fencing: Open increments the counter `<prefix>\\fence:<materialization>:<key_begin>-<key_end>` (a name no document
key can take: escaped keys never hold '\\f') of the first binding's prefix; every MULTI runs under WATCH of it and
checks it first, so a zombie runtime's writes fail (FencedOff) once a newer runtime opened.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

import orjson
import redis
import redis.exceptions

from headrace.errors import DataError, FeatureNotSupported, InvalidParameterValue, ServiceUnavailable
from headrace.materialize.drivers.arrow_values import (
    arrow_type, documents_from_table, dump_json, normalized_type, values_from_array)
from headrace.materialize.protocol import (
    PROTOCOL_VERSION, Acknowledged, Applied, Apply, Binding, FencedOff, Load, Loaded, Open, Opened, Spec, SpecResponse,
    StartedCommit, Store, StoreColumns, Validate, Validated, ValidatedBinding, field_constraint)
from headrace.pgwire.types.scalars import FLOAT8
from headrace.store.table_types import decimal_shape

CONNECT_TIMEOUT_SECONDS = 10.0
SOCKET_TIMEOUT_SECONDS = 60.0
_EPOCH_DATE = datetime.date(1970, 1, 1)
_INTEGERS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
             "TIMESTAMPTZ", "TIMESTAMP", "INTERVAL"}


# ---------------------------------------------------------------------------------------------- text forms


def _encoder(type_name: str) -> Callable[[Any], bytes]:
    """Row-path value -> the bytes stored (see the module docstring)."""
    name = normalized_type(type_name)
    if name in _INTEGERS:
        return lambda v: str(_integer(v)).encode()
    if name in ("DOUBLE", "FLOAT", "REAL"):
        return lambda v: FLOAT8.encode_text(float(v))  # PostgreSQL's float8 text: '3', not Python's '3.0'
    if name == "BOOLEAN":
        return lambda v: b"true" if _boolean(v) else b"false"
    if name == "JSON":
        return lambda v: dump_json(v).encode()
    if name == "DATE":
        return lambda v: (datetime.date.fromisoformat(v) if isinstance(v, str)
                          else _EPOCH_DATE + datetime.timedelta(days=v)).isoformat().encode()
    if name == "BLOB":
        return lambda v: v if isinstance(v, bytes) else base64.b64decode(v, validate=True)
    if name in ("VARCHAR", "UUID"):
        return lambda v: v.encode()
    shape = (18, 3) if name == "DECIMAL" else decimal_shape(name)
    if shape is None:
        raise FeatureNotSupported(f"type {type_name} cannot be written to Redis")
    quantum = Decimal(1).scaleb(-shape[1])

    def decimal_text(value: Any) -> bytes:
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        exact = number.quantize(quantum)
        if exact != number:
            raise ValueError(f"more than {shape[1]} fractional digits")
        return format(exact, "f").encode()

    return decimal_text


def _integer(value: Any) -> int:
    if type(value) is not int:
        raise TypeError("expected an integer")
    return value


def _boolean(value: Any) -> bool:
    if type(value) is not bool:
        raise TypeError("expected a boolean")
    return value


def _decoder(type_name: str) -> Callable[[bytes], Any]:
    """Stored bytes -> the row-path value."""
    name = normalized_type(type_name)
    if name in _INTEGERS:
        return int
    if name in ("DOUBLE", "FLOAT", "REAL"):
        return float
    if name == "BOOLEAN":
        return lambda b: b == b"true"
    if name == "JSON":
        return orjson.loads
    if name == "BLOB":
        return lambda b: base64.b64encode(b).decode()
    return lambda b: b.decode()  # VARCHAR, UUID, DATE, DECIMAL: their text is the protocol's value


def _escape(part: bytes) -> bytes:
    return part.replace(b"\\", b"\\\\").replace(b":", b"\\:")


class _Codec:
    """One binding's names and text forms."""

    def __init__(self, binding: Binding, prefix: str) -> None:
        self.binding = binding
        self.prefix = prefix.encode()
        self.columns = list(binding.columns)
        self.encoders = {c: _encoder(binding.column_types[c]) for c in self.columns}
        self.decoders = {c.encode(): (c, _decoder(binding.column_types[c])) for c in self.columns}

    def _encode(self, column: str, value: Any) -> bytes:
        try:
            return self.encoders[column](value)
        except (TypeError, ValueError, AttributeError, InvalidOperation) as exc:
            raise DataError(f"column {column!r} ({self.binding.column_types[column]}) cannot hold {value!r}: "
                            f"{exc}") from exc

    def redis_key(self, key: list[Any]) -> bytes:
        if len(key) != len(self.binding.key):
            raise DataError(f"a key of {self.prefix.decode()!r} has {len(key)} parts, not {len(self.binding.key)}")
        parts = []
        for column, part in zip(self.binding.key, key):
            if part is None:
                raise DataError(f"key column {column!r} is NULL")
            parts.append(_escape(self._encode(column, part)))
        return self.prefix + b":".join(parts)

    def fields(self, key: list[Any], values: list[Any]) -> dict[bytes, bytes]:
        document = zip(self.columns, list(key) + list(values))
        return {column.encode(): self._encode(column, value) for column, value in document if value is not None}

    def document(self, stored: dict[bytes, bytes]) -> dict[str, Any]:
        result: dict[str, Any] = dict.fromkeys(self.columns)
        for field, value in stored.items():
            decoder = self.decoders.get(field)
            if decoder is not None:  # a field outside the binding's columns (written by someone else): ignored
                result[decoder[0]] = decoder[1](value)
        return result


# ---------------------------------------------------------------------------------------------- config


def _parse_config(config: dict[str, Any]) -> tuple[str, str | None, int | None]:
    url = config.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise InvalidParameterValue("REDIS sink: option URL must be a redis://, rediss:// or unix:// URL")
    prefix = config.get("key_prefix")
    if prefix is not None and not isinstance(prefix, str):
        raise InvalidParameterValue("REDIS sink: option KEY_PREFIX must be a string")
    max_length = config.get("stream_max_length")
    if max_length is not None and (type(max_length) is not int or max_length < 1):
        raise InvalidParameterValue("REDIS sink: option STREAM_MAX_LENGTH must be a positive integer")
    return url, prefix, max_length


def _prefixes(config_prefix: str | None, resource_paths: Iterable[tuple[str, ...]]) -> list[str]:
    prefixes = [config_prefix if config_prefix is not None else ":".join(path) for path in resource_paths]
    if len(set(prefixes)) < len(prefixes):
        raise InvalidParameterValue("REDIS sink: two bindings would write under the same key prefix")
    return prefixes


def _where(url: str) -> str:
    """The server a URL names, without its credentials (for messages)."""
    parts = urlsplit(url)
    return parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
                                socket_timeout=SOCKET_TIMEOUT_SECONDS, decode_responses=False)


def _unavailable(url: str, exc: redis.exceptions.RedisError) -> ServiceUnavailable:
    return ServiceUnavailable(f"REDIS sink: {_where(url)} failed: {type(exc).__name__}: {exc}")


class RedisConnector:
    """Spec, Validate and Apply of the REDIS sink (Redis is schemaless: Apply has nothing to create)."""

    def spec(self, spec: Spec) -> SpecResponse:
        return SpecResponse(PROTOCOL_VERSION, {
            "type": "object", "required": ["url"],
            "properties": {"url": {"type": "string"}, "key_prefix": {"type": "string"},
                           "stream_max_length": {"type": "integer", "minimum": 1}}},
            {"type": "object", "properties": {"key_prefix": {"type": "string"}}})

    def validate(self, validate: Validate) -> Validated:
        url, prefix, _ = _parse_config(validate.config)
        _prefixes(prefix, (b.resource_path for b in validate.bindings))
        client = _client(url)
        try:
            client.ping()  # a wrong URL or password is reported when the sink is created, not at its first write
        except redis.exceptions.RedisError as exc:
            raise _unavailable(url, exc) from exc
        finally:
            client.close()
        answers = []
        for proposal in validate.bindings:
            constraints = {}
            for name, type_name in proposal.fields.items():
                writable = arrow_type(type_name) is not None or normalized_type(type_name) == "INTERVAL"
                constraints[name] = field_constraint(
                    name, proposal.key, incompatible=None if writable else f"type {type_name} cannot be written to Redis")
            answers.append(ValidatedBinding(proposal.resource_path, constraints, proposal.delta_updates))
        return Validated(tuple(answers))

    def apply(self, apply: Apply) -> Applied:
        _, prefix, _ = _parse_config(apply.materialization.config)
        _prefixes(prefix, (b.resource_path for b in apply.materialization.bindings))
        return Applied("no changes")


# ---------------------------------------------------------------------------------------------- transactions


class RedisTransactor:
    """Transactor of one runtime connection writing to Redis (see the module docstring)."""

    def __init__(self) -> None:
        self._client: redis.Redis | None = None
        self._url = ""
        self._codecs: list[_Codec] = []
        self._max_length: int | None = None
        self._name = ""
        self._fence_key = b""
        self._fence = 0

    def open(self, open: Open) -> Opened:
        self._url, prefix, self._max_length = _parse_config(open.spec.config)
        bindings = open.spec.bindings
        self._codecs = [_Codec(b, p) for b, p in zip(bindings, _prefixes(prefix, (b.resource_path for b in bindings)))]
        self._name = open.spec.name
        self._client = _client(self._url)
        if self._codecs:
            self._fence_key = (self._codecs[0].prefix + b"\\fence:"
                               + f"{open.spec.name}:{open.key_begin}-{open.key_end}".encode())
            self._fence = int(self._call(lambda c: c.incr(self._fence_key)))
        return Opened(runtime_checkpoint=None)  # the runtime's recovery log holds the checkpoint

    def _call(self, action: Callable[[redis.Redis], Any]) -> Any:
        try:
            return action(self._active())
        except redis.exceptions.WatchError:
            raise
        except redis.exceptions.RedisError as exc:
            raise _unavailable(self._url, exc) from exc

    def _active(self) -> redis.Redis:
        if self._client is None:
            raise FeatureNotSupported("the REDIS transactor is not open")
        return self._client

    def _fenced_off(self) -> FencedOff:
        return FencedOff(f"materialization {self._name} fenced off by another runtime (fence {self._fence})")

    def _write(self, queue: Callable[[Any], None]) -> None:
        """Run `queue`'s commands in one MULTI/EXEC, only while the fence is still ours."""

        def run(client: redis.Redis) -> None:
            with client.pipeline(transaction=True) as pipe:
                pipe.watch(self._fence_key)
                if int(pipe.get(self._fence_key) or 0) != self._fence:
                    raise self._fenced_off()
                pipe.multi()
                queue(pipe)
                pipe.execute()

        try:
            self._call(run)
        except redis.exceptions.WatchError:  # the fence changed between WATCH and EXEC: a newer runtime opened
            raise self._fenced_off() from None

    def load(self, loads: list[Load]) -> Iterable[Loaded]:
        with self._active().pipeline(transaction=False) as pipe:
            for load in loads:
                pipe.hgetall(self._codecs[load.binding].redis_key(load.key))
            results = self._call(lambda _: pipe.execute())
        return [Loaded(load.binding, load.key, self._codecs[load.binding].document(stored))
                for load, stored in zip(loads, results) if stored]

    def store(self, stores: list[Store]) -> None:
        commands: list[tuple[str, bytes, dict[bytes, bytes] | None]] = []
        for store in stores:
            codec = self._codecs[store.binding]
            if codec.binding.delta_updates:
                if store.delete:
                    raise FeatureNotSupported("deletions cannot be stored in a delta-updates (append-only) stream")
                commands.append(("xadd", codec.prefix, codec.fields(store.key, store.values)))
            elif store.delete:
                commands.append(("del", codec.redis_key(store.key), None))
            else:
                commands.append(("hset", codec.redis_key(store.key), codec.fields(store.key, store.values)))
        if commands:
            self._write(lambda pipe: self._queue(pipe, commands))

    def _queue(self, pipe: Any, commands: list[tuple[str, bytes, dict[bytes, bytes] | None]]) -> None:
        for kind, name, fields in commands:
            if kind == "xadd":
                assert fields is not None
                pipe.xadd(name, fields, maxlen=self._max_length, approximate=True)
            else:
                pipe.delete(name)  # HSET alone would merge into the old hash: replace it whole
                if fields:
                    pipe.hset(name, mapping=fields)

    def store_columns(self, message: StoreColumns) -> None:
        """A columnar Store, converted to row documents and written like Stores."""
        codec = self._codecs[message.binding]
        binding = codec.binding
        columns = [(c, binding.column_types[c]) for c in binding.columns]
        stores: list[Store] = []
        for table, delete in ((message.rows, False), (message.updated, False), (message.deleted, True)):
            if table is None or not table.num_rows:
                continue
            if delete:
                keys = zip(*(values_from_array(binding.column_types[k], table[k]) for k in binding.key))
                stores += [Store(message.binding, list(key), [], None, True, delete=True) for key in keys]
                continue
            for doc in documents_from_table(columns, table):
                stores.append(Store(message.binding, [doc[k] for k in binding.key],
                                    [doc[v] for v in binding.values], doc, False))
        self.store(stores)

    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit:
        # Every Store is written already; a zombie learns it is fenced off here even with nothing to write.
        if self._codecs and int(self._call(lambda c: c.get(self._fence_key)) or 0) != self._fence:
            raise self._fenced_off()
        return StartedCommit(state=None)

    def acknowledge(self) -> Acknowledged:
        return Acknowledged(state=None)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
