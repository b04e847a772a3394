"""The console's files as the HTTP port serves them: the page at /, its modules under /console/, nothing else, and
headers that keep the page to its own origin (a real aiohttp server on a free port)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from headrace.console import CONTENT_SECURITY_POLICY, STATIC_FILES, add_console_routes


def with_console(scenario: Callable[[str], Awaitable[None]]) -> None:
    """Run `scenario(base_url)` against the console's routes on a real aiohttp server."""
    async def run() -> None:
        app = web.Application()
        add_console_routes(app)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            await scenario(f"http://127.0.0.1:{server.port}")
        finally:
            await server.close()

    asyncio.run(run())


def test_index_and_every_module_it_imports_are_served() -> None:
    with_console(_index_and_modules)


def test_only_shipped_files_are_served() -> None:
    with_console(_only_shipped)


async def _index_and_modules(console_url: str) -> None:
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{console_url}/") as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/html; charset=utf-8"
            assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            assert response.headers["X-Frame-Options"] == "DENY"
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            page = await response.text()
        assert '<script type="module" src="/console/js/app.js">' in page
        # Every relative import of every module resolves to a shipped file, served as JavaScript.
        for path in [name for name in STATIC_FILES if name.endswith(".js")]:
            text = STATIC_FILES[path].decode()
            folder = path.rsplit("/", 1)[0]
            for target in re.findall(r'from "(\.{1,2}/[^"]+)"', text):
                resolved = _resolve(folder, target)
                assert resolved in STATIC_FILES, f"{path} imports {target}, which is not shipped"
            async with client.get(f"{console_url}/console/{path}") as response:
                assert response.status == 200
                assert response.headers["Content-Type"] == "text/javascript; charset=utf-8"
                assert await response.read() == STATIC_FILES[path]


async def _only_shipped(console_url: str) -> None:
    async with aiohttp.ClientSession() as client:
        for path in ("/console/nothing.js", "/console/../__init__.py", "/console/%2e%2e/__init__.py",
                     "/console/js/../../__init__.py", "/console/static/index.html"):
            async with client.get(f"{console_url}{path}") as response:
                assert response.status == 404, path
                assert "__future__" not in await response.text()


def test_no_module_writes_html_from_data() -> None:
    """Names, SQL and errors are user data: the modules build the page with text nodes, never innerHTML."""
    for path, body in STATIC_FILES.items():
        if path.endswith(".js"):
            text = body.decode()
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
                assert sink not in text, f"{path} uses {sink}"


def _resolve(folder: str, target: str) -> str:
    parts = folder.split("/") if folder else []
    for piece in target.split("/"):
        if piece == "..":
            parts.pop()
        elif piece != ".":
            parts.append(piece)
    return "/".join(parts)
