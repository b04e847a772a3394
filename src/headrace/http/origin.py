"""Which web pages may use the SQL API (/api/sql and the WebSocket), sans-I/O.

A browser adds an Origin header to every cross-site POST and to every WebSocket handshake; a
program (curl, a driver) sends none. So:
- no Origin: not a browser, the request goes on (authenticated as any other);
- same-origin (the Origin's host:port is the Host header's) passes, but only when the Host is an IP
  address or localhost: a page on attacker.example that rebinds its DNS name to 127.0.0.1 sends
  same-origin requests with `Host: attacker.example`, and those must not count;
- an Origin listed with `headrace up --http-allowed-origin` passes, as a cross-site request: it
  never authenticates by trust (a password is required), so a listed page cannot act as the
  trusted loopback superuser;
- any other Origin (including "null", sent by sandboxed pages and file: URLs) is refused 403.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class OriginVerdict(enum.Enum):
    NO_ORIGIN = "no origin"  # not from a browser
    SAME_ORIGIN = "same origin"
    ALLOWED = "allowed cross-site origin"
    REFUSED = "refused"

    @property
    def passes(self) -> bool:
        return self is not OriginVerdict.REFUSED

    @property
    def cross_site(self) -> bool:
        return self in (OriginVerdict.ALLOWED, OriginVerdict.REFUSED)


def normalize_origin(origin: str) -> str | None:
    """scheme://host:port, lower-cased, with the scheme's default port made explicit; None if
    `origin` is not a serialized origin (a path, user info, a query or an unknown scheme)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = parts.hostname
    if scheme not in ("http", "https") or not host or parts.username is not None or parts.password is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    if port is None:
        port = _DEFAULT_PORTS[scheme]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def _host_and_port(host_header: str, scheme: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(f"//{host_header.strip()}")
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if not host:
        return None
    return host, port if port is not None else _DEFAULT_PORTS.get(scheme, 80)


def _is_address_or_localhost(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class OriginPolicy:
    def __init__(self, allowed: Iterable[str] = ()) -> None:
        normalized = []
        for origin in allowed:
            value = normalize_origin(origin)
            if value is None:
                raise ValueError(f"invalid origin {origin!r}: expected scheme://host[:port], e.g. https://app.example.com")
            normalized.append(value)
        self.allowed = frozenset(normalized)

    def check(self, origin: str | None, host_header: str | None, scheme: str) -> OriginVerdict:
        """`scheme` is the request's own (http or https)."""
        if origin is None:
            return OriginVerdict.NO_ORIGIN
        normalized = normalize_origin(origin)
        if normalized is None:
            return OriginVerdict.REFUSED
        if normalized in self.allowed:
            return OriginVerdict.ALLOWED
        target = _host_and_port(host_header, scheme) if host_header else None
        origin_parts = urlsplit(normalized)
        if (target is not None and (origin_parts.hostname, origin_parts.port) == target
                and origin_parts.scheme == scheme and _is_address_or_localhost(target[0])):
            return OriginVerdict.SAME_ORIGIN
        return OriginVerdict.REFUSED
