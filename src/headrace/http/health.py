"""GET /health/live and GET /health/ready (docs/metrics.md, "Health").

/health/live answers 200 while the process serves HTTP at all (a liveness probe: restart the process if not).
/health/ready answers 200 only when every part serves: the server has started and is not stopping, the pipeline
process runs and has a Spark session, the store answers `SELECT 1` within STORE_TIMEOUT_S, and no materialization
is failed or stalled (headrace_internal.materializations). Otherwise 503, with a JSON body naming each part that
is not ready and why:

    {"status": "not ready",
     "not_ready": [{"part": "materialization", "name": "public.orders", "kind": "source", "state": "failed",
                    "reason": "FailPointError: ...", "since": "2026-...Z", "next_retry_at": "2026-...Z"}],
     "parts": {"server": "ready", "pipeline": "running", "store": "ready", "materializations": 3}}

Both are unauthenticated, as /metrics is: a load balancer's probe has no credentials. What they show (object
names, states, one-line errors) is what /metrics already shows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from headrace.http.webhook_endpoint import ServerState

STORE_TIMEOUT_S = 2.0
UNHEALTHY_STATES = ("failed", "stalled")


class Health:
    """What /health/ready checks; the parts are given once they exist (server.py, metrics/setup.py)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.pipeline: Callable[[], dict[str, Any]] | None = None  # PipelineStatus.pipeline
        self.store_ping: Callable[[], object] | None = None  # blocking; raises when the store does not answer
        self.materializations: Callable[[], list[dict[str, Any]]] | None = None  # MaterializationStatus.rows

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        not_ready: list[dict[str, Any]] = []
        parts: dict[str, Any] = {}
        if self.state.stopping:
            not_ready.append({"part": "server", "reason": "shutting down"})
        elif not self.state.ready:
            not_ready.append({"part": "server", "reason": "starting"})
        parts["server"] = "ready" if not not_ready else not_ready[0]["reason"]
        if self.pipeline is None:
            not_ready.append({"part": "pipeline", "reason": "not started yet"})
            parts["pipeline"] = "not started"
        else:
            process = self.pipeline()
            parts["pipeline"] = process["state"]
            if process["state"] != "running":
                not_ready.append({"part": "pipeline", "state": process["state"],
                                  "reason": process.get("last_error") or f"the pipeline process is {process['state']}"})
        if self.store_ping is None:
            not_ready.append({"part": "store", "reason": "not started yet"})
            parts["store"] = "not started"
        else:
            started = time.monotonic()
            try:
                await asyncio.wait_for(asyncio.to_thread(self.store_ping), STORE_TIMEOUT_S)
                parts["store"] = "ready"
            except Exception as exc:  # noqa: BLE001 - whatever the reason, the store does not serve
                reason = f"no answer within {STORE_TIMEOUT_S:g} s" if isinstance(exc, asyncio.TimeoutError) else \
                    (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                not_ready.append({"part": "store", "reason": reason,
                                  "waited_s": round(time.monotonic() - started, 3)})
                parts["store"] = "not ready"
        if self.materializations is not None and parts.get("store") == "ready":
            rows = await asyncio.to_thread(self.materializations)
            parts["materializations"] = len(rows)
            for row in rows:
                if row["state"] in UNHEALTHY_STATES:
                    not_ready.append({
                        "part": "materialization", "name": f"{row['schema']}.{row['name']}", "kind": row["kind"],
                        "materialization": row["materialization"], "state": row["state"],
                        "reason": row["last_error"] if row["state"] == "failed" else
                        f"work pending and no commit for {row['lag_seconds']:.0f} s",
                        "since": _iso(row["last_error_at" if row["state"] == "failed" else "last_commit_at"]),
                        "attempts": row["attempts"], "next_retry_at": _iso(row["next_retry_at"])})
        return not not_ready, {"status": "ready" if not not_ready else "not ready", "not_ready": not_ready,
                               "parts": parts}


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def add_health_routes(app: web.Application, health: Health) -> None:
    async def live(_request: web.Request) -> web.Response:
        return web.json_response({"status": "live"})

    async def ready(_request: web.Request) -> web.Response:
        ok, body = await health.ready()
        return web.json_response(body, status=200 if ok else 503, headers=None if ok else {"Retry-After": "5"})

    app.router.add_get("/health/live", live)
    app.router.add_get("/health/ready", ready)
