"""Which web pages may reach the SQL API: the Origin policy (sans-I/O), then /api/sql and the
WebSocket's handshake driven with aiohttp from outside the server's process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from headrace.errors import HeadraceError
from headrace.http.origin import OriginPolicy, OriginVerdict, normalize_origin
from headrace.http.sql_api import BadRequest, SqlEndpoint, parse_auth_message
from headrace.pgwire.auth import parse_auth_rules
from headrace.pgwire.security import SecurityConfig
from tests.http.http_server import HttpServerProcess

ALLOWED = "https://app.example.com"


def test_origins_are_normalized() -> None:
    assert normalize_origin("HTTPS://App.Example.com") == "https://app.example.com:443"
    assert normalize_origin("http://127.0.0.1:6876") == "http://127.0.0.1:6876"
    assert normalize_origin("http://[::1]:8080") == "http://[::1]:8080"
    for bad in ("null", "ftp://x", "http://u:p@x", "http://x/path", "x", "http://x:99999"):
        assert normalize_origin(bad) is None
    with pytest.raises(ValueError):
        OriginPolicy(["not an origin"])


@pytest.mark.parametrize(("origin", "host", "verdict"), [
    (None, "127.0.0.1:6876", OriginVerdict.NO_ORIGIN),
    ("http://127.0.0.1:6876", "127.0.0.1:6876", OriginVerdict.SAME_ORIGIN),
    ("http://localhost:6876", "localhost:6876", OriginVerdict.SAME_ORIGIN),
    ("http://127.0.0.1:6877", "127.0.0.1:6876", OriginVerdict.REFUSED),  # another port is another origin
    ("https://127.0.0.1:6876", "127.0.0.1:6876", OriginVerdict.REFUSED),  # another scheme too
    ("http://evil.example:6876", "evil.example:6876", OriginVerdict.REFUSED),  # DNS rebinding to loopback
    ("http://evil.example", "127.0.0.1:6876", OriginVerdict.REFUSED),
    ("null", "127.0.0.1:6876", OriginVerdict.REFUSED),
    ("https://app.example.com", "127.0.0.1:6876", OriginVerdict.ALLOWED),
    ("https://app.example.com:443", "127.0.0.1:6876", OriginVerdict.ALLOWED),
])
def test_origin_verdicts(origin: str | None, host: str, verdict: OriginVerdict) -> None:
    assert OriginPolicy([ALLOWED]).check(origin, host, "http") is verdict


def test_a_cross_site_request_never_authenticates_by_trust() -> None:
    endpoint = SqlEndpoint()
    endpoint.security = SecurityConfig(parse_auth_rules("loopback=trust,all=scram-sha-256"))
    endpoint.authenticate("headrace", None, "127.0.0.1")  # a program on the machine: trusted
    with pytest.raises(HeadraceError) as refused:
        endpoint.authenticate("headrace", None, "127.0.0.1", cross_site=True)
    assert refused.value.sqlstate == "28P01" and refused.value.http_status == 401


def test_the_websocket_auth_message() -> None:
    assert parse_auth_message({"user": "u", "password": "p", "options": {"a": 1}}) == ("u", "p", {"a": "1"})
    assert parse_auth_message({}) == ("headrace", None, {})
    for bad in ({"query": "SELECT 1"}, {"queries": []}, {"user": "u", "query": "x"}, ["user"], {"user": 1},
                {"options": []}):
        with pytest.raises(BadRequest):
            parse_auth_message(bad)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpServerProcess]:
    process = HttpServerProcess(tmp_path / "data", ["--allowed-origin", ALLOWED])
    yield process
    process.stop()


async def sql_post(port: int, headers: dict[str, str], body: bytes = b'{"query": "SELECT 1"}',
                   method: str = "POST") -> tuple[int, dict[str, str], str]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"http://127.0.0.1:{port}/api/sql", data=body, headers=headers) as response:
            return response.status, dict(response.headers), await response.text()


def test_sql_api_refuses_cross_site_and_non_json_requests(server: HttpServerProcess) -> None:
    port = server.port
    same_origin = f"http://127.0.0.1:{port}"
    evil = "http://evil.example"

    async def scenario() -> None:
        # A cross-site text/plain POST: sent by any page without a preflight. Refused by Origin.
        status, _, text = await sql_post(port, {"Origin": evil, "Content-Type": "text/plain"})
        assert status == 403 and "evil.example" in json.loads(text)["error"]
        # Even as JSON (which would need a preflight) from a page not listed.
        assert (await sql_post(port, {"Origin": evil, "Content-Type": "application/json"}))[0] == 403
        # Without Origin (a program), only JSON is taken.
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            status, headers, text = await sql_post(port, {"Content-Type": content_type})
            assert status == 415 and headers["Content-Type"].startswith("application/json")
            assert json.loads(text) == {"error": "Content-Type must be application/json"}
        # Same-origin and listed JSON requests get through to the SQL layer (not up in this server: 503).
        assert (await sql_post(port, {"Origin": same_origin, "Content-Type": "application/json"}))[0] == 503
        status, headers, _ = await sql_post(port, {"Origin": ALLOWED, "Content-Type": "application/json"})
        assert status == 503 and headers["Access-Control-Allow-Origin"] == ALLOWED
        # Preflight: answered with CORS headers for a listed origin only.
        preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        status, headers, _ = await sql_post(port, {"Origin": ALLOWED, **preflight}, b"", "OPTIONS")
        assert status == 204 and headers["Access-Control-Allow-Origin"] == ALLOWED
        assert "POST" in headers["Access-Control-Allow-Methods"]
        status, headers, _ = await sql_post(port, {"Origin": evil, **preflight}, b"", "OPTIONS")
        assert status == 403 and "Access-Control-Allow-Origin" not in headers

    asyncio.run(scenario())


def test_websocket_handshake_from_another_origin_is_refused(server: HttpServerProcess) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"http://127.0.0.1:{server.port}/api/experimental/sql",
                                      headers={"Origin": "http://evil.example"})
            assert refused.value.status == 403
            with pytest.raises(aiohttp.WSServerHandshakeError) as starting:  # same-origin passes the check
                await http.ws_connect(f"http://127.0.0.1:{server.port}/api/experimental/sql",
                                      headers={"Origin": f"http://127.0.0.1:{server.port}"})
            assert starting.value.status == 503

    asyncio.run(scenario())
