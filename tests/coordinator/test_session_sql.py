"""Session-level SQL against a real coordinator (no sockets): prepared statements, cursors and
FETCH, transaction blocks, variables, DISCARD, cancellation, and COPY's coordinator side."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from headrace.coordinator.client import AdapterClient
from headrace.coordinator.responses import CommandComplete, CopyFrom, CopyTo, SendingRows
from headrace.errors import HeadraceError, Notice
from headrace.pgwire.copy_format import CopyOptions

from .conftest import new_client, run, run_batch

SERIES = "SELECT * FROM generate_series(1, 10) AS t(n)"


def drive(body: Callable[[AdapterClient], Coroutine[Any, Any, None]]) -> Callable[[AdapterClient], None]:
    def test(adapter: AdapterClient) -> None:
        asyncio.run(body(adapter))
    test.__name__ = body.__name__
    return test


def rows(response: object) -> list[tuple[Any, ...]]:
    assert isinstance(response, SendingRows), response
    return [tuple(row) for row in response.rows]


def tag(response: object) -> str:
    if isinstance(response, SendingRows):
        return f"{response.tag_verb} {len(response.rows)}"
    assert isinstance(response, CommandComplete), response
    return response.tag


async def sqlstate_of(awaitable: Coroutine[Any, Any, Any]) -> str:
    with pytest.raises(HeadraceError) as raised:
        await awaitable
    return raised.value.sqlstate


# --- prepared statements ------------------------------------------------------------------------

@drive
async def test_prepare_execute_deallocate(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    assert tag(await run(client, "PREPARE p (int, text) AS SELECT $1 + 1 AS n, $2 AS s")) == "PREPARE"
    result = await run(client, "EXECUTE p (41, 'x')")
    assert rows(result) == [(42, "x")] and tag(result) == "SELECT 1"
    assert await sqlstate_of(run(client, "EXECUTE p (1)")) == "42601"  # wrong number of parameters
    assert await sqlstate_of(run(client, "PREPARE p AS SELECT 1")) == "42P05"
    assert tag(await run(client, "DEALLOCATE PREPARE p")) == "DEALLOCATE"
    assert await sqlstate_of(run(client, "EXECUTE p (1, 'x')")) == "26000"
    assert await sqlstate_of(run(client, "DEALLOCATE p")) == "26000"
    await run(client, "PREPARE a AS SELECT 1")
    await run(client, "PREPARE b AS SELECT 2")
    assert tag(await run(client, "DEALLOCATE ALL")) == "DEALLOCATE ALL"
    assert "a" not in client.session.statements and "b" not in client.session.statements


@drive
async def test_sql_prepared_statements_share_the_protocol_namespace(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    await client.prepare("proto", "SELECT 7 AS seven", ())
    assert rows(await run(client, "EXECUTE proto")) == [(7,)]
    await run(client, "PREPARE sqlside AS SELECT 8 AS eight")
    client.bind("portal", "sqlside", ())
    assert rows(await client.execute("portal", 0, asyncio.Event())) == [(8,)]
    # Describe of an EXECUTE is the prepared statement's row description.
    await client.prepare("outer", "EXECUTE sqlside", ())
    assert [column.name for column in client.describe_statement("outer").columns or ()] == ["eight"]


# --- cursors ------------------------------------------------------------------------------------

@drive
async def test_declare_needs_a_transaction_block_unless_with_hold(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    with pytest.raises(HeadraceError, match="DECLARE CURSOR can only be used in transaction blocks") as raised:
        await run_batch(client, f"DECLARE c CURSOR FOR {SERIES}")
    assert raised.value.sqlstate == "25P01"
    await run_batch(client, f"DECLARE h CURSOR WITH HOLD FOR {SERIES}")
    # A WITH HOLD cursor outlives the batch and its implicit transaction.
    assert rows((await run_batch(client, "FETCH 2 FROM h"))[0]) == [(1,), (2,)]


@drive
async def test_fetch_counts_forms_and_exhaustion(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    await run_batch(client, f"BEGIN; DECLARE c NO SCROLL CURSOR FOR {SERIES}")
    first = await run(client, "FETCH c")
    assert rows(first) == [(1,)] and tag(first) == "FETCH 1"
    assert rows(await run(client, "FETCH FORWARD 3 FROM c")) == [(2,), (3,), (4,)]
    assert rows(await run(client, "FETCH NEXT IN c")) == [(5,)]
    assert await sqlstate_of(run(client, "FETCH 0 c")) == "55000"  # the current row again: backward, as PostgreSQL
    await run_batch(client, f"ROLLBACK; BEGIN; DECLARE c NO SCROLL CURSOR FOR {SERIES}; MOVE 5 c")
    rest = await run(client, "FETCH ALL c")
    assert rows(rest) == [(n,) for n in range(6, 11)] and tag(rest) == "FETCH 5"
    assert tag(await run(client, "FETCH 5 c")) == "FETCH 0"
    assert await sqlstate_of(run(client, "FETCH BACKWARD 1 c")) == "55000"
    assert tag(await run(client, "CLOSE c")) == "CLOSE CURSOR"
    assert await sqlstate_of(run(client, "FETCH c")) == "34000"


@drive
async def test_cursor_is_a_portal_and_describes_like_one(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    await run_batch(client, f"BEGIN; DECLARE c CURSOR FOR {SERIES}")
    assert [column.name for column in client.describe_portal("c") or ()] == ["n"]
    # The protocol can execute the cursor as a portal (max_rows) and FETCH goes on from there.
    suspended = await client.execute("c", 3, asyncio.Event())
    assert isinstance(suspended, SendingRows) and suspended.suspended and rows(suspended) == [(1,), (2,), (3,)]
    assert rows(await run(client, "FETCH 2 c")) == [(4,), (5,)]
    # Describe of a FETCH statement describes the cursor's rows (psycopg's named cursors rely on it).
    await client.prepare("f", "FETCH 2 c", ())
    assert [column.name for column in client.describe_statement("f").columns or ()] == ["n"]
    with pytest.raises(HeadraceError) as raised:
        await run(client, f"DECLARE c CURSOR FOR {SERIES}")
    assert raised.value.sqlstate == "42P03"


@drive
async def test_commit_closes_cursors_without_hold_rollback_also_new_hold_ones(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    await run_batch(client, f"BEGIN; DECLARE plain CURSOR FOR {SERIES}; DECLARE held CURSOR WITH HOLD FOR {SERIES}")
    await run_batch(client, "COMMIT")
    assert set(client.session.portals) == {"held"}
    await run_batch(client, f"BEGIN; DECLARE held2 CURSOR WITH HOLD FOR {SERIES}; ROLLBACK")
    assert set(client.session.portals) == {"held"}
    await run_batch(client, "CLOSE ALL")
    assert client.session.portals == {}


@drive
async def test_unnamed_portal_goes_at_sync_named_ones_at_end_of_implicit_transaction(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    await client.prepare("", "SELECT 1 AS one", ())
    client.bind("", "", ())
    client.bind("named", "", ())
    client.on_sync()
    assert "" in client.session.statements  # the unnamed statement survives Sync
    assert client.session.portals == {}
    await run_batch(client, "BEGIN")
    await client.prepare("", "SELECT 1 AS one", ())
    client.bind("named", "", ())
    client.on_sync()
    assert set(client.session.portals) == {"named"}  # inside a block, named portals live on


# --- transactions -------------------------------------------------------------------------------

@drive
async def test_transaction_status_and_failed_block(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    assert client.transaction_status == "I"
    assert [tag(r) for r in await run_batch(client, "START TRANSACTION ISOLATION LEVEL SERIALIZABLE")] == ["BEGIN"]
    assert client.transaction_status == "T"
    with pytest.raises(HeadraceError):
        await run_batch(client, "SELECT * FROM missing")
    assert client.transaction_status == "E"
    with pytest.raises(HeadraceError) as raised:
        await run_batch(client, "SELECT 1")
    assert raised.value.sqlstate == "25P02"
    assert [tag(r) for r in await run_batch(client, "COMMIT")] == ["ROLLBACK"]  # a failed block rolls back
    assert client.transaction_status == "I"
    notice = (await run_batch(client, "ABORT"))[0]
    assert isinstance(notice, CommandComplete) and notice.notices == (
        Notice("there is no transaction in progress", "25P01", "WARNING"),)  # PostgreSQL's WARNING and SQLSTATE
    assert [tag(r) for r in await run_batch(client, "BEGIN; END")] == ["BEGIN", "COMMIT"]


# --- variables ----------------------------------------------------------------------------------

@drive
async def test_set_show_reset_and_transaction_scoping(adapter: AdapterClient) -> None:
    client = await new_client(adapter, application_name="app")

    async def show(name: str) -> str:
        return str(rows(await run(client, f"SHOW {name}"))[0][0])

    await run_batch(client, "SET extra_float_digits = 3; SET search_path TO a, \"B\"; SET TIME ZONE 'UTC'")
    assert await show("extra_float_digits") == "3" and await show("search_path") == "a, B"
    await run_batch(client, "SET application_name = 'other'")
    await run_batch(client, "RESET application_name")
    assert await show("application_name") == "app"  # RESET returns to the startup value
    await run_batch(client, "BEGIN; SET LOCAL extra_float_digits = 1; SET statement_timeout = '5s'")
    assert await show("extra_float_digits") == "1"
    await run_batch(client, "ROLLBACK")
    assert await show("extra_float_digits") == "3" and await show("statement_timeout") == "0"
    await run_batch(client, "BEGIN; SET LOCAL extra_float_digits = 1; SET statement_timeout = '5s'; COMMIT")
    assert await show("extra_float_digits") == "3" and await show("statement_timeout") == "5s"
    await run_batch(client, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED")  # accepted (with a warning)
    assert await show("transaction isolation level") == "serializable"
    with pytest.raises(HeadraceError) as raised:
        await run_batch(client, "SET no_such_thing = 1")
    assert raised.value.sqlstate == "42704"
    await run_batch(client, "SET myapp.tenant = 'x'")  # custom variables, as PostgreSQL allows
    assert await show("myapp.tenant") == "x"
    await run_batch(client, "RESET ALL")
    assert await show("extra_float_digits") == "1" and await show("application_name") == "app"
    with pytest.raises(HeadraceError) as raised:
        await run_batch(client, "SET server_version = '1'")
    assert raised.value.sqlstate == "55P02"


@drive
async def test_discard_all_resets_the_session(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    await run_batch(client, f"PREPARE p AS SELECT 1; SET extra_float_digits = 3; DECLARE h CURSOR WITH HOLD FOR {SERIES}")
    with pytest.raises(HeadraceError) as raised:
        await run_batch(client, "BEGIN; DISCARD ALL")
    assert raised.value.sqlstate == "25001"
    await run_batch(client, "ROLLBACK")
    assert [tag(r) for r in await run_batch(client, "DISCARD ALL")] == ["DISCARD ALL"]
    assert client.session.portals == {} and "p" not in client.session.statements
    assert rows(await run(client, "SHOW extra_float_digits")) == [("1",)]


# --- cancellation and COPY ----------------------------------------------------------------------

@drive
async def test_every_execute_can_be_cancelled(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, cancel.set)
    started = asyncio.get_running_loop().time()
    with pytest.raises(HeadraceError) as raised:
        await run(client, "SELECT count(*) FROM generate_series(1, 100000000000)", cancel)
    assert raised.value.sqlstate == "57014" and raised.value.message == "canceling statement due to user request"
    assert asyncio.get_running_loop().time() - started < 5
    assert rows(await run(client, "SELECT 1 AS one")) == [(1,)]  # the session goes on


@drive
async def test_copy_to_payloads_and_tag(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    response = await run(client, "COPY (SELECT n, n * 2 AS d FROM generate_series(1, 3) AS t(n)) TO STDOUT WITH (FORMAT csv, HEADER)")
    assert isinstance(response, CopyTo) and [c.name for c in response.columns] == ["n", "d"]
    payloads = [payload async for batch in response.data for payload in batch]
    assert b"".join(payloads) == b"n,d\n1,2\n2,4\n3,6\n" and response.tag == "COPY 3"
    with pytest.raises(HeadraceError) as raised:
        await run(client, "COPY (SELECT 1) TO STDOUT WITH (FORMAT xml)")
    assert raised.value.sqlstate == "22023"


@drive
async def test_copy_from_refuses_what_is_not_a_table(adapter: AdapterClient) -> None:
    client = await new_client(adapter)
    with pytest.raises(HeadraceError) as raised:
        await run(client, "COPY nowhere FROM STDIN")
    assert raised.value.sqlstate == "42P01"
    with pytest.raises(HeadraceError) as raised:
        await client.insert_rows(CopyFrom(("public", "nowhere"), (), CopyOptions()), [])
    assert raised.value.sqlstate == "42P01"
    assert rows(await run(client, "SELECT 1 AS one")) == [(1,)]
