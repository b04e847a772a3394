"""The HTTP SQL API, in Materialize's shape, over the same sessions and coordinator as pgwire.

POST /api/sql  (one session per request; `?options={json}` sets session variables)
    {"query": "SELECT 1; SELECT 2"}                         simple: several statements
    {"queries": [{"query": "SELECT $1::int", "params": ["1"]}]}  extended: one statement each
  -> 200 {"results": [{"tag", "rows", "desc": {"columns": [...]}, "notices"} | {"ok": tag, "notices"}
                      | {"error": {"message", "code", "detail", "hint"}, "notices"}]}
     processing stops at the first error; 400 (text) for a request that is not of that form. Several
     statements are one implicit transaction (the error undoes the writes before it), as Materialize runs
     them, unless the request holds BEGIN / COMMIT / ... itself.
GET /api/experimental/sql  (WebSocket: one session for the socket's life)
    first message {"user", "password", "options"}: ParameterStatus*, BackendKeyData, ReadyForQuery;
    then requests as above, each answered by CommandStarting, Rows, Row*, CommandComplete | Error,
    Notice, and one ReadyForQuery. A SUBSCRIBE streams Row messages until it ends or the socket
    closes.

Values are JSON as Materialize writes them: booleans and json/jsonb as JSON, arrays as arrays,
numbers and everything else as their PostgreSQL text.

Browsers (http/origin.py): a request with an Origin header passes only if same-origin or listed
(`--http-allowed-origin`), else 403 {"error": ...}; a listed Origin is answered CORS headers
(and its OPTIONS preflight) and never authenticates by trust. /api/sql takes only
`Content-Type: application/json` (415 otherwise), so a cross-site form or `text/plain` POST, which
a browser sends without a preflight, never reaches a session. The WebSocket's first message must
be an authentication object (only "user", "password", "options"); anything else gets an Error
message and the socket is closed with 1002, as Materialize closes it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from headrace.coordinator.responses import (
    Column,
    CommandComplete,
    CopyFrom,
    CopyTo,
    EmptyQuery,
    ExecuteResponse,
    SendingRows,
    Subscribing,
)
from headrace.cancel import CancelSignal
from headrace.errors import FeatureNotSupported, HeadraceError, QueryCanceled, as_notice
from headrace.http.body import BodyTimeout, read_body, request_timeout
from headrace.http.origin import OriginPolicy, OriginVerdict
from headrace.pgwire import types as pg
from headrace.pgwire.auth import AuthMethod, choose_method
from headrace.pgwire.interfaces import AdapterClient, SessionClient
from headrace.pgwire.security import SecurityConfig
from headrace.pgwire.simple_query import implicit_transaction

DEFAULT_USER = "headrace"
DATABASE = "headrace"
UNNAMED = ""


class SqlEndpoint:
    """The adapter client behind the routes; None until the coordinator is up (503 meanwhile).
    Authentication follows pgwire's rules (`security`): trust, or a password (HTTP Basic, or the
    WebSocket's first message) checked against the role's verifier."""

    def __init__(self, allowed_origins: Sequence[str] = (), body_timeout_s: float = 60.0) -> None:
        self.adapter: AdapterClient | None = None
        self.body_timeout_s = body_timeout_s
        self.security: SecurityConfig = SecurityConfig()
        self.origins = OriginPolicy(allowed_origins)

    def authenticate(self, user: str, password: str | None, peer: str | None, *, cross_site: bool = False) -> None:
        """`cross_site`: from a page of another origin (an allowed one): trust does not apply, a
        password is required even where the rules say trust."""
        method = choose_method(self.security.auth_rules, user, peer)
        if method is AuthMethod.TRUST and not cross_site:
            return
        if method is AuthMethod.REJECT:
            raise HeadraceError(f'no authentication rule for host "{peer or "local"}", user "{user}"',
                                sqlstate="28000", http_status=401)
        verifier = self.security.credentials.password_verifier(user)
        if not password or verifier is None or not verifier.matches_password(password):
            raise HeadraceError(f'password authentication failed for user "{user}"', sqlstate="28P01",
                                http_status=401)


SQL_ENDPOINT: web.AppKey[SqlEndpoint] = web.AppKey("headrace_sql_endpoint", SqlEndpoint)


def add_sql_routes(app: web.Application, allowed_origins: Sequence[str] = (), body_timeout_s: float = 60.0) -> SqlEndpoint:
    endpoint = SqlEndpoint(allowed_origins, body_timeout_s)
    app[SQL_ENDPOINT] = endpoint
    app.router.add_post("/api/sql", _http_sql)
    app.router.add_route("OPTIONS", "/api/sql", _preflight)
    app.router.add_get("/api/experimental/sql", _websocket_sql)
    return endpoint


def set_sql_adapter(app: web.Application, adapter: AdapterClient, security: SecurityConfig | None = None) -> None:
    endpoint = app[SQL_ENDPOINT]
    endpoint.adapter = adapter
    if security is not None:
        endpoint.security = security


# --- requests and events ------------------------------------------------------------------------

class BadRequest(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Query:
    sql: str
    params: tuple[str | None, ...] | None  # None: the simple form (several statements allowed)


def parse_request(body: object) -> list[Query]:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object with \"query\" or \"queries\"")
    if "query" in body and "queries" not in body:
        if not isinstance(body["query"], str):
            raise BadRequest("\"query\" must be a string")
        return [Query(body["query"], None)]
    queries = body.get("queries")
    if not isinstance(queries, list) or "query" in body:
        raise BadRequest("request body must have exactly one of \"query\" or \"queries\"")
    parsed = []
    for item in queries:
        if not isinstance(item, dict) or not isinstance(item.get("query"), str):
            raise BadRequest("each of \"queries\" must be an object with a \"query\" string")
        params = item.get("params") or []
        if not isinstance(params, list) or not all(p is None or isinstance(p, str) for p in params):
            raise BadRequest("\"params\" must be an array of strings or nulls")
        parsed.append(Query(item["query"], tuple(params)))
    return parsed


@dataclass
class Event:
    """One thing to tell the client: `kind` is a WebSocket message type."""

    kind: str  # CommandStarting | Rows | Row | CommandComplete | Error | Notice
    payload: Any


@dataclass
class RequestRun:
    """Runs one request's statements in a session and yields what happened, in order."""

    session: SessionClient
    cancel: asyncio.Event = field(default_factory=CancelSignal)
    allow_streaming: bool = True

    async def events(self, queries: Sequence[Query]) -> AsyncIterator[Event]:
        """Every statement of the request, split before any runs; several outside a transaction block are one
        implicit transaction, as Materialize's API and PostgreSQL's simple Query run them (pgwire/simple_query.py),
        unless the request controls its transactions itself: the first error undoes the writes before it."""
        try:
            statements: list[tuple[str, Sequence[str | None] | None]] = []
            for query in queries:
                split = await self.session.split_statements_off_loop(query.sql)
                if query.params is None:
                    statements += [(statement, None) for statement in split]
                elif len(split) > 1:
                    raise HeadraceError("each query must contain exactly one statement", sqlstate="42601")
                else:
                    statements.append((split[0] if split else "", query.params))
            async with implicit_transaction(self.session, [statement for statement, _ in statements], self.cancel):
                for statement, params in statements:
                    async for event in self._statement(statement, params):
                        yield event
        except HeadraceError as error:
            self.session.on_error()
            yield Event("Error", error_payload(error))
        finally:
            self.session.on_sync()

    async def _statement(self, sql: str, params: Sequence[str | None] | None) -> AsyncIterator[Event]:
        await self.session.prepare(UNNAMED, sql, ())
        description = self.session.describe_statement(UNNAMED)
        given = params or ()
        if len(given) != len(description.param_types):
            raise HeadraceError(f"request supplies {len(given)} parameters, but the statement requires "
                                f"{len(description.param_types)}", sqlstate="08P01")
        values: list[object]
        if description.raw_parameters:  # the store PostgreSQL decodes them (coordinator/passthrough.py)
            values = [(pg.TEXT_FORMAT, None if value is None else value.encode()) for value in given]
        else:
            values = [pg.decode_parameter(oid, pg.TEXT_FORMAT, None if value is None else value.encode())
                      for oid, value in zip(description.param_types, given, strict=True)]
        self.session.bind(UNNAMED, UNNAMED, values)
        result = await self.session.execute(UNNAMED, 0, self.cancel)
        async for event in self._result(result):
            yield event

    async def _result(self, result: ExecuteResponse) -> AsyncIterator[Event]:
        if isinstance(result, SendingRows):
            yield Event("CommandStarting", {"has_rows": True, "is_streaming": False})
            yield Event("Rows", describe(result.columns))
            converters = [json_converter(column.type_oid, column.raw_format) for column in result.columns]
            for row in result.rows:
                yield Event("Row", [None if value is None else convert(value)
                                    for value, convert in zip(row, converters, strict=True)])
            yield Event("CommandComplete", result.command_tag)
        elif isinstance(result, Subscribing):
            if not self.allow_streaming:
                result.cancel()
                raise FeatureNotSupported("SUBSCRIBE is not supported over POST /api/sql",
                                          hint="use the WebSocket endpoint /api/experimental/sql")
            yield Event("CommandStarting", {"has_rows": True, "is_streaming": True})
            yield Event("Rows", describe(result.columns))
            converters = [json_converter(column.type_oid) for column in result.columns]
            try:
                async for batch in until_cancelled(result.batches, self.cancel):
                    for row in batch:
                        yield Event("Row", [None if value is None else convert(value)
                                            for value, convert in zip(row, converters, strict=True)])
            finally:
                result.cancel()
            yield Event("CommandComplete", "SUBSCRIBE")
        elif isinstance(result, CommandComplete):
            yield Event("CommandStarting", {"has_rows": False, "is_streaming": False})
            for notice in map(as_notice, result.notices):
                yield Event("Notice", {"message": notice.message, "code": notice.sqlstate,
                                       "severity": notice.severity.lower()})
            for name, value in result.parameters:
                yield Event("ParameterStatus", {"name": name, "value": value})
            yield Event("CommandComplete", result.tag)
        elif isinstance(result, EmptyQuery):
            return
        elif isinstance(result, (CopyTo, CopyFrom)):
            if isinstance(result, CopyTo):
                aclose = getattr(result.data, "aclose", None)
                if aclose is not None:
                    await aclose()
            raise FeatureNotSupported("COPY is not supported over the HTTP API", hint="use a PostgreSQL client")
        else:
            raise FeatureNotSupported(f"unexpected response {type(result).__name__}")


