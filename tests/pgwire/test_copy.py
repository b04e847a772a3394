"""The COPY sub-protocol through the connection state machine, without sockets: CopyOutResponse /
CopyData / CopyDone for COPY TO, CopyInResponse then CopyData / CopyDone / CopyFail for COPY FROM,
in the simple and the extended protocol."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from headrace.coordinator.responses import Column, CommandComplete, CopyFrom, CopyTo
from headrace.errors import HeadraceError
from headrace.pgwire import types as t
from headrace.pgwire.connection import ConnectionState, PgConnection
from headrace.pgwire.copy import CopyIn
from headrace.pgwire.copy_format import CopyEncoder, CopyOptions

from . import wire_client as wc
from .scripted_session import Portal, ScriptedAdapter, ScriptedSession, Statement

COLUMNS = (Column("id", t.INT4), Column("note", t.TEXT))
TARGET = CopyFrom(("public", "t"), COLUMNS, CopyOptions())
CSV_TARGET = CopyFrom(("public", "t"), COLUMNS, CopyOptions.parse({"format": "csv"}, direction="from"))


async def _payloads(response: CopyTo, rows: Sequence[tuple[Any, ...]]) -> AsyncIterator[list[bytes]]:
    encoder = CopyEncoder(response.options, [c.type_oid for c in response.columns], [c.name for c in response.columns])
    yield [encoder.header()]
    for row in rows:
        response.row_count += 1
        yield [encoder.row(row)]
    trailer = encoder.trailer()
    if trailer:
        yield [trailer]


@dataclass
class CopySession(ScriptedSession):
    """The scripted session plus COPY statements: `COPY out <format>` and `COPY in [csv]`."""

    inserted: list[list[tuple[Any, ...]]] = field(default_factory=list)

    async def prepare(self, name: str, sql: str, param_types: Sequence[int], *, describe: bool = True) -> None:
        if sql.startswith("COPY"):
            self.statements[name] = Statement(sql, (), None)
            return
        await super().prepare(name, sql, param_types)

    def bind(self, portal: str, statement: str, params: Sequence[object],
             result_formats: Sequence[int] = ()) -> None:
        sql = self._statement(statement).sql
        if sql.startswith("COPY out"):
            options = CopyOptions.parse({"format": sql.split()[-1]}, direction="to")
            response = CopyTo(options, COLUMNS, data=None)  # type: ignore[arg-type]
            response.data = _payloads(response, [(1, "a\tb"), (2, None)])
            self.portals[portal] = Portal(None, response, None)
        elif sql.startswith("COPY in"):
            self.portals[portal] = Portal(None, CSV_TARGET if sql.endswith("csv") else TARGET, None)
        else:
            super().bind(portal, statement, params)

    async def insert_rows(self, target: CopyFrom, rows: list[tuple[Any, ...]],
                          cancel: asyncio.Event | None = None) -> CommandComplete:
        if any(row[0] == 13 for row in rows):
            raise HeadraceError("unlucky row", sqlstate="23514")
        self.inserted.append(rows)
        return CommandComplete(f"COPY {len(rows)}")


class CopyAdapter(ScriptedAdapter):
    async def new_session(self, user: str, database: str, params: dict[str, str]) -> CopySession:
        connection_id = len(self.sessions) + 1
        session = CopySession(connection_id, secret_key=1000 + connection_id)
        self.sessions[connection_id] = session
        return session


def decode(data: bytes) -> list[tuple[Any, ...]]:
    decoded: list[tuple[Any, ...]] = []
    position = 0
    while position < len(data):
        kind = chr(data[position])
        length = struct.unpack_from("!i", data, position + 1)[0]
        body = data[position + 5:position + 1 + length]
        if kind in ("H", "G"):
            overall, count = struct.unpack_from("!bh", body)
            decoded.append((kind, overall, list(struct.unpack_from(f"!{count}h", body, 3))))
        elif kind == "d":
            decoded.append(("d", body))
        elif kind == "c":
            decoded.append(("c",))
        else:
            decoded.append(wc._decode_one(kind, body))
        position += 1 + length
    return decoded


class Client:
    def __init__(self) -> None:
        self.connection = PgConnection(CopyAdapter())
        self.flushes = 0

        async def flush() -> None:
            self.flushes += 1

        self.connection.flush_output = flush

    async def send(self, *chunks: bytes) -> list[tuple[Any, ...]]:
        self.connection.receive_data(b"".join(chunks))
        while await self.connection.step() is not None:
            pass
        return decode(self.connection.take_output())

    async def start(self) -> CopySession:
        await self.send(wc.startup({"user": "headrace", "database": "headrace"}))
        session = self.connection.session
        assert isinstance(session, CopySession)
        return session


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_copy_out_text_in_the_simple_protocol() -> None:
    async def body() -> None:
        client = Client()
        await client.start()
        replies = await client.send(wc.query("COPY out text; SELECT 1"))
        assert replies[:4] == [("H", 0, [0, 0]), ("d", b"1\ta\\tb\n"), ("d", b"2\t\\N\n"), ("c",)]
        assert replies[4] == ("C", "COPY 2")  # (an empty header payload sends no CopyData)
        assert [reply[0] for reply in replies[5:]] == ["T", "D", "C", "Z"]
    run(body())


def test_copy_out_binary_in_the_extended_protocol() -> None:
    async def body() -> None:
        client = Client()
        await client.start()
        replies = await client.send(wc.parse("", "COPY out binary"), wc.bind("", ""), wc.execute(""), wc.sync())
        assert replies[2] == ("H", 1, [1, 1])
        data = b"".join(reply[1] for reply in replies if reply[0] == "d")
        assert data.startswith(b"PGCOPY\n\xff\r\n\x00") and data.endswith(b"\xff\xff")
        assert replies[-3:] == [("c",), ("C", "COPY 2"), ("Z", "I")]
    run(body())


def test_copy_in_simple_protocol_then_the_rest_of_the_query() -> None:
    async def body() -> None:
        client = Client()
        session = await client.start()
        replies = await client.send(wc.query("COPY in; SELECT 1"))
        assert replies == [("G", 0, [0, 0])]
        assert client.connection.state is ConnectionState.COPY_IN
        # Flush and Sync are ignored during COPY IN; data may split rows anywhere.
        replies = await client.send(wc.copy_data(b"1\tone\n2\t"), wc.flush(), wc.sync(), wc.copy_data(b"\\N\n"))
        assert replies == []
        replies = await client.send(wc.copy_done())
        assert replies[0] == ("C", "COPY 2")
        assert [reply[0] for reply in replies[1:]] == ["T", "D", "C", "Z"]
        assert session.inserted == [[(1, "one"), (2, None)]]
        assert client.connection.state is ConnectionState.READY
    run(body())


def test_copy_in_csv_extended_protocol() -> None:
    async def body() -> None:
        client = Client()
        session = await client.start()
        replies = await client.send(wc.parse("", "COPY in csv"), wc.bind("", ""), wc.execute(""))
        assert replies[-1] == ("G", 0, [0, 0])
        replies = await client.send(wc.copy_data(b'1,"a, ""b"""\n'), wc.copy_done(), wc.sync())
        assert replies == [("C", "COPY 1"), ("Z", "I")]
        assert session.inserted == [[(1, 'a, "b"')]]
    run(body())


