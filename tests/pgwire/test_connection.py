"""The connection state machine without sockets: client bytes in, exact backend messages and
effects out, against the scripted coordinator."""

from __future__ import annotations

import asyncio
import functools
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from headrace.pgwire.connection import CancelRequested, ConnectionState, Effect, PgConnection, Signal

from . import wire_client as wc
from .scripted_session import ScriptedAdapter, ScriptedSession

FLUSH, CLOSE = Signal.FLUSH, Signal.CLOSE


def async_test(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))
    return run


class Client:
    """Drives a PgConnection like a transport would and decodes what comes back."""

    def __init__(self) -> None:
        self.adapter = ScriptedAdapter()
        self.connection = PgConnection(self.adapter)

    async def send(self, *chunks: bytes) -> tuple[list[tuple[Any, ...]], list[Effect]]:
        self.connection.receive_data(b"".join(chunks))
        effects: list[Effect] = []
        while (step := await self.connection.step()) is not None:
            effects += step
        return wc.decode_backend(self.connection.take_output()), effects

    async def start(self, **parameters: str) -> ScriptedSession:
        await self.send(wc.startup({"user": "headrace", "database": "headrace", **parameters}))
        session = self.connection.session
        assert isinstance(session, ScriptedSession)
        return session


def error_of(messages: list[tuple[Any, ...]]) -> dict[str, str]:
    errors = [message[1] for message in messages if message[0] == "E"]
    assert len(errors) == 1, messages
    return errors[0]


# --- startup ------------------------------------------------------------------------------------

@async_test
async def test_startup_with_trust_auth() -> None:
    client = Client()
    replies, effects = await client.send(wc.startup({"user": "alice", "database": "db", "application_name": "psql"}))
    assert replies[0] == ("R", 0)
    assert replies[1:-2] == [("S", name, value) for name, value in
                             ScriptedSession(0, 0).startup_parameters().items()]
    assert replies[-2:] == [("K", 1, 1001), ("Z", "I")]
    assert effects == [FLUSH]
    assert client.adapter.session_params == [("alice", "db", {"application_name": "psql"})]
    assert client.connection.state is ConnectionState.READY


@async_test
async def test_database_defaults_to_user() -> None:
    client = Client()
    await client.send(wc.startup({"user": "alice"}))
    assert client.adapter.session_params == [("alice", "alice", {})]


@pytest.mark.parametrize("request_packet", [wc.ssl_request(), wc.gssenc_request()])
@async_test
async def test_encryption_requests_are_refused_then_startup_proceeds(request_packet: bytes) -> None:
    client = Client()
    client.connection.receive_data(request_packet)
    assert await client.connection.step() == [FLUSH]
    assert client.connection.take_output() == b"N"
    replies, _ = await client.send(wc.startup({"user": "u"}))
    assert wc.kinds(replies)[0] == "R" and replies[-1] == ("Z", "I")


@async_test
async def test_unsupported_protocol_version_is_fatal() -> None:
    client = Client()
    replies, effects = await client.send(wc.startup({"user": "u"}, version=2 << 16))
    assert replies == [("E", {"S": "FATAL", "V": "FATAL", "C": "08004",
                              "M": "unsupported frontend protocol 2.0: server supports 3.0 to 3.0"})]
    assert effects == [CLOSE]
    assert client.connection.state is ConnectionState.CLOSED


@async_test
async def test_newer_minor_version_and_protocol_options_are_negotiated_down() -> None:
    client = Client()
    replies, _ = await client.send(wc.startup({"user": "u", "_pq_.fancy": "1"}, version=(3 << 16) | 2))
    assert replies[0] == ("v", 0, ["_pq_.fancy"])
    assert replies[1] == ("R", 0) and replies[-1] == ("Z", "I")
    assert client.adapter.session_params == [("u", "u", {})]


@pytest.mark.parametrize("parameters, sqlstate", [({}, "28000"), ({"user": "nobody"}, "28000")])
@async_test
async def test_startup_failures_are_fatal(parameters: dict[str, str], sqlstate: str) -> None:
    client = Client()
    replies, effects = await client.send(wc.startup(parameters))
    assert error_of(replies)["S"] == "FATAL" and error_of(replies)["C"] == sqlstate
    assert effects == [CLOSE]


