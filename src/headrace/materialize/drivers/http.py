"""HTTP sink driver (delta updates only). Commit pattern: recovery log with a non-transactional store, made
effectively-once by deterministic idempotency keys for a receiver that deduplicates on them.

Config: `{"url": "http://...", "headers": {name: value}, "batch_size": 1000, "max_attempts": 8,
"timeout_seconds": 10}` (also `initial_backoff_seconds`, default 0.25). Only delta-updates bindings: every
document is a change of the upstream relation carrying `hr_timestamp` (the upstream commit it comes from, ms) and
`hr_diff` (+1 insert, -1 retraction). `resource_path` only names a binding.

StartCommit POSTs the transaction's documents: grouped by `hr_timestamp` (ascending), sorted within one by
(key, hr_diff, then the document's canonical JSON, so ties order deterministically too), in batches of
`batch_size`. Each POST's body is a JSON array of the documents (the binding's columns), with headers
`Content-Type: application/json`, the configured ones, and
`Idempotency-Key: <materialization>:<key_begin>-<key_end>:<hr_timestamp>:<batch index>` (decimal numbers; with
several bindings the binding's index comes before the timestamp). One upstream commit always lands in one runtime
transaction (the sink runner never splits one), so the keys are the same in every replay whatever the
transaction boundaries: a receiver that deduplicates on the header (a headrace webhook source with IDEMPOTENT on
it) gets each batch exactly once; any other receiver gets it at least once. Batches are sent in order, one at a
time; StartedCommit is answered once every batch was accepted (2xx).

Retries: connection errors, timeouts, 408, 429 and 5xx are retried with exponential backoff and full jitter
(initial_backoff_seconds * 2^n, at most MAX_BACKOFF_SECONDS), or after the response's Retry-After (seconds or an
HTTP date, at most MAX_RETRY_AFTER_SECONDS), up to `max_attempts` attempts per batch, then the commit fails.
Any other status (3xx, 4xx) fails the commit at once with the status and the start of the response body. A
failed commit is replayed by the runtime from its recovery log, with the same keys.

StartedCommit carries no state; Open returns no checkpoint (the runtime's recovery log holds it); Load is never
sent to a delta-updates binding. No fencing (an endpoint has nothing to fence with): a zombie runtime's POSTs
carry the keys a newer runtime sends for the same changes, so a deduplicating receiver is unharmed. Headers may hold secrets: neither they nor the URL's query or credentials appear
in messages.
"""

from __future__ import annotations

import email.utils
import json
import http.client
import random
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from headrace.errors import DataError, FeatureNotSupported, InvalidParameterValue, ServiceUnavailable
from headrace.materialize.drivers.arrow_values import documents_from_table, dump_json
from headrace.materialize.protocol import (
    LOCATION_RECOMMENDED, LOCATION_REQUIRED, PROTOCOL_VERSION, Acknowledged, Applied, Apply, Binding,
    FieldConstraint, Load, Loaded, Open, Opened, Spec, SpecResponse, StartedCommit, Store, StoreColumns, Validate,
    Validated, ValidatedBinding)

MAX_BACKOFF_SECONDS = 30.0
MAX_RETRY_AFTER_SECONDS = 300.0
BODY_EXCERPT = 200  # characters of a refusing response's body quoted in the error
_RETRIED_STATUSES = frozenset({408, 429})
_DELTA_ONLY = ("an HTTP sink sends changes only: create it WITH (DELTA UPDATES = true) (binding {path} is not "
               "delta updates)")


@dataclass(frozen=True)
class HttpConfig:
    scheme: str
    host: str
    port: int
    target: str  # path and query, as sent in the request line
    headers: dict[str, str]
    batch_size: int
    max_attempts: int
    timeout_seconds: float
    initial_backoff_seconds: float

    @property
    def where(self) -> str:
        """The endpoint without credentials or query (for messages: the query may hold a token)."""
        return f"{self.scheme}://{self.host}:{self.port}{self.target.split('?', 1)[0]}"


def _number(config: dict[str, Any], name: str, default: float, integer: bool, minimum: float) -> Any:
    value = config.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or value < minimum:
        kind = "an integer" if integer else "a number"
        raise InvalidParameterValue(f"HTTP sink: option {name.upper()} must be {kind} of at least {minimum}")
    return value


