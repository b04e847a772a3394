"""Streaming cursors: FETCH over a portal whose statement streams (seed 004's Subscribing).

A SubscriptionBuffer pumps the stream's batches into a queue from a task of its own, so FETCH can
wait with a timeout (or for a cancel) without ever cancelling the stream's iterator mid-step:

    buffer = SubscriptionBuffer(subscribing)
    rows = await buffer.take(count=100, timeout_s=1.0, cancel=event)  # [] after 1 s of nothing
    rows = await buffer.take(count=100, timeout_s=None, cancel=event)  # waits for >= 1 row
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

from headrace.coordinator.responses import Column, Subscribing
from headrace.errors import HeadraceError, QueryCanceled

Row = tuple[Any, ...]


class SubscriptionBuffer:
    def __init__(self, subscribing: Subscribing, max_buffered_batches: int = 64) -> None:
        self.columns: tuple[Column, ...] = subscribing.columns
        self._subscribing = subscribing
        self._rows: collections.deque[Row] = collections.deque()
        self._queue: asyncio.Queue[Sequence[Row] | BaseException | None] = asyncio.Queue(max_buffered_batches)
        self._finished = False  # the stream ended (or failed); what is buffered still comes out
        self._error: BaseException | None = None
        self._pump = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            async for batch in self._subscribing.batches:
                if batch:
                    await self._queue.put(batch)  # back-pressure: a slow FETCHer slows the stream
            await self._queue.put(None)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # delivered to the next FETCH
            await self._queue.put(exc)

    @property
    def finished(self) -> bool:
        return self._finished and not self._rows and self._queue.empty()

    def _absorb(self, item: Sequence[Row] | BaseException | None) -> None:
        if item is None:
            self._finished = True
        elif isinstance(item, BaseException):
            self._finished = True
            self._error = item
        else:
            self._rows.extend(item)

    def _drain_ready(self) -> None:
        while not self._queue.empty():
            self._absorb(self._queue.get_nowait())

    async def take(self, count: int | None, timeout_s: float | None, cancel: asyncio.Event) -> list[Row]:
        """Up to `count` rows (None: all that are ready). Waits for the first row up to `timeout_s`
        (None: until one arrives or the stream ends); then takes only what is already there."""
        self._drain_ready()
        if not self._rows and not self._finished and timeout_s != 0:
            getter = asyncio.ensure_future(self._queue.get())
            cancelled = asyncio.ensure_future(cancel.wait())
            try:
                done, _ = await asyncio.wait({getter, cancelled}, timeout=timeout_s,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                cancelled.cancel()
            if getter in done:
                self._absorb(getter.result())
            else:
                getter.cancel()  # a Queue.get cancelled before it got an item loses nothing
                if cancelled in done:
                    raise QueryCanceled("canceling statement due to user request")
            self._drain_ready()
        if not self._rows and self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, HeadraceError):
                raise error
            raise HeadraceError(f"subscription failed: {error}", sqlstate="XX000")
        taken = len(self._rows) if count is None else min(count, len(self._rows))
        return [self._rows.popleft() for _ in range(taken)]

    def close(self) -> None:
        self._pump.cancel()
        self._subscribing.cancel()


def parse_timeout(text: str | None) -> float | None:
    """FETCH's timeout option: an interval such as '1s', '500ms', '2 minutes' or a number of
    seconds; None when absent."""
    if text is None:
        return None
    value = text.strip().lower()
    units = (("milliseconds", 0.001), ("millisecond", 0.001), ("ms", 0.001), ("minutes", 60.0),
             ("minute", 60.0), ("min", 60.0), ("m", 60.0), ("seconds", 1.0), ("second", 1.0),
             ("sec", 1.0), ("s", 1.0), ("hours", 3600.0), ("hour", 3600.0), ("h", 3600.0))
    for suffix, factor in units:
        if value.endswith(suffix):
            number = value[: -len(suffix)].strip()
            break
    else:
        number, factor = value, 1.0
    try:
        seconds = float(number) * factor
    except ValueError:
        raise HeadraceError(f'invalid input syntax for type interval: "{text}"', sqlstate="22007") from None
    if seconds < 0:
        raise HeadraceError("timeout must not be negative", sqlstate="22023")
    return seconds


# ---------------------------------------------------------------------------------------------- scrolling

FORWARD, BACKWARD, ABSOLUTE, RELATIVE = "forward", "backward", "absolute", "relative"


class ScrollRows:
    """A cursor over rows held in memory (every cursor but a SUBSCRIBE's: its query's rows come whole from the
    serving store), positioned as PostgreSQL positions a cursor: 0 before the first row, 1..n on a row, n + 1 after
    the last. `fetch` answers FETCH and MOVE in every direction PostgreSQL has: NEXT / FORWARD [n | ALL], PRIOR /
    BACKWARD [n | ALL], FIRST / LAST / ABSOLUTE n, RELATIVE n (count None: ALL)."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = list(rows)
        self.position = 0

    def needs_backward(self, direction: str, count: int | None) -> bool:
        """Whether PostgreSQL would have to scan backward for this FETCH (refused for a NO SCROLL cursor): any
        backward move, a re-fetch of the current row (FORWARD 0, RELATIVE 0), an ABSOLUTE at or before it."""
        on_row = 1 <= self.position <= len(self.rows)
        if direction in (FORWARD, BACKWARD, RELATIVE) and count == 0:
            return on_row
        if direction == FORWARD:
            return False
        if direction == RELATIVE:
            return count is not None and count < 0
        if direction == ABSOLUTE:
            return count is None or count <= self.position
        return True

    def fetch(self, direction: str, count: int | None) -> list[Row]:
        total = len(self.rows)
        if direction in (FORWARD, BACKWARD) and count == 0:
            direction, count = RELATIVE, 0  # FETCH FORWARD 0 / BACKWARD 0: the current row again
        if direction == FORWARD:
            taken = self.rows[self.position:] if count is None else self.rows[self.position:self.position + count]
            ran_out = count is None or len(taken) < count
            self.position = total + 1 if ran_out else self.position + count  # type: ignore[operator]
            return taken
        if direction == BACKWARD:
            start = 0 if count is None else max(self.position - 1 - count, 0)
            taken = self.rows[start:max(self.position - 1, 0)][::-1]
            ran_out = count is None or len(taken) < count
            self.position = 0 if ran_out else self.position - count  # type: ignore[operator]
            return taken
        assert count is not None
        if direction == ABSOLUTE:
            target = count if count >= 0 else total + 1 + count
        else:  # RELATIVE
            target = self.position + count
        if target < 1:
            self.position = 0
            return []
        if target > total:
            self.position = total + 1
            return []
        self.position = target
        return [self.rows[target - 1]]
