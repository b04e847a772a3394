"""Status codes that depend on settings and load (413, 429, 503 while starting and stopping),
compressed bodies, /metrics and the request log, against a real aiohttp server and real logs."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from headrace.http.app import ServerState, make_app, run_http
from headrace.log.group_commit import Settled
from headrace.log.segments import SegmentedLog
from headrace.webhook.ingest import IngestRegistry, IngestSettings
from tests.http.test_webhook_http import logged, run, webhook_source


async def start(registry: IngestRegistry, state: ServerState | None = None) -> tuple[aiohttp.web.AppRunner, str]:
    runner = await run_http(make_app(registry, ready=state or ServerState(ready=True)), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def test_gzip_and_deflate_bodies_are_decoded(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("orders", key="body->>'id'"), tmp_path / "u1")
        runner, base = await start(registry)
        url = f"{base}/api/webhook/headrace/public/orders"
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            async with http.post(url, data=gzip.compress(b'{"id": "g"}'), headers={"Content-Encoding": "gzip"}) as r:
                assert r.status == 200
            async with http.post(url, data=zlib.compress(b'{"id": "d"}'), headers={"Content-Encoding": "deflate"}) as r:
                assert r.status == 200
            async with http.post(url, data=b"not gzip at all", headers={"Content-Encoding": "gzip"}) as r:
                assert r.status == 400
        await runner.cleanup()
        await registry.close_all()
        assert [record.body for record in logged(tmp_path / "u1")] == [b'{"id": "g"}', b'{"id": "d"}']

    run(scenario)


def test_body_limit_is_a_setting_and_applies_after_decompression(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry(IngestSettings(max_body_bytes=1000))
        registry.add(webhook_source("orders"), tmp_path / "u1")
        runner, base = await start(registry)
        url = f"{base}/api/webhook/headrace/public/orders"
        big = b'{"pad": "' + b"x" * 2000 + b'"}'
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=big) as response:
                assert response.status == 413
            bomb = gzip.compress(big)
            assert len(bomb) < 1000
            async with http.post(url, data=bomb, headers={"Content-Encoding": "gzip"}) as response:
                assert response.status == 413
            async with http.post(url, data=b'{"small": true}') as response:
                assert response.status == 200
        await runner.cleanup()
        await registry.close_all()

    run(scenario)


def test_concurrency_limits_answer_429_with_retry_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        registry = IngestRegistry(IngestSettings(max_concurrent_requests=10, max_concurrent_requests_per_source=2))
        ingestor = registry.add(webhook_source("orders"), tmp_path / "u1")
        registry.add(webhook_source("other", source_id="u2"), tmp_path / "u2")
        release = asyncio.Event()
        original = ingestor.submit

        def slow(*args: object) -> asyncio.Future[list[int]]:
            async def later() -> list[int]:
                await release.wait()
                pending = original(*args)  # type: ignore[arg-type]
                return pending if isinstance(pending, list) else await pending

            return asyncio.ensure_future(later())  # durable only once released

        original_then = ingestor.submit_then

        def slow_then(headers: Any, body: bytes, received_at_us: int, settled: Settled) -> bool:
            async def later() -> None:
                await release.wait()
                if not original_then(headers, body, received_at_us, settled):
                    settled([], None)

            pending.append(asyncio.ensure_future(later()))  # durable only once released
            return True

        pending: list[asyncio.Future[None]] = []
        monkeypatch.setattr(ingestor, "submit", slow)  # aiohttp's route
        monkeypatch.setattr(ingestor, "submit_then", slow_then)  # the fast path's
        runner, base = await start(registry)
        async with aiohttp.ClientSession() as http:
            held = [asyncio.create_task(http.post(f"{base}/api/webhook/headrace/public/orders", data=b"{}"))
                    for _ in range(2)]
            await asyncio.sleep(0.2)
            async with http.post(f"{base}/api/webhook/headrace/public/orders", data=b"{}") as response:
                assert response.status == 429
                assert response.headers["Retry-After"] == "1"
            async with http.post(f"{base}/api/webhook/headrace/public/other", data=b"{}") as response:
                assert response.status == 200  # another source still has room
            release.set()
            for task in held:
                response = await task
                assert response.status == 200
                response.release()
        assert ingestor.metrics.rejected["overloaded"] == 1
        await runner.cleanup()
        await registry.close_all()

    run(scenario)


def test_503_while_starting_and_while_shutting_down(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        registry.add(webhook_source("orders"), tmp_path / "u1")
        state = ServerState()
        runner, base = await start(registry, state)
        url = f"{base}/api/webhook/headrace/public/orders"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=b"{}") as response:
                assert (response.status, response.headers["Retry-After"]) == (503, "1")
                assert "starting" in await response.text()
            state.ready = True
            async with http.post(url, data=b"{}") as response:
                assert response.status == 200
            state.stopping = True
            async with http.post(url, data=b"{}") as response:
                assert response.status == 503
                assert "shutting down" in await response.text()
        await runner.cleanup()
        await registry.close_all()

    run(scenario)


def test_a_failing_disk_never_gets_a_200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        ingestor = registry.add(webhook_source("orders", key="body->>'id'"), tmp_path / "u1")
        runner, base = await start(registry)
        url = f"{base}/api/webhook/headrace/public/orders"

        def full_disk(self: SegmentedLog, payloads: object) -> list[int]:
            raise OSError(28, "No space left on device")

        async with aiohttp.ClientSession() as http:
            monkeypatch.setattr(SegmentedLog, "append_offsets", full_disk)
            statuses = await asyncio.gather(*(http.post(url, data=b'{"id": %d}' % n) for n in range(20)))
            assert {response.status for response in statuses} == {503}
            assert all(response.headers["Retry-After"] == "1" for response in statuses)
            monkeypatch.undo()
            async with http.post(url, data=b'{"id": 1}') as response:
                assert response.status == 200  # the write was cut back: the log takes writes again
        assert ingestor.metrics.rejected["unavailable"] == 20
        await runner.cleanup()
        await registry.close_all()
        assert [record.body for record in logged(tmp_path / "u1")] == [b'{"id": 1}']

    run(scenario)


def test_metrics_endpoint_and_request_log(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry(IngestSettings(request_log_size=3))
        ingestor = registry.add(webhook_source("orders", key="body->>'id'"), tmp_path / "u1")
        runner, base = await start(registry)
        url = f"{base}/api/webhook/headrace/public/orders"
        async with aiohttp.ClientSession() as http:
            for body in (b'{"id": 1}', b'{"id": 1}', b'{"id": 1, "v": 2}', b"{broken", b'{"id": 2}'):
                async with http.post(url, data=body) as response:
                    await response.read()
            async with http.get(f"{base}/metrics") as response:
                assert response.status == 200
                text = await response.text()
        samples = {(sample.name, sample.labels.get("reason")): sample.value
                   for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.labels.get("source") == "orders"}
        assert samples[("headrace_webhook_requests_received_total", None)] == 5
        assert samples[("headrace_webhook_requests_accepted_total", None)] == 4
        assert samples[("headrace_webhook_rows_duplicate_total", None)] == 1
        assert samples[("headrace_webhook_rows_replaced_total", None)] == 1
        assert samples[("headrace_webhook_requests_rejected_total", "invalid_body")] == 1
        assert samples[("headrace_webhook_ack_latency_seconds_count", None)] == 4
        entries = ingestor.requests.entries()
        assert [(status, reason, size) for _, status, reason, size, _, _ in entries] == [
            (200, None, 17), (400, "invalid_body", 7), (200, None, 9)]  # the last 3 only
        await runner.cleanup()
        await registry.close_all()

    run(scenario)