async def until_cancelled(batches: AsyncIterator[Any], cancel: asyncio.Event) -> AsyncIterator[Any]:
    """The stream's batches until it ends or `cancel` is set (then 57014)."""
    iterator = batches.__aiter__()
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        while True:
            step = asyncio.ensure_future(iterator.__anext__())
            await asyncio.wait({step, cancelled}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                raise QueryCanceled("canceling statement due to user request")
            try:
                batch = step.result()
            except StopAsyncIteration:
                return
            yield batch
    finally:
        cancelled.cancel()


def error_payload(error: HeadraceError) -> dict[str, Any]:
    payload: dict[str, Any] = {"message": error.message, "code": error.sqlstate}
    if error.detail is not None:
        payload["detail"] = error.detail
    if error.hint is not None:
        payload["hint"] = error.hint
    return payload


def describe(columns: Sequence[Column]) -> dict[str, Any]:
    return {"columns": [{"name": column.name, "type_oid": column.type_oid,
                         "type_len": column.type_size if column.type_size != -1 else pg.type_size(column.type_oid),
                         "type_mod": column.type_modifier} for column in columns]}


def json_converter(oid: int, raw_format: int = -1) -> Any:
    """The function that turns a non-NULL value of this type into its JSON form. `raw_format` 0: the value is
    PostgreSQL's text of it (a statement the store PostgreSQL ran), given as JSON as Materialize gives it."""
    if raw_format == pg.TEXT_FORMAT:
        if oid == pg.BOOL:
            return lambda value: value == b"t"
        if oid in (pg.JSON, pg.JSONB):
            return json.loads
        return lambda value: value.decode()
    if oid == pg.BOOL:
        return bool
    if oid in (pg.JSON, pg.JSONB):
        return lambda value: json.loads(value) if isinstance(value, (str, bytes)) else value
    element = pg.pg_type(oid).element_oid
    if element is not None:
        convert_element = json_converter(element)
        return lambda value: [None if item is None else convert_element(item) for item in value]
    encode = pg.value_encoder(oid, pg.TEXT_FORMAT)
    return lambda value: encode(value).decode()


# --- POST /api/sql ------------------------------------------------------------------------------

def _credentials_of(request: web.Request) -> tuple[str, str | None]:
    """HTTP Basic's user and password; the default user (no password) without the header."""
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("basic "):
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            raise BadRequest("malformed Authorization header") from None
        return user or DEFAULT_USER, password
    return DEFAULT_USER, None


def _peer_of(request: web.Request) -> str | None:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    return str(peer[0]) if peer else None


def _options_of(request: web.Request) -> dict[str, str]:
    raw = request.query.get("options")
    if raw is None:
        return {}
    try:
        options = json.loads(raw)
    except ValueError:
        raise BadRequest("options must be a JSON object") from None
    if not isinstance(options, dict):
        raise BadRequest("options must be a JSON object")
    return {str(name): str(value) for name, value in options.items()}


def _origin_verdict(request: web.Request) -> OriginVerdict:
    return request.app[SQL_ENDPOINT].origins.check(request.headers.get("Origin"), request.headers.get("Host"),
                                                   request.scheme)


def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers, dumps=_dumps)


