"""The log read service: the headrace server serves ranges of its sources' and tables' durable logs over HTTP, so
Spark executors and a remote Spark driver (a cluster, a Spark Connect server) need no shared files.

Protocol (version 1; every request carries `Authorization: Bearer <token>`):

    GET  /log/v1/{log}/end?start=S[&max_records=M]
         200 application/json {"end": E, "boundaries": [...]}: E is the end of the complete, checksum-valid records
         from S (log/reader.scan_end); with max_records, past at most M records, and `boundaries` holds a record
         boundary every log/access.BOUNDARY_EVERY records (log/access.scan_capped). What latestOffset needs.
    GET  /log/v1/{log}/records?start=S&end=E
         200 application/vnd.apache.arrow.stream: the records starting in [S, E) as an Arrow IPC stream of
         RECORDS_SCHEMA (log_offset int64, payload binary), in log order. E must come from /end (or a committed
         offset): a range that is not whole records fails (500, or a cut stream when found past the first batch).
    POST /log/v1/{log}/records-at   body {"offsets": [o1, o2, ...]}
         200 Arrow stream as above, one row per offset in request order: the rows a batch replaces
         (pipeline/view_changes.read_replaced); 404 if no record starts at one of them.

    {log} is the source's or table's id (its directory under <data-dir>/logs; /end of one with no directory yet
    answers end = start, as reading the files would). Errors are text/plain: 400 a malformed parameter or log id;
    401 no bearer token (with WWW-Authenticate); 403 a wrong one; 404 an unknown log (records) or path; 405 another method; 413 too many offsets; 500 a log that does not hold whole records there.

Why raw records and not the decoded columns log_source.py yields: the server only checks checksums and copies
bytes (its CPU is the webhooks'), the decoding (JSON headers, fields) runs where Spark runs and scales with it, and
one protocol serves sources and tables alike (their records differ). The token is random per server start, written
to <data-dir>/log-read-token (0600) and handed to the pipeline process in HEADRACE_LOG_TOKEN; it is compared in
constant time.

This module is the protocol, without I/O of its own (tested without sockets): `LogReadService.respond` maps a
request to a `LogReply` whose body is bytes or an iterator of byte chunks (the log is read as it is iterated). The
aiohttp transport is `start_log_read_service` at the end."""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from headrace.log.access import FileLogAccess
from headrace.log.segments import LogCorruption

API_PREFIX = "/log/v1/"
TOKEN_FILE = "log-read-token"
TOKEN_ENV = "HEADRACE_LOG_TOKEN"
RECORDS_SCHEMA = pa.schema([("log_offset", pa.int64()), ("payload", pa.binary())])
ARROW_STREAM_TYPE = "application/vnd.apache.arrow.stream"
MAX_OFFSETS_PER_REQUEST = 100_000
MAX_RECORDS_PER_SCAN = 10_000_000
BATCH_ROWS = 8_192
BATCH_BYTES = 8 << 20  # an Arrow batch is cut at whichever comes first
_LOG_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # catalog ids ("u1", ...): never a path


@dataclass(frozen=True)
class LogReply:
    status: int
    body: bytes | Iterator[bytes] = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


def _error(status: int, message: str, **headers: str) -> LogReply:
    return LogReply(status, (message + "\n").encode(), headers=headers)


class BadRequest(Exception):
    pass


def _offset(query: Mapping[str, str], name: str, required: bool = True) -> int | None:
    text = query.get(name)
    if text is None:
        if required:
            raise BadRequest(f"missing query parameter {name}")
        return None
    if not text.isdigit() or len(text) > 19:
        raise BadRequest(f"{name} must be a non-negative integer offset, not {text[:40]!r}")
    return int(text)