@async_test
async def test_cancel_request_becomes_an_effect_and_closes() -> None:
    client = Client()
    replies, effects = await client.send(wc.cancel_request(5, 77))
    assert replies == []
    assert effects == [CancelRequested(5, 77), CLOSE]


# --- simple query -------------------------------------------------------------------------------

@async_test
async def test_simple_query_with_two_statements() -> None:
    client = Client()
    session = await client.start()
    replies, effects = await client.send(wc.query("SELECT 1; SELECT * FROM numbers"))
    assert replies == [
        ("T", [("?column?", 23, 4, -1, 0)]), ("D", [b"1"]), ("C", "SELECT 1"),
        ("T", [("n", 20, 8, -1, 0)]), *[("D", [str(n).encode()]) for n in range(1, 6)], ("C", "SELECT 5"),
        ("Z", "I"),
    ]
    assert effects == [FLUSH]
    assert session.calls[-3:] == ["execute '' 0", "close_statement ''", "on_sync"]
    # one implicit transaction around them, as in PostgreSQL, with no tags of its own
    prepared = [call for call in session.calls if call.startswith("prepare")]
    assert [prepared[0], prepared[-1]] == ["prepare '' BEGIN", "prepare '' COMMIT"], prepared


@async_test
async def test_error_mid_simple_query_stops_the_rest() -> None:
    client = Client()
    session = await client.start()
    replies, _ = await client.send(wc.query("SELECT 1; SELECT 1/0; SELECT * FROM numbers"))
    assert wc.kinds(replies) == ["T", "D", "C", "E", "Z"]
    assert error_of(replies) == {"S": "ERROR", "V": "ERROR", "C": "22012", "M": "division by zero"}
    assert not any(call.startswith("prepare") and "numbers" in call for call in session.calls)
    assert session.calls[-3:] == ["on_error", "close_statement ''", "on_sync"]
    assert replies[-1] == ("Z", "I")
    # the implicit transaction is rolled back: the first SELECT's effects (a table's writes) are undone
    prepared = [call for call in session.calls if call.startswith("prepare")]
    assert [prepared[0], prepared[-1]] == ["prepare '' BEGIN", "prepare '' ROLLBACK"], prepared


@async_test
async def test_a_syntax_error_anywhere_in_the_string_runs_nothing() -> None:
    client = Client()
    session = await client.start()
    replies, _ = await client.send(wc.query("SELECT 1; SELECT * FROM numbers; SELEC 2"))
    assert wc.kinds(replies) == ["E", "Z"]  # parsed whole first, as PostgreSQL: no statement's result
    assert error_of(replies)["C"] == "42601"
    assert not any(call.startswith("prepare") for call in session.calls)


@async_test
async def test_a_string_that_controls_its_transactions_runs_statement_by_statement() -> None:
    client = Client()
    session = await client.start()
    replies, _ = await client.send(wc.query("SELECT 1; COMMIT; SELECT 1"))
    assert wc.kinds(replies) == ["T", "D", "C", "C", "T", "D", "C", "Z"]
    assert not any(call in ("prepare '' BEGIN", "prepare '' ROLLBACK") for call in session.calls)
    replies, _ = await client.send(wc.query("BEGIN"))
    session.calls.clear()
    replies, _ = await client.send(wc.query("SELECT 1; SELECT 1"))  # already in a block: its own
    assert replies[-1] == ("Z", "T")
    assert [call for call in session.calls if call.startswith("prepare")] == ["prepare '' SELECT 1"] * 2


@async_test
async def test_failed_transaction_block_status() -> None:
    client = Client()
    await client.start()
    assert (await client.send(wc.query("BEGIN")))[0] == [("C", "BEGIN"), ("Z", "T")]
    replies, _ = await client.send(wc.query("SELECT 1/0"))
    assert replies[-1] == ("Z", "E")
    replies, _ = await client.send(wc.query("SELECT 1"))
    assert error_of(replies)["C"] == "25P02" and replies[-1] == ("Z", "E")
    assert (await client.send(wc.query("ROLLBACK")))[0] == [("C", "ROLLBACK"), ("Z", "I")]


