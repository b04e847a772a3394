"""Settings of the HTTP port (`headrace up --http-...`, docs/settings.md): timeouts with nginx's
defaults as the reference, and the Origins allowed to use the SQL API from a browser."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HttpSettings:
    # nginx's client_header_timeout: a request head must arrive whole within this (slowloris).
    header_timeout_s: float = 60.0
    # nginx's client_body_timeout: the longest wait between two reads of a request body.
    body_timeout_s: float = 60.0
    # nginx's keepalive_timeout: an idle keep-alive connection (no request pending) is closed after this.
    keepalive_timeout_s: float = 75.0
    # Origins (scheme://host[:port]) whose pages may use /api/sql and the WebSocket besides same-origin ones.
    allowed_origins: tuple[str, ...] = ()
    # After answering a request whose body is not read (413), keep reading and discarding what the
    # client still sends, so it gets the answer rather than a reset (nginx's lingering_close):
    # at most lingering_time in all, lingering_timeout between reads, and this many bytes.
    lingering_time_s: float = 30.0
    lingering_timeout_s: float = 5.0
    lingering_max_bytes: int = 64 << 20