class _Drain:
    """A write-only file for pyarrow's stream writer whose bytes are taken as they come."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def records_stream(records: Iterator[tuple[int, bytes]]) -> Iterator[bytes]:
    """Records as the bytes of an Arrow IPC stream of RECORDS_SCHEMA, one chunk per record batch (the schema comes
    with the first, the end-of-stream marker with the last): the range is never held whole in memory."""
    drain = _Drain()
    writer = pa.ipc.new_stream(drain, RECORDS_SCHEMA)
    offsets: list[int] = []
    payloads: list[bytes] = []
    size = 0
    for offset, payload in records:
        offsets.append(offset)
        payloads.append(payload)
        size += len(payload)
        if len(offsets) >= BATCH_ROWS or size >= BATCH_BYTES:
            writer.write_batch(_batch(offsets, payloads))
            yield drain.take()
            offsets, payloads, size = [], [], 0
    if offsets:
        writer.write_batch(_batch(offsets, payloads))
    writer.close()
    yield drain.take()


def _batch(offsets: list[int], payloads: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(offsets, pa.int64()), pa.array(payloads, pa.binary())],
                                      schema=RECORDS_SCHEMA)


class LogReadService:
    """Answers log read requests for the logs under `logs_root` (<data-dir>/logs), to holders of `token`."""

    def __init__(self, logs_root: Path, token: str) -> None:
        if len(token) < 16:
            raise ValueError("the log read token must be at least 16 characters")
        self.logs_root = logs_root
        self._token = token.encode()
        self.answered: dict[tuple[str, int], int] = {}  # (action, status) -> requests: /metrics

    def respond(self, method: str, path: str, query: Mapping[str, str], authorization: str | None,
                body: bytes = b"") -> LogReply:
        reply = self._respond(method, path, query, authorization, body)
        action = path.rsplit("/", 1)[-1] if path.startswith(API_PREFIX) else "other"
        key = (action if action in ("end", "records", "records-at") else "other", reply.status)
        self.answered[key] = self.answered.get(key, 0) + 1
        return reply

    def authenticate(self, authorization: str | None) -> LogReply | None:
        """None if `authorization` carries the token; else the 401/403 reply."""
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return _error(401, "a bearer token is required (Authorization: Bearer <token>)",
                          **{"WWW-Authenticate": 'Bearer realm="headrace-log"'})
        if not hmac.compare_digest(given.strip().encode(), self._token):
            return _error(403, "wrong log read token")
        return None

    def _respond(self, method: str, path: str, query: Mapping[str, str], authorization: str | None,
                 body: bytes) -> LogReply:
        denied = self.authenticate(authorization)
        if denied is not None:
            return denied
        if not path.startswith(API_PREFIX):
            return _error(404, f"no such path: {path[:200]}")
        log_id, _, action = path[len(API_PREFIX):].partition("/")
        if not _LOG_ID.match(log_id):
            return _error(400, f"not a log id: {log_id[:80]!r}")
        expected_method = {"end": "GET", "records": "GET", "records-at": "POST"}.get(action)
        if expected_method is None:
            return _error(404, f"no such path: {path[:200]}")
        if method != expected_method:
            return _error(405, f"{action} takes {expected_method}", Allow=expected_method)
        directory = self.logs_root / log_id
        if not directory.is_dir() and action != "end":  # /end of a log not made yet is its start, as for the files
            return _error(404, f"no log {log_id}")
        access = FileLogAccess(directory)
        try:
            if action == "end":
                return self._end(access, query)
            if action == "records":
                return self._records(access, query)
            return self._records_at(access, body)
        except BadRequest as bad:
            return _error(400, str(bad))
        except LookupError as missing:
            return _error(404, str(missing))
        except LogCorruption as corrupt:
            return _error(500, str(corrupt))

    def _end(self, access: FileLogAccess, query: Mapping[str, str]) -> LogReply:
        start = _offset(query, "start")
        max_records = _offset(query, "max_records", required=False)
        assert start is not None
        if max_records is not None:
            if not 0 < max_records <= MAX_RECORDS_PER_SCAN:
                raise BadRequest(f"max_records must be between 1 and {MAX_RECORDS_PER_SCAN}")
            end, boundaries = access.scan_capped(start, max_records)
        else:
            end, boundaries = access.scan_end(start), []
        return LogReply(200, json.dumps({"end": end, "boundaries": boundaries}).encode(), "application/json")

    def _records(self, access: FileLogAccess, query: Mapping[str, str]) -> LogReply:
        start, end = _offset(query, "start"), _offset(query, "end")
        assert start is not None and end is not None
        if end < start:
            raise BadRequest(f"end {end} is before start {start}")
        return self._stream(access.records(start, end))

    def _records_at(self, access: FileLogAccess, body: bytes) -> LogReply:
        try:
            offsets = json.loads(body or b"null")["offsets"]
        except (ValueError, TypeError, KeyError):
            raise BadRequest('the body must be a JSON object {"offsets": [...]}') from None
        if not isinstance(offsets, list) or not all(type(o) is int and o >= 0 for o in offsets):
            raise BadRequest("offsets must be a list of non-negative integers")
        if len(offsets) > MAX_OFFSETS_PER_REQUEST:
            return _error(413, f"at most {MAX_OFFSETS_PER_REQUEST} offsets per request")
        return self._stream(iter(access.records_at(offsets)))  # every lookup done now: a miss is a 404

    @staticmethod
    def _stream(records: Iterator[tuple[int, bytes]]) -> LogReply:
        chunks = records_stream(records)
        first = next(chunks)  # the schema and the first batch (or all): an error reading them still gets a status
        return LogReply(200, _chained(first, chunks), ARROW_STREAM_TYPE)


def _chained(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def decode_records(chunks: Any) -> Iterator[tuple[int, bytes]]:
    """The (offset, payload) records of an Arrow stream of RECORDS_SCHEMA (`chunks`: a readable file object or bytes)."""
    reader = pa.ipc.open_stream(chunks)
    if reader.schema != RECORDS_SCHEMA:
        raise ValueError(f"unexpected log read schema {reader.schema}")
    for batch in reader:
        yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist())


class LogReadCollector:
    """`headrace_log_read_requests_total{action,status}` on GET /metrics."""

    def __init__(self, service: LogReadService) -> None:
        self._service = service

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily("headrace_log_read_requests", "Requests the log read service answered, by "
                                     "action (end, records, records-at) and HTTP status.", labels=["action", "status"])
        for (action, status), count in sorted(dict(self._service.answered).items()):
            family.add_metric([action, str(status)], count)
        yield family


def write_token(data_dir: Path) -> str:
    """A new random token for this server's life, in <data-dir>/log-read-token (mode 0600)."""
    token = secrets.token_urlsafe(32)
    path = data_dir / TOKEN_FILE
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(token)
    os.replace(temporary, path)
    return token