def _refused_origin(request: web.Request) -> web.Response:
    return _json_error(403, f"origin {request.headers.get('Origin', '')!r} is not allowed to use the SQL API "
                            "(same-origin requests and those from `headrace up --http-allowed-origin` are)")


def _cors_headers(request: web.Request, verdict: OriginVerdict) -> dict[str, str]:
    if verdict is not OriginVerdict.ALLOWED:
        return {}
    return {"Access-Control-Allow-Origin": request.headers["Origin"], "Vary": "Origin"}


async def _preflight(request: web.Request) -> web.StreamResponse:
    """CORS preflight: answered (204 with the CORS headers) only for a listed Origin."""
    verdict = _origin_verdict(request)
    if verdict is OriginVerdict.REFUSED:
        return _refused_origin(request)
    headers = {"Allow": "POST, OPTIONS", **_cors_headers(request, verdict)}
    if verdict is OriginVerdict.ALLOWED:
        headers.update({"Access-Control-Allow-Methods": "POST", "Access-Control-Allow-Headers": "Authorization, Content-Type",
                        "Access-Control-Max-Age": "600"})
    return web.Response(status=204, headers=headers)


async def _http_sql(request: web.Request) -> web.StreamResponse:
    verdict = _origin_verdict(request)
    if verdict is OriginVerdict.REFUSED:
        return _refused_origin(request)
    if request.content_type != "application/json":
        return _json_error(415, "Content-Type must be application/json", _cors_headers(request, verdict))
    response = await _run_http_sql(request, verdict)
    response.headers.update(_cors_headers(request, verdict))
    return response


