"""Streaming responses (seed 004's Subscribing) behind cursors and COPY: FETCH waits for the first
row unless a timeout says otherwise, a cancel ends the wait with 57014, and closing the cursor (or
the session) cancels the stream. The stream here is a plain async generator standing in for the
SUBSCRIBE that will produce it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from headrace.coordinator.copy import copy_to
from headrace.coordinator.cursors import SubscriptionBuffer, parse_timeout
from headrace.coordinator.responses import Column, Fetch, SendingRows, StatementDescription, Subscribing
from headrace.coordinator.session import PreparedStatement, Session, default_variables
from headrace.coordinator.session_sql import fetch_rows
from headrace.errors import HeadraceError
from headrace.pgwire import types as t
from headrace.pgwire.copy_format import CopyOptions

COLUMNS = (Column("hr_diff", t.INT8), Column("v", t.TEXT))


class Stream:
    """Batches pushed by the test; `cancelled` records the consumer's cancel."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Sequence[tuple[Any, ...]] | None] = asyncio.Queue()
        self.cancelled = False

    async def batches(self) -> AsyncIterator[Sequence[tuple[Any, ...]]]:
        while (batch := await self.queue.get()) is not None:
            yield batch

    def subscribing(self) -> Subscribing:
        return Subscribing(COLUMNS, self.batches(), self.cancel)

    def cancel(self) -> None:
        self.cancelled = True


class StreamRunner:
    """The coordinator's execute for a cursor over a stream (what SUBSCRIBE will return)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    async def prepare(self, *args: Any) -> PreparedStatement:
        raise AssertionError("not used")

    async def execute(self, session: Session, portal: Any, max_rows: int, cancel: asyncio.Event,
                      stream: bool = False) -> Subscribing:
        return self.stream.subscribing()


def cursor_session() -> Session:
    session = Session(user="u", database="headrace", variables=default_variables("u", "headrace", "t"))
    session.begin()
    statement = PreparedStatement("SUBSCRIBE x", None, StatementDescription((), COLUMNS))
    portal = session.set_portal("c", statement, ())
    portal.cursor = True
    return session


def test_fetch_waits_for_a_row_without_timeout_and_not_past_one() -> None:
    async def body() -> None:
        stream = Stream()
        session = cursor_session()
        runner = StreamRunner(stream)
        fetch = asyncio.ensure_future(fetch_rows(runner, session, Fetch("c", 10, None), asyncio.Event()))
        await asyncio.sleep(0.05)
        assert not fetch.done()  # nothing yet: FETCH waits
        await stream.queue.put([(1, "a"), (1, "b")])
        result = await asyncio.wait_for(fetch, 1)
        assert isinstance(result, SendingRows) and result.tag_verb == "FETCH" and list(result.rows) == [(1, "a"), (1, "b")]
        await stream.queue.put([(1, "c"), (1, "d"), (1, "e")])
        await asyncio.sleep(0.01)
        assert list((await fetch_rows(runner, session, Fetch("c", 2, None), asyncio.Event())).rows) == [(1, "c"), (1, "d")]
        assert list((await fetch_rows(runner, session, Fetch("c", None, 0), asyncio.Event())).rows) == [(1, "e")]
        session.close_portal("c")
        assert stream.cancelled
    asyncio.run(body())


def test_fetch_timeout_and_cancel() -> None:
    async def body() -> None:
        stream = Stream()
        session = cursor_session()
        runner = StreamRunner(stream)
        started = asyncio.get_running_loop().time()
        result = await fetch_rows(runner, session, Fetch("c", 5, 0.1), asyncio.Event())
        assert list(result.rows) == [] and asyncio.get_running_loop().time() - started >= 0.09
        cancel = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, cancel.set)
        with pytest.raises(HeadraceError) as raised:
            await fetch_rows(runner, session, Fetch("c", 5, None), cancel)
        assert raised.value.sqlstate == "57014"
        await stream.queue.put([(1, "late")])  # nothing was lost by the cancelled wait
        assert list((await fetch_rows(runner, session, Fetch("c", 5, None), asyncio.Event())).rows) == [(1, "late")]
        await stream.queue.put(None)  # the stream ends: FETCH returns what is left, then nothing
        assert list((await fetch_rows(runner, session, Fetch("c", 5, None), asyncio.Event())).rows) == []
        session.end_transaction(committed=True)
        assert stream.cancelled and session.portals == {}
    asyncio.run(body())


def test_stream_errors_reach_the_next_fetch() -> None:
    async def body() -> None:
        async def failing() -> AsyncIterator[Sequence[tuple[Any, ...]]]:
            yield [(1, "ok")]
            raise HeadraceError("store went away", sqlstate="58000")

        buffer = SubscriptionBuffer(Subscribing(COLUMNS, failing(), lambda: None))
        assert await buffer.take(10, None, asyncio.Event()) == [(1, "ok")]
        with pytest.raises(HeadraceError, match="store went away"):
            await buffer.take(10, None, asyncio.Event())
        buffer.close()
    asyncio.run(body())


def test_copy_to_over_a_stream_writes_rows_as_they_come_and_cancels_it_at_the_end() -> None:
    async def body() -> None:
        stream = Stream()
        response = copy_to(CopyOptions.parse({"format": "csv"}, direction="to"), stream.subscribing())
        data = response.data.__aiter__()
        await stream.queue.put([(1, "a,b")])
        assert await data.__anext__() == [b'1,"a,b"\n']
        await stream.queue.put(None)
        with pytest.raises(StopAsyncIteration):
            await data.__anext__()
        assert response.tag == "COPY 1" and stream.cancelled
    asyncio.run(body())


@pytest.mark.parametrize(("text", "seconds"), [(None, None), ("1s", 1.0), ("500ms", 0.5), ("2 minutes", 120.0),
                                               ("0", 0.0), ("1.5", 1.5)])
def test_fetch_timeout_values(text: str | None, seconds: float | None) -> None:
    assert parse_timeout(text) == seconds


def test_bad_fetch_timeout() -> None:
    with pytest.raises(HeadraceError):
        parse_timeout("soon")
