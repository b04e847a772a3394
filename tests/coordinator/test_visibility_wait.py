"""A read that waits for the pipeline to apply a table's acknowledged writes (read-your-writes) ends with 57014 on a
cancel and at the session's statement_timeout, as a running statement does. In process there is no pipeline: the
write is never applied, so the read waits until one of them ends it."""

from __future__ import annotations

import asyncio
import time

import pytest

from headrace.coordinator.client import AdapterClient, SessionClient
from headrace.errors import HeadraceError


async def run(session: SessionClient, sql: str, cancel: asyncio.Event | None = None) -> object:
    await session.prepare("", sql, ())
    session.bind("", "", ())
    try:
        return await session.execute("", 0, cancel or asyncio.Event())
    finally:
        session.on_sync()


def test_a_cancel_and_statement_timeout_end_the_wait(adapter: AdapterClient) -> None:
    async def body() -> None:
        session = await adapter.new_session("headrace", "headrace", {})
        await run(session, "CREATE TABLE waited (k int PRIMARY KEY)")
        await run(session, "INSERT INTO waited VALUES (1)")
        cancel = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, cancel.set)
        began = time.monotonic()
        with pytest.raises(HeadraceError) as cancelled:
            await run(session, "SELECT k FROM waited", cancel)
        assert cancelled.value.sqlstate == "57014" and "user request" in cancelled.value.message
        assert time.monotonic() - began < 5
        await run(session, "SET statement_timeout = '300ms'")
        began = time.monotonic()
        with pytest.raises(HeadraceError) as timed_out:
            await run(session, "SELECT k FROM waited")
        assert timed_out.value.sqlstate == "57014" and "statement timeout" in timed_out.value.message
        assert time.monotonic() - began < 5
        await session.terminate()
    asyncio.run(body())