async def _run_http_sql(request: web.Request, verdict: OriginVerdict) -> web.StreamResponse:
    adapter = request.app[SQL_ENDPOINT].adapter
    if adapter is None:
        return web.Response(status=503, text="headrace is starting; retry later", headers={"Retry-After": "1"})
    try:
        queries = parse_request(json.loads(await read_body(request, request.app._client_max_size,
                                                           request.app[SQL_ENDPOINT].body_timeout_s)))
        options = _options_of(request)
        user, password = _credentials_of(request)
    except BodyTimeout:
        return request_timeout()
    except (RequestPayloadError, HttpProcessingError):  # a Content-Encoding whose body does not decode
        return web.Response(status=400, text="request body could not be decoded")
    except (BadRequest, ValueError) as exc:
        return web.Response(status=400, text=str(exc) if isinstance(exc, BadRequest) else "request body is not JSON")
    try:
        request.app[SQL_ENDPOINT].authenticate(user, password, _peer_of(request), cross_site=verdict.cross_site)
        session = await adapter.new_session(user, DATABASE, options)
    except HeadraceError as error:
        return web.Response(status=error.http_status if error.http_status != 500 else 400, text=error.message)
    try:
        results = await _collect(RequestRun(session, allow_streaming=False), queries)
    finally:
        await session.terminate()
    return web.json_response({"results": results}, dumps=_dumps)