@pytest.mark.parametrize("sql", ["", "  ;  ; "])
@async_test
async def test_empty_query(sql: str) -> None:
    client = Client()
    await client.start()
    assert (await client.send(wc.query(sql)))[0] == [("I",), ("Z", "I")]


@async_test
async def test_syntax_error_reports_position_and_notices_precede_the_tag() -> None:
    client = Client()
    await client.start()
    replies, _ = await client.send(wc.query("SELEC 1"))
    assert error_of(replies) == {"S": "ERROR", "V": "ERROR", "C": "42601",
                                 "M": 'syntax error at or near "SELEC"', "P": "1"}
    replies, _ = await client.send(wc.query("SET x = 1"))
    assert replies == [("N", {"S": "NOTICE", "V": "NOTICE", "C": "00000", "M": "setting ignored"}),
                       ("C", "SET"), ("Z", "I")]


@async_test
async def test_internal_errors_become_xx000_and_the_connection_survives(monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client()
    session = await client.start()

    async def broken_execute(*_: object, **__: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(session, "execute", broken_execute)
    replies, _ = await client.send(wc.query("SELECT 1"))
    assert error_of(replies) == {"S": "ERROR", "V": "ERROR", "C": "XX000", "M": "internal error: RuntimeError: boom"}
    monkeypatch.undo()
    assert wc.kinds((await client.send(wc.query("SELECT 1")))[0]) == ["T", "D", "C", "Z"]


# --- extended query -----------------------------------------------------------------------------

@async_test
async def test_parse_bind_describe_execute_sync() -> None:
    client = Client()
    await client.start()
    replies, effects = await client.send(
        wc.parse("s1", "SELECT $1::int4, $2::text"),
        wc.bind("p1", "s1", [struct.pack("!i", 5), b"abc"], param_formats=[1, 0], result_formats=[1, 0]),
        wc.describe("P", "p1"), wc.execute("p1"), wc.sync())
    assert replies == [
        ("1",), ("2",), ("T", [("c0", 23, 4, -1, 1), ("c1", 25, -1, -1, 0)]),
        ("D", [b"\0\0\0\5", b"abc"]), ("C", "SELECT 1"), ("Z", "I"),
    ]
    assert effects == [FLUSH]  # the whole batch is written once, at Sync


@async_test
async def test_describe_statement() -> None:
    client = Client()
    await client.start()
    replies, _ = await client.send(wc.parse("s1", "SELECT $1::int8, $2::text[]", [0, 25]),
                                   wc.describe("S", "s1"), wc.parse("", "BEGIN"), wc.describe("S", ""), wc.sync())
    assert replies == [
        ("1",), ("t", [20, 25]), ("T", [("c0", 20, 8, -1, 0), ("c1", 25, -1, -1, 0)]),
        ("1",), ("t", []), ("n",), ("Z", "I"),
    ]


@async_test
async def test_execute_with_max_rows_suspends_the_portal() -> None:
    client = Client()
    await client.start()
    replies, _ = await client.send(wc.parse("", "SELECT * FROM numbers"), wc.bind("", ""),
                                   wc.execute("", 2), wc.execute("", 2), wc.execute("", 2), wc.sync())
    assert replies == [("1",), ("2",), ("D", [b"1"]), ("D", [b"2"]), ("s",), ("D", [b"3"]), ("D", [b"4"]), ("s",),
                       ("D", [b"5"]), ("C", "SELECT 1"), ("Z", "I")]


@async_test
async def test_error_discards_until_sync_then_one_ready_for_query() -> None:
    client = Client()
    session = await client.start()
    replies, effects = await client.send(wc.parse("", "SELEC nothing"), wc.bind("", ""), wc.describe("P", ""),
                                         wc.execute(""), wc.query("SELECT 1"), wc.flush(), wc.sync())
    assert wc.kinds(replies) == ["E", "Z"]
    assert error_of(replies)["C"] == "42601"
    assert effects == [FLUSH, FLUSH]  # the error is flushed at once, then ReadyForQuery
    assert session.calls.count("on_error") == 1 and not any(c.startswith("bind") for c in session.calls)
    assert client.connection.state is ConnectionState.READY
    replies, _ = await client.send(wc.parse("", "SELECT 1"), wc.bind("", ""), wc.execute(""), wc.sync())
    assert wc.kinds(replies) == ["1", "2", "D", "C", "Z"]


@async_test
async def test_flush_without_sync_produces_output() -> None:
    client = Client()
    await client.start()
    replies, effects = await client.send(wc.parse("__asyncpg_1__", "SELECT 1"), wc.describe("S", "__asyncpg_1__"),
                                         wc.flush())
    assert replies == [("1",), ("t", []), ("T", [("?column?", 23, 4, -1, 0)])]
    assert effects == [FLUSH]
    assert client.connection.state is ConnectionState.IN_EXTENDED_BATCH


@async_test
async def test_close_statement_and_portal() -> None:
    client = Client()
    await client.start()
    replies, _ = await client.send(wc.parse("s1", "SELECT 1"), wc.bind("p1", "s1"), wc.close("P", "p1"),
                                   wc.close("S", "s1"), wc.close("S", "never-existed"), wc.sync())
    assert wc.kinds(replies) == ["1", "2", "3", "3", "3", "Z"]
    replies, _ = await client.send(wc.bind("p1", "s1"), wc.sync())
    assert error_of(replies)["C"] == "26000"
    replies, _ = await client.send(wc.describe("P", "p1"), wc.sync())
    assert error_of(replies)["C"] == "34000"


@async_test
async def test_sync_drops_the_unnamed_portal_but_keeps_the_unnamed_statement() -> None:
    client = Client()
    await client.start()
    await client.send(wc.parse("", "SELECT 1"), wc.bind("", ""), wc.sync())
    replies, _ = await client.send(wc.execute(""), wc.sync())
    assert error_of(replies)["C"] == "34000"
    replies, _ = await client.send(wc.bind("", ""), wc.execute(""), wc.sync())
    assert wc.kinds(replies) == ["2", "D", "C", "Z"]


@async_test
async def test_simple_query_drops_the_unnamed_statement() -> None:
    client = Client()
    await client.start()
    await client.send(wc.parse("", "SELECT 1"), wc.sync(), wc.query("SELECT 1"))
    replies, _ = await client.send(wc.bind("", ""), wc.sync())
    assert error_of(replies)["C"] == "26000"


@pytest.mark.parametrize("bind, sqlstate, message", [
    (wc.bind("", "s", [b"1"]), "08P01", 'bind message supplies 1 parameters, but prepared statement "s" requires 2'),
    (wc.bind("", "s", [b"1", b"x"], param_formats=[0, 0, 0]), "08P01",
     "bind message has 3 parameter formats but 2 parameters"),
    (wc.bind("", "s", [b"one", b"x"]), "22P02", 'invalid input syntax for type integer: "one"'),
    (wc.bind("", "s", [b"1", b"x"], param_formats=[7]), "22023", "unsupported format code: 7"),
    (wc.bind("", "s", [b"1", b"x"], result_formats=[1, 1, 1]), "08P01",
     "bind message has 3 result formats but query has 2 columns"),
])
@async_test
async def test_bad_binds(bind: bytes, sqlstate: str, message: str) -> None:
    client = Client()
    await client.start()
    replies, _ = await client.send(wc.parse("s", "SELECT $1::int4, $2::text"), bind, wc.sync())
    assert wc.kinds(replies) == ["1", "E", "Z"]
    assert (error_of(replies)["C"], error_of(replies)["M"]) == (sqlstate, message)


@async_test
async def test_null_parameters_and_empty_extended_query() -> None:
    client = Client()
    session = await client.start()
    replies, _ = await client.send(wc.parse("", "SELECT $1::int4, $2::text"), wc.bind("", "", [None, None]),
                                   wc.execute(""), wc.parse("", ""), wc.bind("", ""), wc.execute(""), wc.sync())
    assert replies == [("1",), ("2",), ("D", [None, None]), ("C", "SELECT 1"), ("1",), ("2",), ("I",), ("Z", "I")]
    assert "bind '' '' [None, None]" in session.calls


@async_test
async def test_cancel_interrupts_a_running_execute() -> None:
    client = Client()
    session = await client.start()
    client.connection.receive_data(wc.query("SELECT pg_sleep"))
    running = asyncio.create_task(client.connection.step())
    while session.running is None:
        await asyncio.sleep(0.001)
    client.adapter.cancel(session.connection_id, session.secret_key + 1)  # wrong secret: ignored
    await asyncio.sleep(0.01)
    assert not running.done()
    client.adapter.cancel(session.connection_id, session.secret_key)
    assert await asyncio.wait_for(running, 2) == [FLUSH]
    replies = wc.decode_backend(client.connection.take_output())
    assert error_of(replies)["C"] == "57014" and wc.kinds(replies) == ["E", "Z"]


@async_test
async def test_a_cancel_after_its_statement_ended_does_not_cancel_the_next_one() -> None:
    """Statements reuse one cancel event until it is set; a late cancel (the session kept the event of a
    statement that already ended) must not leak into the next statement, simple or extended."""
    client = Client()
    session = await client.start()
    replies, _ = await client.send(wc.query("SELECT 1"))
    assert wc.kinds(replies) == ["T", "D", "C", "Z"]
    for next_statement in (wc.query("SELECT pg_sleep"),
                           wc.parse("", "SELECT pg_sleep") + wc.bind("", "") + wc.execute("") + wc.sync()):
        client.connection.receive_data(wc.query("SELECT pg_sleep"))
        first = asyncio.create_task(client.connection.step())
        while session.running is None:
            await asyncio.sleep(0.001)
        late = session.running  # the event a CancelRequest would still reach once the statement ended
        late.set()
        await asyncio.wait_for(first, 2)
        late.set()  # the cancel arrives again, after the end of its statement
        client.connection.take_output()
        client.connection.receive_data(next_statement)
        running = asyncio.create_task(_drain(client.connection))
        while session.running is None:
            await asyncio.sleep(0.001)
        assert session.running is not late and not session.running.is_set()
        await asyncio.sleep(0.01)
        assert not running.done()
        client.connection.cancel_running()
        await asyncio.wait_for(running, 2)
        assert error_of(wc.decode_backend(client.connection.take_output()))["C"] == "57014"


async def _drain(connection: PgConnection) -> None:
    while await connection.step() is not None:
        pass


@async_test
async def test_terminate_and_protocol_violations_close() -> None:
    client = Client()
    session = await client.start()
    replies, effects = await client.send(wc.copy_data(b"stray"), wc.copy_done(), wc.terminate(), wc.query("SELECT 1"))
    assert (replies, effects) == ([], [CLOSE])  # stray COPY messages are ignored, as PostgreSQL does
    assert session.terminated and client.connection.state is ConnectionState.CLOSED

    client = Client()
    session = await client.start()
    replies, effects = await client.send(wc.query("SELECT 1"), b"?\0\0\0\4")
    assert wc.kinds(replies) == ["T", "D", "C", "Z", "E"]
    assert error_of(replies) == {"S": "FATAL", "V": "FATAL", "C": "08P01", "M": "invalid frontend message type 63"}
    assert effects == [FLUSH, CLOSE] and session.terminated


@async_test
async def test_password_message_after_startup_is_a_protocol_violation() -> None:
    client = Client()
    await client.start()
    replies, effects = await client.send(wc.password(b"secret\0"))
    assert error_of(replies)["C"] == "08P01" and effects == [CLOSE]


@async_test
async def test_connection_lost_terminates_the_session_once() -> None:
    client = Client()
    session = await client.start()
    await client.connection.connection_lost()
    await client.connection.connection_lost()
    assert session.calls.count("terminate") == 1