def parse_config(config: dict[str, Any]) -> HttpConfig:
    url = config.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidParameterValue("HTTP sink: option URL must be an http:// or https:// URL")
    if parts.username is not None:
        raise InvalidParameterValue("HTTP sink: put credentials in HEADERS (Authorization), not in the URL")
    headers = config.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise InvalidParameterValue("HTTP sink: option HEADERS must map header names to strings")
    for name, value in headers.items():
        if not name or any(c in name for c in " :\r\n\t") or any(c in value for c in "\r\n"):
            raise InvalidParameterValue(f"HTTP sink: header {name!r} has an invalid name or value")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise InvalidParameterValue(f"HTTP sink: option URL has an invalid port: {exc}") from None
    return HttpConfig(parts.scheme, parts.hostname, port, (parts.path or "/") + (f"?{parts.query}" if parts.query
                                                                                   else ""),
                      {k: v for k, v in headers.items() if k.lower() not in ("idempotency-key", "content-type")},
                      _number(config, "batch_size", 1000, True, 1), _number(config, "max_attempts", 8, True, 1),
                      _number(config, "timeout_seconds", 10, False, 0.001),
                      _number(config, "initial_backoff_seconds", 0.25, False, 0))


def _check_delta(bindings: Iterable[Any]) -> None:
    for binding in bindings:
        if not binding.delta_updates:
            raise InvalidParameterValue(_DELTA_ONLY.format(path=".".join(binding.resource_path)))


class HttpConnector:
    """Spec, Validate and Apply of the HTTP sink (nothing to create)."""

    def spec(self, spec: Spec) -> SpecResponse:
        return SpecResponse(PROTOCOL_VERSION, {
            "type": "object", "required": ["url"],
            "properties": {"url": {"type": "string"}, "headers": {"type": "object",
                                                                  "additionalProperties": {"type": "string"}},
                           "batch_size": {"type": "integer", "minimum": 1, "default": 1000},
                           "max_attempts": {"type": "integer", "minimum": 1, "default": 8},
                           "timeout_seconds": {"type": "number", "default": 10},
                           "initial_backoff_seconds": {"type": "number", "default": 0.25}}},
            {"type": "object", "properties": {"delta_updates": {"const": True, "x-delta-updates": True}}})

    def validate(self, validate: Validate) -> Validated:
        parse_config(validate.config)
        _check_delta(validate.bindings)
        answers = []
        for proposal in validate.bindings:
            constraints = {name: FieldConstraint(LOCATION_REQUIRED, "a key of the collection") if name in proposal.key
                           else FieldConstraint(LOCATION_REQUIRED, "groups the POSTs by upstream commit")
                           if name in ("hr_timestamp", "hr_diff")
                           else FieldConstraint(LOCATION_RECOMMENDED, "a field of the collection (JSON)")
                           for name in proposal.fields}
            answers.append(ValidatedBinding(proposal.resource_path, constraints, proposal.delta_updates))
        return Validated(tuple(answers))

    def apply(self, apply: Apply) -> Applied:
        parse_config(apply.materialization.config)
        _check_delta(apply.materialization.bindings)
        return Applied("no changes")


# ---------------------------------------------------------------------------------------------- sending


