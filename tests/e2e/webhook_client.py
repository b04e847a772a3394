"""A minimal blocking webhook sender for end-to-end tests (standard library only)."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass


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
