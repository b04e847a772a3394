"""What a webhook request gets back, whichever HTTP front parsed it (http/fast_ingest.py for the
common case, aiohttp in http/app.py for the rest): the one place that maps outcomes to statuses,
counts them and keeps the request log.

A request goes through `admit` (method, readiness, source, concurrency and size limits: either a
Reply at once or the source's ingestor, counted as in flight), then `submit` (validate and queue
the rows: a Reply, or a future of the rows' log offsets that resolves once they are durable), then
`accepted` or `failed`, and finally `release`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from headrace.errors import HeadraceError, ServiceUnavailable
from headrace.log.group_commit import Settled
from headrace.webhook.handler import Headers, WebhookRejected
from headrace.webhook.ingest import IngestRegistry, SourceIngestor

RETRY_AFTER_S = 1


@dataclass
class ServerState:
    """Whether the server takes webhooks: False while starting and once shutting down."""

    ready: bool = False
    stopping: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer in transport-neutral form (text/plain body)."""

    status: int
    text: str = ""
    retry_after_s: int | None = None
    allow: str | None = None


ACCEPTED = Reply(200)


class WebhookEndpoint:
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

    def admit(self, method: str, database: str, schema: str, name: str, content_length: int | None,
              received_at_us: int, started: float) -> Reply | SourceIngestor:
        """A Reply to send at once, or the source's ingestor (now in flight: `release` it afterwards)."""
        if method != "POST":
            reply = Reply(405, f"method {method} is not allowed; use POST", allow="POST")
            known = self.registry.lookup(database, schema, name)
            if known is None:
                return reply
            known.metrics.received += 1
            return self._rejected(known, reply, "method_not_allowed", received_at_us, 0, started)
        if not self._ready():
            stopping = self._state is not None and self._state.stopping
            return Reply(503, "headrace is shutting down; retry later" if stopping else "headrace is starting; retry later",
                         retry_after_s=RETRY_AFTER_S)
        ingestor = self.registry.lookup(database, schema, name)
        if ingestor is None:
            return Reply(404, f"unknown webhook source {database}.{schema}.{name}")
        ingestor.metrics.received += 1
        settings = self.settings
        if (self.in_flight >= settings.max_concurrent_requests
                or ingestor.in_flight >= settings.max_concurrent_requests_per_source):
            reply = Reply(429, "too many concurrent requests; retry later", retry_after_s=RETRY_AFTER_S)
            return self._rejected(ingestor, reply, "overloaded", received_at_us, content_length or 0, started)
        if content_length is not None and content_length > settings.max_body_bytes:
            return self._rejected(ingestor, self._too_large_reply(), "too_large", received_at_us, content_length, started)
        self.in_flight += 1
        ingestor.in_flight += 1
        return ingestor

    def release(self, ingestor: SourceIngestor) -> None:
        self.in_flight -= 1
        ingestor.in_flight -= 1

    def submit(self, ingestor: SourceIngestor, headers: Sequence[tuple[str, str]], body: bytes, received_at_us: int,
               started: float) -> Reply | asyncio.Future[list[int]]:
        """Validate and queue the request's rows: a Reply at once (rejected, or no rows at all), or a
        future of their log offsets, resolved once durable (then call `accepted` or `failed`)."""
        size = len(body)
        ingestor.metrics.bytes_received += size
        try:
            pending = ingestor.submit(headers, body, received_at_us)
        except (WebhookRejected, HeadraceError) as error:
            return self.failed(ingestor, error, received_at_us, size, started)
        if isinstance(pending, list):
            return self.accepted(ingestor, len(pending), received_at_us, size, started)
        return pending

    def submit_then(self, ingestor: SourceIngestor, headers: Headers, body: bytes,
                    received_at_us: int, started: float, settled: Settled) -> Reply | None:
        """`submit` without a future: a Reply at once, or None when the rows are queued and
        `settled(offsets, error)` will run in the event loop (then call `accepted` or `failed`)."""
        size = len(body)
        ingestor.metrics.bytes_received += size
        try:
            queued = ingestor.submit_then(headers, body, received_at_us, settled)
        except (WebhookRejected, HeadraceError) as error:
            return self.failed(ingestor, error, received_at_us, size, started)
        return None if queued else self.accepted(ingestor, 0, received_at_us, size, started)

    def accepted(self, ingestor: SourceIngestor, rows: int, received_at_us: int, size: int, started: float) -> Reply:
        latency = time.perf_counter() - started
        metrics = ingestor.metrics
        metrics.accepted += 1
        metrics.observe_ack(latency)
        ingestor.requests.add(received_at_us, 200, None, size, rows, latency)
        return ACCEPTED

    def failed(self, ingestor: SourceIngestor, error: BaseException, received_at_us: int, size: int,
               started: float) -> Reply:
        """The Reply for a request whose rows were refused; anything but a known refusal is re-raised."""
        if isinstance(error, WebhookRejected):
            return self._rejected(ingestor, Reply(error.status, error.message), "invalid_body", received_at_us, size,
                                  started)
        if isinstance(error, ServiceUnavailable):
            reply = Reply(503, error.message, retry_after_s=error.retry_after_s)
            return self._rejected(ingestor, reply, "unavailable", received_at_us, size, started)
        if isinstance(error, HeadraceError):
            reason = "invalid_body" if error.http_status == 400 else "unavailable"
            return self._rejected(ingestor, Reply(error.http_status, error.message), reason, received_at_us, size,
                                  started)
        raise error

    def too_large(self, ingestor: SourceIngestor, received_at_us: int, started: float) -> Reply:
        """The body grew over the limit while being read (chunked, or after decompression)."""
        return self._rejected(ingestor, self._too_large_reply(), "too_large", received_at_us,
                              self.settings.max_body_bytes, started)

    def undecodable(self, ingestor: SourceIngestor, received_at_us: int, size: int, started: float) -> Reply:
        return self._rejected(ingestor, Reply(400, "request body could not be read or decoded"), "invalid_body",
                              received_at_us, size, started)

    def _too_large_reply(self) -> Reply:
        return Reply(413, f"request body exceeds {self.settings.max_body_bytes} bytes")

    @staticmethod
    def _rejected(ingestor: SourceIngestor, reply: Reply, reason: str, received_at_us: int, size: int,
                  started: float) -> Reply:
        ingestor.metrics.rejected[reason] += 1
        ingestor.requests.add(received_at_us, reply.status, reason, size, 0, time.perf_counter() - started)
        return reply
