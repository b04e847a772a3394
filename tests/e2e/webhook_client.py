"""Webhook senders for end-to-end tests: a minimal blocking one (standard library only) and a concurrent one."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Response:
    status_code: int
    text: str


def post_webhook(url: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 30) -> Response:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json",
                                                                             **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Response(response.status, response.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        return Response(error.code, error.read().decode("utf-8", "replace"))


async def post_all_acknowledged(url: str, bodies: list[dict[str, Any]], timeout: float = 20) -> list[bool]:
    """POST every JSON body concurrently; True where the server answered 200 (acknowledged: durable), False where
    it answered otherwise or died under the request (fault tests re-send those)."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        async def post(payload: dict[str, Any]) -> bool:
            try:
                async with http.post(url, data=json.dumps(payload),
                                     headers={"Content-Type": "application/json"}) as response:
                    return response.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return False
        return list(await asyncio.gather(*(post(body) for body in bodies)))