async def _collect(run: RequestRun, queries: Sequence[Query]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    notices: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    async for event in run.events(queries):
        if event.kind == "Rows":
            current = {"tag": None, "rows": [], "desc": event.payload, "notices": notices}
        elif event.kind == "Row":
            assert current is not None
            current["rows"].append(event.payload)
        elif event.kind == "Notice":
            notices.append({"message": event.payload["message"], "severity": event.payload["severity"]})
        elif event.kind == "CommandComplete":
            if current is not None:
                current["tag"] = event.payload
                results.append(current)
            else:
                results.append({"ok": event.payload, "notices": notices})
            current, notices = None, []
        elif event.kind == "Error":
            results.append({"error": event.payload, "notices": notices})
    return results


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


# --- WebSocket /api/experimental/sql ------------------------------------------------------------

WS_CLOSE_PROTOCOL_ERROR = 1002  # Materialize closes a socket whose first message is not a valid auth with it
AUTH_FIELDS = frozenset(("user", "password", "options"))
AUTH_TIMEOUT_S = 60.0  # the first message must come within this (as a request head must: http/settings.py)


async def _websocket_sql(request: web.Request) -> web.StreamResponse:
    # Browsers open cross-origin WebSockets without any preflight: the Origin check is the defence.
    verdict = _origin_verdict(request)
    if verdict is OriginVerdict.REFUSED:
        return _refused_origin(request)
    adapter = request.app[SQL_ENDPOINT].adapter
    if adapter is None:
        return web.Response(status=503, text="headrace is starting; retry later", headers={"Retry-After": "1"})
    ws = web.WebSocketResponse(heartbeat=30)
    await ws.prepare(request)
    try:
        user, password, options = parse_auth_message(await _first_message(ws))
        request.app[SQL_ENDPOINT].authenticate(user, password, _peer_of(request), cross_site=verdict.cross_site)
        session = await adapter.new_session(user, DATABASE, options)
    except (BadRequest, HeadraceError) as exc:
        payload = (error_payload(exc) if isinstance(exc, HeadraceError)
                   else {"message": str(exc), "code": "08P01"})
        await _send(ws, "Error", payload)
        await ws.close(code=WS_CLOSE_PROTOCOL_ERROR, message=payload["message"].encode()[:120])
        return ws
    try:
        for name, value in session.startup_parameters().items():
            await _send(ws, "ParameterStatus", {"name": name, "value": value})
        await _send(ws, "BackendKeyData", {"conn_id": session.connection_id, "secret_key": session.secret_key})
        await _send(ws, "ReadyForQuery", session.transaction_status)
        await _serve_requests(ws, session)
    finally:
        await session.terminate()
        if not ws.closed:
            await ws.close()
    return ws


async def _first_message(ws: web.WebSocketResponse) -> object:
    try:
        message = await ws.receive(timeout=AUTH_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise BadRequest("expected an authentication message") from None
    if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
        raise BadRequest("expected an authentication message")
    try:
        return json.loads(message.data)
    except ValueError:
        raise BadRequest("the authentication message must be JSON") from None


def parse_auth_message(auth: object) -> tuple[str, str | None, dict[str, str]]:
    """(user, password, options) of the WebSocket's first message: a JSON object with only
    "user", "password" (strings) and "options" (an object). A request ({"query": ...}) is not one."""
    if not isinstance(auth, dict) or not set(auth) <= AUTH_FIELDS:
        raise BadRequest('expected an authentication message {"user", "password", "options"} first')
    user = auth.get("user", DEFAULT_USER)
    password = auth.get("password")
    options = auth.get("options")
    if options is None:
        options = {}
    if not isinstance(user, str) or (password is not None and not isinstance(password, str)):
        raise BadRequest('"user" and "password" must be strings')
    if not isinstance(options, dict):
        raise BadRequest('"options" must be a JSON object')
    return user or DEFAULT_USER, password, {str(name): str(value) for name, value in options.items()}


async def _serve_requests(ws: web.WebSocketResponse, session: SessionClient) -> None:
    """Requests are read by one task and run by another, so a closed socket cancels a statement
    that is still running (a SUBSCRIBE streams until then)."""
    requests: asyncio.Queue[Any] = asyncio.Queue()
    running: dict[str, asyncio.Event] = {}

    async def read() -> None:
        async for message in ws:
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                await requests.put(message.data)
            elif message.type == WSMsgType.ERROR:
                break
        for event in running.values():
            event.set()
        await requests.put(None)

    reader = asyncio.ensure_future(read())
    try:
        while (data := await requests.get()) is not None:
            run = RequestRun(session)
            running["current"] = run.cancel
            try:
                queries = parse_request(json.loads(data))
            except (BadRequest, ValueError) as exc:
                message = str(exc) if isinstance(exc, BadRequest) else "request is not JSON"
                await _send(ws, "Error", {"message": message, "code": "08P01"})
            else:
                async with contextlib.aclosing(run.events(queries)) as events:
                    async for event in events:
                        if ws.closed:
                            break
                        await _send(ws, event.kind, event.payload)
            running.pop("current", None)
            if ws.closed:
                break
            await _send(ws, "ReadyForQuery", session.transaction_status)
    finally:
        reader.cancel()


async def _send(ws: web.WebSocketResponse, kind: str, payload: Any) -> None:
    if not ws.closed:
        await ws.send_str(_dumps({"type": kind, "payload": payload}))
