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
    Prometheus text format (per-source counters and the ack latency histogram).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from headrace.errors import HeadraceError, ServiceUnavailable
from headrace.http.sql_api import add_sql_routes
from headrace.webhook.handler import WebhookRejected
from headrace.webhook.ingest import IngestRegistry, SourceIngestor
from headrace.webhook.metrics import WebhookCollector

MAX_BODY_BYTES = 5 << 20  # the default of IngestSettings.max_body_bytes, as Materialize
WEBHOOK_ROUTE = "/api/webhook/{database}/{schema}/{name}"
RETRY_AFTER_S = 1


@dataclass
class ServerState:
    """Whether the server takes webhooks: False while starting and once shutting down."""

    ready: bool = False
    stopping: bool = False


_REGISTRY: web.AppKey[IngestRegistry] = web.AppKey("headrace_ingest_registry", IngestRegistry)


def make_app(registry: IngestRegistry, *, ready: Callable[[], bool] | ServerState = lambda: True) -> web.Application:
    """`ready` says whether the server takes requests yet (503 + Retry-After until it does)."""
    settings = registry.settings
    # aiohttp enforces client_max_size on the decoded body as it reads, chunked or not.
    app = web.Application(client_max_size=settings.max_body_bytes)
    endpoint = _WebhookEndpoint(registry, ready)
    app[_REGISTRY] = registry
    app.router.add_route("*", WEBHOOK_ROUTE, endpoint.handle)
    metrics_registry = CollectorRegistry(auto_describe=False)
    metrics_registry.register(WebhookCollector(lambda: [(key, ingestor.metrics) for key, ingestor in registry.items()]))

    async def metrics(_request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(metrics_registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app.router.add_get("/metrics", metrics)
    add_sql_routes(app)  # POST /api/sql, WebSocket /api/experimental/sql (http/sql_api.py)
    return app


async def run_http(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start serving `app` on host:port (port 0 picks a free one: see runner.addresses)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def _text(status: int, message: str, *, retry_after_s: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return web.Response(status=status, text=message, headers=headers)


class _WebhookEndpoint:
    def __init__(self, registry: IngestRegistry, ready: Callable[[], bool] | ServerState) -> None:
        self.registry = registry
        self.settings = registry.settings
        if isinstance(ready, ServerState):
            state = ready
            self._ready: Callable[[], bool] = lambda: state.ready and not state.stopping
            self._state: ServerState | None = state
        else:
            self._ready = ready
            self._state = None
        self.in_flight = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        received_at_us = time.time_ns() // 1000  # arrival time (seed 002's NowFn), before the body is read
        started = time.perf_counter()
        match = request.match_info
        if request.method != "POST":
            response = web.Response(status=405, text=f"method {request.method} is not allowed; use POST",
                                    headers={"Allow": "POST"})
            known = self.registry.lookup(match["database"], match["schema"], match["name"])
            if known is None:
                return response
            known.metrics.received += 1
            return self._rejected(known, response, "method_not_allowed", received_at_us, 0, started)
        if not self._ready():
            stopping = self._state is not None and self._state.stopping
            return _text(503, "headrace is shutting down; retry later" if stopping else "headrace is starting; retry later",
                         retry_after_s=RETRY_AFTER_S)
        # aiohttp has percent-decoded the path segments already.
        ingestor = self.registry.lookup(match["database"], match["schema"], match["name"])
        if ingestor is None:
            return _text(404, f"unknown webhook source {match['database']}.{match['schema']}.{match['name']}")
        ingestor.metrics.received += 1
        settings = self.settings
        if (self.in_flight >= settings.max_concurrent_requests
                or ingestor.in_flight >= settings.max_concurrent_requests_per_source):
            response = _text(429, "too many concurrent requests; retry later", retry_after_s=RETRY_AFTER_S)
            return self._rejected(ingestor, response, "overloaded", received_at_us, request.content_length or 0, started)
        limit = settings.max_body_bytes
        content_length = request.content_length
        if content_length is not None and content_length > limit:
            return self._rejected(ingestor, _text(413, f"request body exceeds {limit} bytes"), "too_large",
                                  received_at_us, content_length, started)
        # One coroutine for the whole request (this is the hot path): no helper coroutine per call.
        self.in_flight += 1
        ingestor.in_flight += 1
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._rejected(ingestor, _text(413, f"request body exceeds {limit} bytes"), "too_large",
                                  received_at_us, limit, started)
        except web.HTTPException:
            raise
        except Exception:  # noqa: BLE001 - aiohttp's RequestPayloadError: a body that cannot be decoded
            return self._rejected(ingestor, _text(400, "request body could not be read or decoded"),
                                  "invalid_body", received_at_us, content_length or 0, started)
        else:
            size = len(body)
            metrics = ingestor.metrics
            metrics.bytes_received += size
            try:
                rows = len(await ingestor.ingest_rows(list(request.headers.items()), body, received_at_us))
            except WebhookRejected as rejected:
                return self._rejected(ingestor, _text(rejected.status, rejected.message), "invalid_body",
                                      received_at_us, size, started)
            except ServiceUnavailable as unavailable:
                response = _text(503, unavailable.message, retry_after_s=unavailable.retry_after_s)
                return self._rejected(ingestor, response, "unavailable", received_at_us, size, started)
            except HeadraceError as error:
                reason = "invalid_body" if error.http_status == 400 else "unavailable"
                return self._rejected(ingestor, _text(error.http_status, error.message), reason, received_at_us, size,
                                      started)
            latency = time.perf_counter() - started
            metrics.accepted += 1
            metrics.observe_ack(latency)
            ingestor.requests.add(received_at_us, 200, None, size, rows, latency)
            return web.Response(status=200)
        finally:
            self.in_flight -= 1
            ingestor.in_flight -= 1

    @staticmethod
    def _rejected(ingestor: SourceIngestor, response: web.Response, reason: str, received_at_us: int,
                  size: int, started: float) -> web.Response:
        ingestor.metrics.rejected[reason] += 1
        ingestor.requests.add(received_at_us, response.status, reason, size, 0, time.perf_counter() - started)
        return response
