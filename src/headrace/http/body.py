"""Reading a request body in aiohttp with nginx's client_body_timeout: the longest wait between
two reads (aiohttp itself waits for a stalled body for ever)."""

from __future__ import annotations

import asyncio

from aiohttp import web


class BodyTimeout(Exception):
    """The client sent nothing for the body timeout in the middle of a body."""


def request_timeout() -> web.Response:
    """408, and the connection closes (its framing is lost)."""
    response = web.Response(status=408, text="request timed out")
    response.force_close()
    return response


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The (decoded) body; raises web.HTTPRequestEntityTooLarge past `limit` bytes, BodyTimeout."""
    body = bytearray()
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                chunk = await request.content.readany()
        except TimeoutError:
            raise BodyTimeout() from None
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
