"""The direct lane (pgwire/direct_lane.py): a whole [Parse] Bind [Describe] Execute Sync answered at once must
write exactly the bytes the message-by-message path writes, and leave the session as that path does. Both
run against a real coordinator and DuckDB serving store holding a table with an index (no sockets, no Spark).

The general path is forced by feeding the same messages one at a time: the lane only takes a group that is
whole in the buffer at the start of a batch."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.coordinator.client import AdapterClient
from headrace.pgwire import messages as m
from headrace.pgwire.connection import PgConnection
from headrace.pgwire.direct_lane import answer_bound_group
from headrace.pgwire.messages.frontend import peek_bound_group

from tests.coordinator.conftest import in_process_adapter
from tests.pgwire.in_process import connect, drain, indexed_kv

from . import wire_client as wc

ROWS = 50
QUERY = "SELECT k, v FROM kv WHERE k = $1"


@pytest.fixture
def adapter(tmp_path: Path) -> Iterator[AdapterClient]:
    with in_process_adapter(tmp_path) as client:
        yield client


async def with_table(adapter: AdapterClient) -> PgConnection:
    """kv holds ROWS rows, every seventh v NULL, indexed on k."""
    return await indexed_kv(adapter, f"SELECT i, CASE WHEN i % 7 = 0 THEN NULL ELSE 'value-' || i END "
                                     f"FROM range(1, {ROWS + 1}) t(i)")


def group(statement: str, params: list[bytes | None], *, parse: bool, describe: bool, max_rows: int = 0,
          param_formats: tuple[int, ...] = (), result_formats: tuple[int, ...] = ()) -> list[bytes]:
    messages = [wc.parse(statement, QUERY)] if parse else []
    messages.append(wc.bind("", statement, params, param_formats, result_formats))
    if describe:
        messages.append(wc.describe("P", ""))
    return [*messages, wc.execute("", max_rows), wc.sync()]


async def run_whole(connection: PgConnection, parts: list[bytes]) -> bytes:
    connection.receive_data(b"".join(parts))
    return await drain(connection)


async def run_one_by_one(connection: PgConnection, parts: list[bytes]) -> bytes:
    output = b""
    for part in parts:
        connection.receive_data(part)
        output += await drain(connection)
    return output


def key_param(key: int, binary: bool) -> bytes:
    return struct.pack("!i", key) if binary else str(key).encode()


CASES = [
    dict(parse=True, describe=True),
    dict(parse=True, describe=False),
    dict(parse=False, describe=True),
    dict(parse=False, describe=False),
    dict(parse=False, describe=True, result_formats=(1,)),
    dict(parse=False, describe=True, result_formats=(0, 1)),
    dict(parse=False, describe=True, param_formats=(1,), result_formats=(1,)),
    dict(parse=False, describe=True, max_rows=1),
]


@pytest.mark.parametrize("case", CASES, ids=[str(case) for case in CASES])
@pytest.mark.parametrize("key", [1, 7, ROWS, ROWS + 1])
def test_same_bytes_as_the_general_path(adapter: AdapterClient, case: dict[str, object], key: int) -> None:
    async def scenario() -> None:
        direct, general = await with_table(adapter), await connect(adapter)
        for connection in (direct, general):  # a named statement for the groups without Parse
            connection.receive_data(wc.parse("p1", QUERY, [23]) + wc.sync())  # binary parameters need int4
            await drain(connection)
        binary_param = case.get("param_formats") == (1,)
        statement = "" if case["parse"] else "p1"
        parts = group(statement, [key_param(key, bool(binary_param))], **case)  # type: ignore[arg-type]
        session = direct.session
        assert session is not None
        await run_one_by_one(direct, parts)  # the plan cache learns the text (a Parse is planned once)
        found = peek_bound_group(bytearray(b"".join(parts)), 0)
        assert found is not None and found.size == len(b"".join(parts))
        out = bytearray()
        assert answer_bound_group(session, found, out), "the lane answers an indexed point query"
        whole = await run_whole(direct, parts)
        assert whole == bytes(out)
        assert whole == await run_one_by_one(general, parts)
        assert wc.kinds(wc.decode_backend(whole))[-2:] == ["C", "Z"]
        assert "" not in session.session.portals  # type: ignore[attr-defined]
    asyncio.run(scenario())


def test_declines_what_the_general_path_must_answer(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        connection = await with_table(adapter)
        session = connection.session
        assert session is not None

        def declined(parts: list[bytes]) -> bool:
            found = peek_bound_group(bytearray(b"".join(parts)), 0)
            return found is None or not answer_bound_group(session, found, bytearray())

        assert declined(group("missing", [b"1"], parse=False, describe=True))  # 26000 from the general path
        assert declined(group("", [b"x"], parse=True, describe=True))  # 22P02
        assert declined(group("", [b"1", b"2"], parse=True, describe=True))  # 08P01 parameter count
        assert declined(group("", [b"1"], parse=True, describe=True, result_formats=(0, 0, 0)))  # 08P01
        assert declined([wc.parse("", "SELECT v FROM kv WHERE v = $1"), *group("", [b"a"], parse=False,
                                                                             describe=True)])  # no index on v
        # A failed transaction block: 25P02 comes from the general path.
        connection.receive_data(wc.query("BEGIN"))
        await drain(connection)
        connection.receive_data(wc.query("SELECT nope"))
        await drain(connection)
        assert session.transaction_status == "E"
        parts = group("", [b"1"], parse=True, describe=True)
        assert declined(parts)
        reply = wc.decode_backend(await run_whole(connection, parts))
        assert [message[1]["C"] for message in reply if message[0] == "E"] == ["25P02"] and reply[-1] == ("Z", "E")
    asyncio.run(scenario())


def test_inside_a_transaction_block_the_status_stays(adapter: AdapterClient) -> None:
    async def scenario() -> None:
        connection = await with_table(adapter)
        connection.receive_data(wc.query("BEGIN"))
        await drain(connection)
        reply = wc.decode_backend(await run_whole(connection, group("", [b"3"], parse=True, describe=True)))
        assert reply[-3:] == [("D", [b"3", b"value-3"]), ("C", "SELECT 1"), ("Z", "T")]
    asyncio.run(scenario())


# --- the group shape itself ----------------------------------------------------------------------------

names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=6)
formats = st.lists(st.integers(0, 1), max_size=2)


@settings(max_examples=300)
@given(statement=names, params=st.lists(st.one_of(st.none(), st.binary(max_size=6)), max_size=3),
       param_formats=formats, result_formats=formats, parse=st.booleans(), describe=st.booleans(),
       max_rows=st.integers(0, 2**31 - 1), cut=st.integers(0, 200))
def test_peek_agrees_with_the_decoder(statement: str, params: list[bytes | None], param_formats: list[int],
                                      result_formats: list[int], parse: bool, describe: bool, max_rows: int,
                                      cut: int) -> None:
    parts = [wc.parse(statement, "SELECT 1", [23])] if parse else []
    parts += [wc.bind("", statement, params, param_formats, result_formats)]
    parts += [wc.describe("P", "")] if describe else []
    parts += [wc.execute("", max_rows), wc.sync()]
    data = b"".join(parts)
    found = peek_bound_group(bytearray(b"junk" + data + b"more"), 4)
    assert found is not None and found.size == len(data)
    decoded = m.FrontendDecoder()
    decoded.push(wc.startup({"user": "u"}))
    decoded.next_message()
    messages = decoded.feed(data)
    bind = next(message for message in messages if isinstance(message, m.Bind))
    assert (found.statement, found.params, found.param_formats, found.result_formats) == (
        bind.statement, bind.params, bind.param_formats, bind.result_formats)
    assert found.parse_sql == ("SELECT 1" if parse else None) and found.describe == describe
    assert found.max_rows == max_rows
    if cut < len(data):  # an incomplete group is not a group yet
        assert peek_bound_group(bytearray(data[:cut]), 0) is None


def test_peek_refuses_other_shapes() -> None:
    bind = wc.bind("", "s", [b"1"])
    for parts in ([bind, wc.execute("")],  # no Sync yet
                  [wc.bind("portal", "s", [b"1"]), wc.execute("portal"), wc.sync()],  # a named portal
                  [bind, wc.describe("S", "s"), wc.execute(""), wc.sync()],  # Describe of a statement
                  [bind, wc.execute(""), wc.execute(""), wc.sync()],
                  [bind, wc.flush()],
                  [wc.parse("a", "SELECT 1"), wc.bind("", "b", []), wc.execute(""), wc.sync()],
                  [bind, wc.sync()],  # no Execute
                  [bind[:-2] + b"\xff\xff", wc.execute(""), wc.sync()]):  # a bad result format count
        assert peek_bound_group(bytearray(b"".join(parts)), 0) is None, parts
