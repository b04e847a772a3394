"""A statement's cancel: the event a CancelRequest, statement_timeout or a client going away sets.

`CancelSignal` is an asyncio.Event that also calls back when set, so a statement running elsewhere (on the store
PostgreSQL's backend) reacts to a cancel without a task waiting for the event: a task and an asyncio.wait per
statement cost a passthrough statement about a tenth of headrace's share of it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class CancelSignal(asyncio.Event):
    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], object]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def _add(self, callback: Callable[[], object]) -> Callable[[], None]:
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)
        return remove


def when_set(event: asyncio.Event, callback: Callable[[], object]) -> Callable[[], None]:
    """Call `callback` once `event` is set (at once if it is); returns what stops waiting for it. A plain
    asyncio.Event is waited on by a task."""
    if event.is_set():
        callback()
        return lambda: None
    if isinstance(event, CancelSignal):
        return event._add(callback)  # noqa: SLF001 - the module's own class
    waiter = asyncio.ensure_future(event.wait())
    waiter.add_done_callback(lambda done: None if done.cancelled() else callback())
    return waiter.cancel
