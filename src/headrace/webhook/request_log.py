"""The last N requests of each source, for debugging a sender: when, what status, why, how big.

Never a body, never a header: a rejected request may carry a wrong secret or a payload its sender
did not mean to deliver, and headers carry signatures."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import Any

# (received_at_us, status, reason or None, body bytes, rows, latency in ms)
RequestEntry = tuple[int, int, str | None, int, int, float]

REQUEST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("database", "VARCHAR"), ("schema", "VARCHAR"), ("source", "VARCHAR"),
    ("received_at", "TIMESTAMPTZ"), ("status", "INTEGER"), ("reason", "VARCHAR"),
    ("size_bytes", "BIGINT"), ("rows", "INTEGER"), ("latency_ms", "DOUBLE"),
)


class RequestLog:
    __slots__ = ("_entries",)

    def __init__(self, size: int) -> None:
        self._entries: collections.deque[RequestEntry] = collections.deque(maxlen=max(0, size))

    def add(self, received_at_us: int, status: int, reason: str | None, size_bytes: int, rows: int,
            latency_s: float) -> None:
        self._entries.append((received_at_us, status, reason, size_bytes, rows, latency_s * 1000))

    def entries(self) -> list[RequestEntry]:
        return list(self._entries)


def request_rows(logs: Iterable[tuple[tuple[str, str, str], RequestLog]]) -> Iterator[tuple[Any, ...]]:
    """Rows in REQUEST_COLUMNS order; received_at in microseconds since the epoch."""
    for (database, schema, name), log in logs:
        for received_at_us, status, reason, size, rows, latency_ms in log.entries():
            yield database, schema, name, received_at_us, status, reason, size, rows, latency_ms