@dataclass
class LogReadServer:
    address: tuple[str, int]  # where it listens (the port, when 0 was asked)
    runner: Any  # aiohttp AppRunner
    executor: Any  # its file reads' ThreadPoolExecutor

    async def close(self) -> None:
        await self.runner.cleanup()
        self.executor.shutdown(wait=False)


async def start_log_read_service(service: LogReadService, host: str, port: int) -> LogReadServer:
    """Serve `service` on host:port (0: a free port) with aiohttp, on a port of its own (the webhook port's fast
    path stays as it is). File reads run in a thread pool of their own: they never block the event loop nor wait
    behind the store's work."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from aiohttp import web

    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="headrace-log-read")
    _END = object()

    async def handle(request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        body = await request.read() if request.method == "POST" else b""
        reply = await loop.run_in_executor(executor, service.respond, request.method, request.path,
                                           dict(request.query), request.headers.get("Authorization"), body)
        headers = {"Content-Type": reply.content_type, **reply.headers}
        if isinstance(reply.body, bytes):
            return web.Response(status=reply.status, body=reply.body, headers=headers)
        response = web.StreamResponse(status=reply.status, headers=headers)
        await response.prepare(request)
        chunks = reply.body
        try:
            while (chunk := await loop.run_in_executor(executor, next, chunks, _END)) is not _END:
                await response.write(chunk)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - a log error past the first batch: cut the stream, never end it cleanly
            if request.transport is not None:
                request.transport.abort()
            raise
        await response.write_eof()
        return response

    app = web.Application(client_max_size=16 << 20)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server  # noqa: SLF001 - the bound port when port was 0
    assert server is not None
    bound = server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
    return LogReadServer((str(bound[0]), int(bound[1])), runner, executor)
