"""The HTTP transport for webhook sources (aiohttp). Thin on purpose: validation, idempotency and
durability live in headrace.webhook; this maps URLs to sources and outcomes to status codes, and
counts them.

POST /api/webhook/{database}/{schema}/{name}
    200 (empty body) once every row of the request is durable; 400 body invalid for its format
    (or a failed CHECK); 404 unknown source; 405 another method; 413 body over the limit (after
    gzip/deflate decoding, which aiohttp does as it reads); 429 + Retry-After over the concurrency
    limit (all sources, or this one); 503 + Retry-After while starting, shutting down, or when the
    log cannot be written.
GET /metrics
    Prometheus text format: every part's families (docs/metrics.md), built at scrape time in a worker thread (a
    collector may read the store).
GET /health/live, GET /health/ready
    Liveness, and readiness naming the parts that do not serve (http/health.py).

`run_http` listens with http/fast_ingest.py's protocol, which answers plain webhook POSTs itself
and hands every other connection (with its bytes) to this aiohttp app. Both answer webhooks
through the same WebhookEndpoint (http/webhook_endpoint.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from headrace.console import add_console_routes
from headrace.http.body import BodyTimeout, read_body, request_timeout
from headrace.http.error_log import RequestErrorLogger
from headrace.http.fast_ingest import HttpFront, start_front
from headrace.http.health import Health, add_health_routes
from headrace.http.settings import HttpSettings
from headrace.http.sql_api import add_sql_routes
from headrace.http.webhook_endpoint import Reply, ServerState, WebhookEndpoint
from headrace.webhook.ingest import IngestRegistry
from headrace.webhook.metrics import WebhookCollector

__all__ = ["MAX_BODY_BYTES", "ServerState", "health_of", "make_app", "register_metrics", "run_http"]

MAX_BODY_BYTES = 5 << 20  # the default of IngestSettings.max_body_bytes, as Materialize
WEBHOOK_ROUTE = "/api/webhook/{database}/{schema}/{name}"

_REGISTRY: web.AppKey[IngestRegistry] = web.AppKey("headrace_ingest_registry", IngestRegistry)
_ENDPOINT: web.AppKey[WebhookEndpoint] = web.AppKey("headrace_webhook_endpoint", WebhookEndpoint)
_SETTINGS: web.AppKey[HttpSettings] = web.AppKey("headrace_http_settings", HttpSettings)
_METRICS: web.AppKey[CollectorRegistry] = web.AppKey("headrace_metrics", CollectorRegistry)
_HEALTH: web.AppKey[Health] = web.AppKey("headrace_health", Health)


def make_app(registry: IngestRegistry, *, ready: Callable[[], bool] | ServerState = lambda: True,
             http: HttpSettings | None = None) -> web.Application:
    """`ready` says whether the server takes requests yet (503 + Retry-After until it does);
    `http`: the port's timeouts and allowed Origins (http/settings.py)."""
    http = http or HttpSettings()
    settings = registry.settings
    # aiohttp enforces client_max_size on the decoded body as it reads, chunked or not.
    app = web.Application(client_max_size=settings.max_body_bytes)
    endpoint = WebhookEndpoint(registry, ready)
    app[_REGISTRY] = registry
    app[_ENDPOINT] = endpoint
    app[_SETTINGS] = http
    app.router.add_route("*", WEBHOOK_ROUTE, _AiohttpWebhook(endpoint, http.body_timeout_s).handle)
    metrics_registry = CollectorRegistry(auto_describe=False)
    metrics_registry.register(WebhookCollector(lambda: [(key, ingestor.metrics) for key, ingestor in registry.items()]))
    app[_METRICS] = metrics_registry

    async def metrics(_request: web.Request) -> web.Response:
        # In a thread: collectors read other threads' counters and some read the store (materializations).
        response = web.Response(body=await asyncio.to_thread(generate_latest, metrics_registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app.router.add_get("/metrics", metrics)
    health = Health(ready if isinstance(ready, ServerState) else _CallableState(ready))
    app[_HEALTH] = health
    add_health_routes(app, health)
    add_sql_routes(app, http.allowed_origins, http.body_timeout_s)  # POST /api/sql, WebSocket /api/experimental/sql (http/sql_api.py)
    add_console_routes(app)  # GET /: the web console, over the SQL API (console/, docs/console.md)
    return app


def health_of(app: web.Application) -> Health:
    """What /health/ready checks: the server gives it its parts as they start (server.py, metrics/setup.py)."""
    return app[_HEALTH]


class _CallableState(ServerState):
    """A `ready` given as a function (tests), read as a ServerState."""

    def __init__(self, ready: Callable[[], bool]) -> None:
        super().__init__()
        self._ready = ready

    @property  # type: ignore[override]
    def ready(self) -> bool:
        return self._ready()

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ready = lambda: value


def register_metrics(app: web.Application, collector: Collector) -> None:
    """Serve `collector`'s families on GET /metrics too (parts made after the app: the coordinator's)."""
    app[_METRICS].register(collector)


async def run_http(app: web.Application, host: str, port: int) -> HttpFront:
    """Start serving `app` on host:port (port 0 picks a free one: see .addresses); `cleanup()` stops."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, logger=RequestErrorLogger(),
                           keepalive_timeout=app[_SETTINGS].keepalive_timeout_s)
    await runner.setup()
    try:
        return await start_front(app[_ENDPOINT], runner, host, port, app[_SETTINGS])
    except BaseException:
        await runner.cleanup()
        raise


def _response(reply: Reply) -> web.Response:
    headers = {}
    if reply.retry_after_s is not None:
        headers["Retry-After"] = str(reply.retry_after_s)
    if reply.allow is not None:
        headers["Allow"] = reply.allow
    if reply.status == 200 and not reply.text:
        return web.Response(status=200, headers=headers or None)
    return web.Response(status=reply.status, text=reply.text, headers=headers or None)


class _AiohttpWebhook:
    """The webhook route for what the fast front hands over (compressed bodies, Expect, ...)."""

    def __init__(self, endpoint: WebhookEndpoint, body_timeout_s: float) -> None:
        self.endpoint = endpoint
        self.body_timeout_s = body_timeout_s

    async def handle(self, request: web.Request) -> web.StreamResponse:
        received_at_us = time.time_ns() // 1000  # arrival time (seed 002's NowFn), before the body is read
        started = time.perf_counter()
        match = request.match_info  # aiohttp has percent-decoded the path segments already
        endpoint = self.endpoint
        admitted = endpoint.admit(request.method, match["database"], match["schema"], match["name"],
                                  request.content_length, received_at_us, started)
        if isinstance(admitted, Reply):
            return _response(admitted)
        ingestor = admitted
        try:
            try:
                body = await read_body(request, endpoint.settings.max_body_bytes, self.body_timeout_s)
            except BodyTimeout:
                return request_timeout()
            except web.HTTPRequestEntityTooLarge:
                return _response(endpoint.too_large(ingestor, received_at_us, started))
            except web.HTTPException:
                raise
            except Exception:  # noqa: BLE001 - aiohttp's RequestPayloadError: a body that cannot be decoded
                return _response(endpoint.undecodable(ingestor, received_at_us, request.content_length or 0, started))
            outcome = endpoint.submit(ingestor, list(request.headers.items()), body, received_at_us, started)
            if isinstance(outcome, Reply):
                return _response(outcome)
            try:
                offsets = await outcome
            except Exception as error:  # noqa: BLE001 - mapped (or re-raised) by the endpoint
                return _response(endpoint.failed(ingestor, error, received_at_us, len(body), started))
            return _response(endpoint.accepted(ingestor, len(offsets), received_at_us, len(body), started))
        finally:
            endpoint.release(ingestor)