def test_copy_fail_aborts_with_57014_and_later_copy_messages_are_dropped() -> None:
    async def body() -> None:
        client = Client()
        session = await client.start()
        await client.send(wc.query("COPY in"))
        replies = await client.send(wc.copy_data(b"1\tx\n"), wc.copy_fail("client gave up"))
        assert replies[0][0] == "E" and replies[0][1]["C"] == "57014"
        assert replies[0][1]["M"] == "COPY from stdin failed: client gave up"
        assert replies[1] == ("Z", "I")
        assert await client.send(wc.copy_data(b"2\n"), wc.copy_done()) == []
        assert session.inserted == []
        assert [r[0] for r in await client.send(wc.query("SELECT 1"))] == ["T", "D", "C", "Z"]
    run(body())


def test_bad_data_is_22P04_with_the_line_and_an_extended_error_waits_for_sync() -> None:
    async def body() -> None:
        client = Client()
        await client.start()
        await client.send(wc.parse("", "COPY in"), wc.bind("", ""), wc.execute(""))
        replies = await client.send(wc.copy_data(b"1\tok\n2\n"), wc.copy_done())
        assert replies[0][0] == "E" and replies[0][1]["C"] == "22P04"
        assert replies[0][1]["D"] == "COPY t, line 2"
        assert client.connection.state is ConnectionState.AWAITING_SYNC
        assert await client.send(wc.sync()) == [("Z", "I")]
    run(body())


def test_size_limit_is_53000() -> None:
    async def body() -> None:
        client = Client()
        await client.start()
        await client.send(wc.query("COPY in"))
        copy_in = client.connection._copy_in
        assert isinstance(copy_in, CopyIn)
        copy_in.limit = 10
        replies = await client.send(wc.copy_data(b"1\tabcdef\n"), wc.copy_data(b"2\tx\n"))
        assert replies[0][0] == "E" and replies[0][1]["C"] == "53000"
        assert replies[1] == ("Z", "I")
        assert await client.send(wc.copy_done()) == []  # the client's CopyDone arrives after: dropped
    run(body())


def test_insert_errors_and_other_messages_end_the_copy() -> None:
    async def body() -> None:
        client = Client()
        await client.start()
        await client.send(wc.query("COPY in"))
        replies = await client.send(wc.copy_data(b"13\tx\n"), wc.copy_done())
        assert replies[0][1]["C"] == "23514" and replies[-1] == ("Z", "I")
        await client.send(wc.query("COPY in"))
        replies = await client.send(wc.query("SELECT 1"))
        assert replies[0][1]["C"] == "08P01" and replies[-1] == ("Z", "I")
        assert client.connection.state is ConnectionState.READY
    run(body())


def test_copy_out_flushes_while_it_streams() -> None:
    async def body() -> None:
        client = Client()
        session = await client.start()
        gate = asyncio.Event()

        async def slow(response: CopyTo) -> AsyncIterator[list[bytes]]:
            yield [b"1\n"]
            await gate.wait()
            response.row_count = 2
            yield [b"2\n"]

        response = CopyTo(CopyOptions(), (Column("n", t.INT4),), data=None)  # type: ignore[arg-type]
        response.data = slow(response)
        session.statements["s"] = Statement("COPY out text", (), None)
        session.portals["p"] = Portal(None, response, None)
        asyncio.get_running_loop().call_later(0.05, gate.set)
        replies = await client.send(wc.execute("p"), wc.sync())
        assert client.flushes >= 1  # the first row went out before the second existed
        assert replies[-3:] == [("c",), ("C", "COPY 2"), ("Z", "I")]
    run(body())
