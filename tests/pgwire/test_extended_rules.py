"""PostgreSQL's extended-protocol rules, one transition each, without sockets (protocol-flow.html):
pipelines before one Sync, error recovery and the status byte, Flush, Describe of non-row statements,
portal resumption, and multi-statement simple queries."""

from __future__ import annotations

import pytest

from headrace.pgwire.connection import ConnectionState, Signal

from . import wire_client as wc
from .test_connection import Client, async_test, error_of


@async_test
async def test_pipeline_of_many_statements_before_one_sync() -> None:
    client = Client()
    await client.start()
    batch = [wc.parse("", "SELECT $1::int4")]
    for n in range(20):  # psycopg executemany: Bind/Execute per row, one Sync at the end
        batch += [wc.bind("", "", [str(n).encode()]), wc.describe("P", ""), wc.execute("")]
    replies, effects = await client.send(*batch, wc.sync())
    assert effects == [Signal.FLUSH]  # nothing is written before the Sync asks for it
    rows = [reply[1][0] for reply in replies if reply[0] == "D"]
    assert rows == [str(n).encode() for n in range(20)]
    assert wc.kinds(replies).count("Z") == 1 and replies[-1] == ("Z", "I")


@pytest.mark.parametrize("begin, status", [(False, "I"), (True, "E")])
@async_test
async def test_error_mid_pipeline_skips_the_rest_and_sets_the_status(begin: bool, status: str) -> None:
    client = Client()
    session = await client.start()
    if begin:
        await client.send(wc.query("BEGIN"))
    replies, effects = await client.send(
        wc.parse("a", "SELECT 1"), wc.bind("", "a"), wc.execute(""),
        wc.parse("b", "SELECT 1/0"), wc.bind("", "b"), wc.execute(""),  # Bind fails (the scripted planner runs there)
        wc.parse("c", "SELECT * FROM numbers"), wc.bind("", "c"), wc.execute(""), wc.sync())
    assert wc.kinds(replies) == ["1", "2", "D", "C", "1", "E", "Z"]
    assert error_of(replies)["C"] == "22012" and replies[-1] == ("Z", status)
    assert effects == [Signal.FLUSH, Signal.FLUSH]  # the error at once, then ReadyForQuery
    assert "c" not in session.statements  # skipped: never parsed


@async_test
async def test_skipping_until_sync_ignores_flush_and_query_but_not_terminate() -> None:
    client = Client()
    session = await client.start()
    replies, effects = await client.send(wc.bind("", "missing"), wc.flush(), wc.query("SELECT 1"))
    assert wc.kinds(replies) == ["E"] and error_of(replies)["C"] == "26000"
    assert client.connection.state is ConnectionState.AWAITING_SYNC
    replies, effects = await client.send(wc.terminate())
    assert (replies, effects) == ([], [Signal.CLOSE]) and session.terminated


@async_test
async def test_describe_of_statements_and_portals_without_rows_is_nodata() -> None:
    client = Client()
    await client.start()
    replies, _ = await client.send(wc.parse("s", "SET x = 1"), wc.describe("S", "s"), wc.bind("p", "s"),
                                   wc.describe("P", "p"), wc.execute("p"), wc.sync())
    assert replies[:5] == [("1",), ("t", []), ("n",), ("2",), ("n",)]
    assert wc.kinds(replies)[5:] == ["N", "C", "Z"]


@async_test
async def test_suspended_portal_resumes_across_flushes() -> None:
    client = Client()
    await client.start()
    replies, effects = await client.send(wc.parse("", "SELECT * FROM numbers"), wc.bind("c", ""),
                                         wc.execute("c", 3), wc.flush())
    assert wc.kinds(replies) == ["1", "2", "D", "D", "D", "s"] and effects == [Signal.FLUSH]
    replies, _ = await client.send(wc.execute("c", 3), wc.flush())
    assert replies == [("D", [b"4"]), ("D", [b"5"]), ("C", "SELECT 2")]
    replies, _ = await client.send(wc.close("P", "c"), wc.sync())
    assert replies == [("3",), ("Z", "I")]


@async_test
async def test_close_of_unknown_names_succeeds_and_named_portals_survive_sync() -> None:
    client = Client()
    await client.start()
    replies, _ = await client.send(wc.close("P", "nope"), wc.close("S", "nope"), wc.sync())
    assert replies == [("3",), ("3",), ("Z", "I")]
    await client.send(wc.parse("s", "SELECT 1"), wc.bind("named", "s"), wc.sync())
    replies, _ = await client.send(wc.execute("named"), wc.sync())
    assert wc.kinds(replies) == ["D", "C", "Z"]


@pytest.mark.parametrize("sql, statuses", [
    ("SELECT 1; BEGIN", "T"),
    ("BEGIN; SELECT 1/0; SELECT 1", "E"),
    ("BEGIN; SELECT 1; COMMIT", "I"),
    ("SELECT 1/0; BEGIN", "I"),  # the error ends the implicit transaction before BEGIN runs
])
@async_test
async def test_simple_query_with_several_statements_reports_the_final_status(sql: str, statuses: str) -> None:
    client = Client()
    await client.start()
    replies, _ = await client.send(wc.query(sql))
    assert replies[-1] == ("Z", statuses) and wc.kinds(replies).count("Z") == 1
