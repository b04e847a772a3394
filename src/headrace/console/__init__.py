"""The web console: static files served at `/` on the HTTP port (docs/console.md).

The files hold no data and no credentials: every figure the console shows comes from the system relations
(`headrace_internal.*`, `pg_catalog`, SHOW) through the HTTP SQL API's WebSocket (`/api/experimental/sql`), which
authenticates each socket by the same rules as pgwire (http/sql_api.py). So the console sees exactly what its role
may see over the SQL API, nothing private.

GET /                     the console's page (index.html)
GET /console/<file>       its scripts and style sheet (only the files shipped in static/)

Every answer carries a Content-Security-Policy that lets the page load and connect only to its own origin (no
inline script, nothing fetched from elsewhere), is never framed (clickjacking) and is not cached past a restart
(an upgraded headrace serves upgraded files)."""

from __future__ import annotations

from importlib import resources
from pathlib import PurePosixPath

from aiohttp import web

__all__ = ["CONTENT_SECURITY_POLICY", "STATIC_FILES", "add_console_routes"]

CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
                    "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def _shipped_files() -> dict[str, bytes]:
    """Every file under static/ by its path there (read once: a handful of small files)."""
    files: dict[str, bytes] = {}

    def walk(folder: resources.abc.Traversable, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
            elif PurePosixPath(entry.name).suffix in CONTENT_TYPES:
                files[prefix + entry.name] = entry.read_bytes()

    walk(resources.files(__package__) / "static", "")
    return files


STATIC_FILES = _shipped_files()


def _answer(path: str) -> web.Response:
    body = STATIC_FILES.get(path)
    if body is None:
        raise web.HTTPNotFound(text="no such console file", headers=SECURITY_HEADERS)
    content_type = CONTENT_TYPES[PurePosixPath(path).suffix]
    return web.Response(body=body, headers={"Content-Type": content_type, **SECURITY_HEADERS})


async def _index(_request: web.Request) -> web.Response:
    return _answer("index.html")


async def _static(request: web.Request) -> web.Response:
    return _answer(request.match_info["path"])  # a lookup in STATIC_FILES: no path reaches the file system


def add_console_routes(app: web.Application) -> None:
    app.router.add_get("/", _index)
    app.router.add_get("/console/{path:.+}", _static)
