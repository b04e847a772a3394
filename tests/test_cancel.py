"""A statement's cancel signal calls back when set, once (headrace/cancel.py)."""

from __future__ import annotations

import asyncio

from headrace.cancel import CancelSignal, when_set


def test_a_callback_runs_once_when_the_signal_is_set_and_not_after_it_stopped_waiting() -> None:
    async def scenario() -> tuple[list[str], bool]:
        signal = CancelSignal()
        calls: list[str] = []
        when_set(signal, lambda: calls.append("first"))
        stop = when_set(signal, lambda: calls.append("stopped"))
        stop()
        signal.set()
        signal.set()  # a second cancel of the same statement calls nothing again
        when_set(signal, lambda: calls.append("late"))  # set already: at once
        return calls, await asyncio.wait_for(signal.wait(), 1)
    assert asyncio.run(scenario()) == (["first", "late"], True)


def test_a_plain_event_is_waited_on_by_a_task() -> None:
    async def scenario() -> list[str]:
        event = asyncio.Event()
        calls: list[str] = []
        when_set(event, lambda: calls.append("set"))
        stop = when_set(event, lambda: calls.append("stopped"))
        stop()
        event.set()
        await asyncio.sleep(0.01)
        return calls
    assert asyncio.run(scenario()) == ["set"]
