"""The HTTP transport for webhook sources (aiohttp). Thin on purpose: validation and durability live
in headrace.webhook; this maps URLs to sources and outcomes to status codes.

POST /api/webhook/{database}/{schema}/{name} -> 200 (empty body) once the request is durable.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from headrace.errors import HeadraceError, ServiceUnavailable
from headrace.webhook.handler import WebhookRejected
from headrace.webhook.ingest import IngestRegistry

MAX_BODY_BYTES = 5 << 20  # as Materialize: bigger requests get 413
WEBHOOK_ROUTE = "/api/webhook/{database}/{schema}/{name}"
_REGISTRY: web.AppKey[IngestRegistry] = web.AppKey("headrace_ingest_registry", IngestRegistry)
_READY: web.AppKey[Callable[[], bool]] = web.AppKey("headrace_ready", Callable[[], bool])  # type: ignore[arg-type]


def make_app(registry: IngestRegistry, *, ready: Callable[[], bool] = lambda: True) -> web.Application:
    """`ready` says whether the server takes requests yet (503 + Retry-After until it does)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[_REGISTRY] = registry
    app[_READY] = ready
    app.router.add_route("*", WEBHOOK_ROUTE, _webhook)
    return app


async def run_http(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start serving `app` on host:port (port 0 picks a free one: see runner.addresses)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def _text(status: int, message: str, *, retry_after_s: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return web.Response(status=status, text=message, headers=headers)


async def _webhook(request: web.Request) -> web.StreamResponse:
    received_at_us = time.time_ns() // 1000  # arrival time, before the body is even read
    if request.method != "POST":
        return web.Response(status=405, text=f"method {request.method} is not allowed; use POST",
                            headers={"Allow": "POST"})
    if not request.app[_READY]():
        return _text(503, "headrace is starting; retry later", retry_after_s=1)
    # aiohttp has percent-decoded the path segments already.
    database, schema, name = (request.match_info[part] for part in ("database", "schema", "name"))
    ingestor = request.app[_REGISTRY].lookup(database, schema, name)
    if ingestor is None:
        return _text(404, f"unknown webhook source {database}.{schema}.{name}")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        return _text(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    try:
        body = await request.read()  # enforces client_max_size for chunked bodies too
    except web.HTTPRequestEntityTooLarge:
        return _text(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    headers = list(request.headers.items())
    try:
        await ingestor.ingest(headers, body, received_at_us)
    except WebhookRejected as rejected:
        return _text(rejected.status, rejected.message)
    except ServiceUnavailable as unavailable:
        return _text(503, unavailable.message, retry_after_s=unavailable.retry_after_s)
    except HeadraceError as error:
        return _text(error.http_status, error.message)
    return web.Response(status=200)
