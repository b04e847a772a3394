"""The webhook HTTP endpoint against a real aiohttp server, a real registry and real logs."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from headrace.catalog.items import WebhookSource
from headrace.http.app import MAX_BODY_BYTES, make_app, run_http
from headrace.log.reader import read_records, scan_end
from headrace.webhook.ingest import IngestRegistry
from headrace.webhook.record import WebhookRecord, decode


def webhook_source(name: str, *, key: str | None = None, include_headers: bool = False, source_id: str = "u1") -> WebhookSource:
    return WebhookSource(id=source_id, name=name, body_format="json", include_headers=include_headers,
                         idempotent_expr=key, create_sql=f"CREATE SOURCE {name} FROM WEBHOOK BODY FORMAT JSON")


def logged(log_dir: Path) -> list[WebhookRecord]:
    return [decode(payload) for _, payload in read_records(log_dir, 0, scan_end(log_dir, 0))]


@asynccontextmanager
async def serving(registry: IngestRegistry, ready: Callable[[], bool] = lambda: True) -> AsyncIterator[str]:
    runner = await run_http(make_app(registry, ready=ready), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/api/webhook"
    finally:
        await runner.cleanup()
        await registry.close_all()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def test_accepted_request_is_in_the_log_when_the_200_arrives(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("orders", key="body->>'id'"), tmp_path / "u1")
        async with serving(registry) as base, aiohttp.ClientSession() as session:
            async with session.post(f"{base}/headrace/public/orders", data=b'{"id": 7, "total": 9.50}') as response:
                assert response.status == 200
                assert await response.read() == b""
            # No flush or close in between: the 200 itself means the record is durable and readable.
            [record] = logged(tmp_path / "u1")
            assert record.body_text == '{"id": 7, "total": 9.50}'
            assert record.idempotency_key == "7"
            assert record.headers is None

    run(scenario)


def test_keys_from_headers_and_body_and_included_headers(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("by_header", key="headers->>'idempotency-key'", source_id="u1"), tmp_path / "u1")
        registry.add(webhook_source("by_body", key="(body->'event'->>'id') || ':' || (body->>'type')",
                                    include_headers=True, source_id="u2"), tmp_path / "u2")
        async with serving(registry) as base, aiohttp.ClientSession() as session:
            headers = {"Idempotency-Key": "abc-123", "X-Trace": "t1"}
            async with session.post(f"{base}/headrace/public/by_header", json={"n": 1}, headers=headers) as response:
                assert response.status == 200
            body = {"event": {"id": "e9"}, "type": "paid"}
            async with session.post(f"{base}/headrace/public/by_body", json=body, headers=headers) as response:
                assert response.status == 200
            async with session.post(f"{base}/headrace/public/by_header", json={"n": 2}) as response:
                assert response.status == 400
                assert await response.text() == "idempotency key is null"
        [by_header] = logged(tmp_path / "u1")
        assert by_header.idempotency_key == "abc-123" and by_header.headers is None
        [by_body] = logged(tmp_path / "u2")
        assert by_body.idempotency_key == "e9:paid"
        assert by_body.headers is not None
        assert by_body.headers["idempotency-key"] == "abc-123" and by_body.headers["x-trace"] == "t1"

    run(scenario)


def test_error_statuses(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("events"), tmp_path / "u1")
        async with serving(registry) as base, aiohttp.ClientSession() as session:
            url = f"{base}/headrace/public/events"
            async with session.post(f"{base}/headrace/public/nope", data=b"{}") as response:
                assert response.status == 404
                assert await response.text() == "unknown webhook source headrace.public.nope"
            async with session.post(url, data=b"not json") as response:
                assert response.status == 400
                assert (await response.text()).startswith("request body is not valid JSON")
            async with session.post(url, data=b"") as response:
                assert response.status == 400
            async with session.post(url, data=b'"\xff"') as response:
                assert response.status == 400
                assert "UTF-8" in await response.text()
            async with session.get(url) as response:
                assert response.status == 405
                assert response.headers["Allow"] == "POST"
            async with session.post(url, data=b"[" + b" " * MAX_BODY_BYTES + b"]") as response:
                assert response.status == 413

            async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the cap holds while reading
                for _ in range(6):
                    yield b" " * (1 << 20)

            async with session.post(url, data=chunked()) as response:
                assert response.status == 413
            async with session.post(url, data=b"[" + b" " * (MAX_BODY_BYTES - 2) + b"]") as response:
                assert response.status == 200  # exactly at the cap is fine
        [accepted] = logged(tmp_path / "u1")  # only the request at the cap got through
        assert len(accepted.body_text) == MAX_BODY_BYTES

    run(scenario)


def test_not_ready_is_503_with_retry_after(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("events"), tmp_path / "u1")
        ready = False
        async with serving(registry, ready=lambda: ready) as base, aiohttp.ClientSession() as session:
            async with session.post(f"{base}/headrace/public/events", json={}) as response:
                assert response.status == 503
                assert response.headers["Retry-After"] == "1"
            ready = True
            async with session.post(f"{base}/headrace/public/events", json={}) as response:
                assert response.status == 200

    run(scenario)


def test_names_in_the_url_are_percent_decoded(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        source = WebhookSource(id="u1", name="my events", body_format="json", include_headers=False,
                               idempotent_expr=None, create_sql="", schema="ünicode")
        registry.add(source, tmp_path / "u1")
        async with serving(registry) as base, aiohttp.ClientSession() as session:
            url = f"{base}/headrace/%C3%BCnicode/my%20events"
            async with session.post(aiohttp.client.URL(url, encoded=True), json=[1]) as response:
                assert response.status == 200

    run(scenario)


def test_write_failure_is_503_with_retry_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("events"), tmp_path / "u1")
        async with serving(registry) as base, aiohttp.ClientSession() as session:
            monkeypatch.setattr(os, "fdatasync", lambda fd: (_ for _ in ()).throw(OSError(5, "Input/output error")))
            async with session.post(f"{base}/headrace/public/events", json={}) as response:
                assert response.status == 503
                assert response.headers["Retry-After"] == "1"
                assert "could not write the source's log" in await response.text()
            monkeypatch.undo()

    run(scenario)


def test_concurrent_requests_are_all_durable(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("events", key="body->>'n'"), tmp_path / "u1")
        async with serving(registry) as base, aiohttp.ClientSession() as session:
            async def post(n: int) -> int:
                async with session.post(f"{base}/headrace/public/events", json={"n": n}) as response:
                    return response.status

            statuses = await asyncio.gather(*(post(n) for n in range(200)))
            assert statuses == [200] * 200
            keys = sorted(int(r.idempotency_key or "-1") for r in logged(tmp_path / "u1"))
            assert keys == list(range(200))
            assert all(json.loads(r.body_text) == {"n": int(r.idempotency_key or "")} for r in logged(tmp_path / "u1"))

    run(scenario)