def _sort_part(value: Any) -> tuple[Any, ...]:
    """A total order over JSON key parts (mixed types too): deterministic, which is all the keys need."""
    if value is None:
        return (0,)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, (int, float)):
        return (2, value)
    if isinstance(value, str):
        return (3, value)
    return (4, dump_json(value))


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def _canonical(document: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _body(documents: list[dict[str, Any]]) -> bytes:
    try:
        return orjson.dumps(documents)
    except TypeError:  # integers beyond 64 bits
        return ("[" + ",".join(dump_json(d) for d in documents) + "]").encode()


class _Poster:
    """POSTs with retries over one keep-alive connection."""

    def __init__(self, config: HttpConfig) -> None:
        self.config = config
        self._connection: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            config = self.config
            if config.scheme == "https":
                self._connection = http.client.HTTPSConnection(config.host, config.port,
                                                               timeout=config.timeout_seconds,
                                                               context=ssl.create_default_context())
            else:
                self._connection = http.client.HTTPConnection(config.host, config.port, timeout=config.timeout_seconds)
        return self._connection

    def _request(self, body: bytes, headers: dict[str, str]) -> tuple[int, str | None, bytes]:
        """One attempt; a connection that the server closed while idle is retried at once, uncounted."""
        for fresh in (False, True):
            reused = self._connection is not None and not fresh
            connection = self._connect()
            try:
                connection.request("POST", self.config.target, body, headers)
                response = connection.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if reused:
                    continue
                raise
            except BaseException:
                self.close()
                raise
            if response.will_close:
                self.close()
            return response.status, response.getheader("Retry-After"), data
        raise AssertionError("unreachable")

    def post(self, documents: list[dict[str, Any]], idempotency_key: str) -> None:
        config = self.config
        headers = {**config.headers, "Content-Type": "application/json", "Idempotency-Key": idempotency_key}
        body = _body(documents)
        failure = ""
        for attempt in range(1, config.max_attempts + 1):
            retry_after: float | None = None
            try:
                status, retry_after_header, data = self._request(body, headers)
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, malformed response
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if 200 <= status < 300:
                    return
                excerpt = data[:BODY_EXCERPT].decode("utf-8", "replace")
                failure = f"status {status}: {excerpt!r}"
                if not (status in _RETRIED_STATUSES or status >= 500):
                    raise DataError(f"HTTP sink: {config.where} refused batch {idempotency_key} with {failure}")
                retry_after = _retry_after(retry_after_header)
            if attempt == config.max_attempts:
                break
            backoff = min(MAX_BACKOFF_SECONDS, config.initial_backoff_seconds * 2 ** (attempt - 1))
            time.sleep(retry_after if retry_after is not None else random.uniform(0, backoff))
        raise ServiceUnavailable(f"HTTP sink: {config.where} failed batch {idempotency_key} "
                                 f"{config.max_attempts} times, the last with {failure}")


# ---------------------------------------------------------------------------------------------- transactions


class HttpTransactor:
    """Transactor of one runtime connection POSTing changes (see the module docstring)."""

    def __init__(self) -> None:
        self._poster: _Poster | None = None
        self._bindings: tuple[Binding, ...] = ()
        self._key_prefix = ""
        # per binding: (key, document) of this transaction
        self._documents: list[list[tuple[list[Any], dict[str, Any]]]] = []

    def open(self, open: Open) -> Opened:
        config = parse_config(open.spec.config)
        _check_delta(open.spec.bindings)
        self._poster = _Poster(config)
        self._bindings = open.spec.bindings
        self._key_prefix = f"{open.spec.name}:{open.key_begin}-{open.key_end}"
        self._documents = [[] for _ in self._bindings]
        return Opened(runtime_checkpoint=None)  # the runtime's recovery log holds the checkpoint

    def load(self, loads: list[Load]) -> Iterable[Loaded]:
        raise FeatureNotSupported("an HTTP sink holds no documents to Load (delta updates only)")

    def store(self, stores: list[Store]) -> None:
        for store in stores:
            if store.delete:
                raise FeatureNotSupported("an HTTP sink sends changes, not deletions: retract with hr_diff = -1")
            binding = self._bindings[store.binding]
            document = dict(zip(binding.columns, list(store.key) + list(store.values)))
            self._documents[store.binding].append((store.key, document))

    def store_columns(self, message: StoreColumns) -> None:
        if message.deleted is not None and message.deleted.num_rows:
            raise FeatureNotSupported("an HTTP sink sends changes, not deletions: retract with hr_diff = -1")
        binding = self._bindings[message.binding]
        columns = [(c, binding.column_types[c]) for c in binding.columns]
        for table in (message.rows, message.updated):
            if table is not None and table.num_rows:
                for document in documents_from_table(columns, table):
                    self._documents[message.binding].append(([document[k] for k in binding.key], document))

    def batches(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """This transaction's POSTs in order: (idempotency key, documents)."""
        assert self._poster is not None
        size = self._poster.config.batch_size
        result = []
        for index, documents in enumerate(self._documents):
            by_timestamp: dict[int, list[tuple[Any, dict[str, Any]]]] = {}
            for key, document in documents:
                timestamp = document.get("hr_timestamp")
                if type(timestamp) is not int:
                    raise DataError(f"HTTP sink: a document lacks its integer hr_timestamp (got {timestamp!r})")
                order = (tuple(_sort_part(part) for part in key), _sort_part(document.get("hr_diff")),
                         _canonical(document))
                by_timestamp.setdefault(timestamp, []).append((order, document))
            binding = f":{index}" if len(self._documents) > 1 else ""
            for timestamp in sorted(by_timestamp):
                ordered = [document for _, document in sorted(by_timestamp[timestamp], key=lambda item: item[0])]
                for batch, start in enumerate(range(0, len(ordered), size)):
                    result.append((f"{self._key_prefix}{binding}:{timestamp}:{batch}", ordered[start:start + size]))
        return result

    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit:
        assert self._poster is not None
        try:
            for idempotency_key, documents in self.batches():
                self._poster.post(documents, idempotency_key)
        finally:
            self._documents = [[] for _ in self._bindings]
        return StartedCommit(state=None)

    def acknowledge(self) -> Acknowledged:
        return Acknowledged(state=None)

    def close(self) -> None:
        self._documents = [[] for _ in self._bindings]
        if self._poster is not None:
            self._poster.close()
