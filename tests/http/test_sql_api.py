"""The HTTP SQL API's pieces without a server: request forms, JSON values as Materialize writes
them, and a streaming (Subscribing) result that stops when the client goes away."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from headrace.coordinator.responses import Column, Subscribing
from headrace.http.sql_api import BadRequest, Query, RequestRun, json_converter, parse_request
from headrace.pgwire import types as t


def test_request_forms() -> None:
    assert parse_request({"query": "SELECT 1; SELECT 2"}) == [Query("SELECT 1; SELECT 2", None)]
    assert parse_request({"queries": [{"query": "SELECT $1", "params": ["1", None]}, {"query": "SELECT 2"}]}) == [
        Query("SELECT $1", ("1", None)), Query("SELECT 2", ())]
    for bad in ([], {"query": 1}, {"query": "x", "queries": []}, {"queries": [{"query": "x", "params": [1]}]},
                {"queries": ["SELECT 1"]}, {}):
        with pytest.raises(BadRequest):
            parse_request(bad)


@pytest.mark.parametrize(("oid", "value", "expected"), [
    (t.BOOL, True, True), (t.INT4, 7, "7"), (t.INT8, -(2**62), str(-(2**62))), (t.FLOAT8, 0.5, "0.5"),
    (t.NUMERIC, Decimal("1.50"), "1.50"), (t.TEXT, "x", "x"), (t.JSONB, '{"a": [1, null]}', {"a": [1, None]}),
    (t.JSON, {"k": 1}, {"k": 1}), (t.DATE, datetime.date(2026, 11, 21), "2026-11-21"),
    (t.TIMESTAMPTZ, datetime.datetime(2026, 11, 21, 10, tzinfo=datetime.timezone.utc), "2026-11-21 10:00:00+00"),
    (t.UUID, uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"), (t.BYTEA, b"\x01", "\\x01"),
    (1007, [1, None, 3], ["1", None, "3"]), (1000, [True], [True]),
])
def test_json_values(oid: int, value: Any, expected: Any) -> None:
    assert json_converter(oid)(value) == expected


class StreamingSession:
    """Just enough of a SessionClient for RequestRun: one statement that streams forever."""

    def __init__(self) -> None:
        self.cancelled = False
        self.synced = False

    def split_statements(self, sql: str) -> list[str]:
        return [sql]

    async def split_statements_off_loop(self, sql: str) -> list[str]:
        return [sql]

    async def prepare(self, name: str, sql: str, param_types: Any) -> None:
        pass

    def describe_statement(self, name: str) -> Any:
        from headrace.coordinator.responses import StatementDescription
        return StatementDescription((), (Column("n", t.INT8),))

    def bind(self, portal: str, statement: str, params: Any) -> None:
        pass

    async def execute(self, portal: str, max_rows: int, cancel: asyncio.Event) -> Subscribing:
        async def forever() -> AsyncIterator[list[tuple[int]]]:
            n = 0
            while True:
                n += 1
                yield [(n,)]
                await asyncio.sleep(0.01)

        def cancel_stream() -> None:
            self.cancelled = True

        return Subscribing((Column("n", t.INT8),), forever(), cancel_stream)

    def on_error(self) -> None:
        pass

    def on_sync(self) -> None:
        self.synced = True


def test_a_stream_flows_as_rows_until_cancelled() -> None:
    async def body() -> None:
        session = StreamingSession()
        run = RequestRun(session)  # type: ignore[arg-type]
        seen: list[tuple[str, Any]] = []
        async for event in run.events([Query("SUBSCRIBE t", None)]):
            seen.append((event.kind, event.payload))
            if len([kind for kind, _ in seen if kind == "Row"]) == 3:
                run.cancel.set()  # the socket closed
        assert seen[0] == ("CommandStarting", {"has_rows": True, "is_streaming": True})
        assert seen[1][0] == "Rows" and [p for k, p in seen if k == "Row"][:3] == [["1"], ["2"], ["3"]]
        assert seen[-1][0] == "Error" and seen[-1][1]["code"] == "57014"
        assert session.cancelled and session.synced

    asyncio.run(body())


def test_post_refuses_streams() -> None:
    async def body() -> None:
        session = StreamingSession()
        events = [event async for event in RequestRun(session, allow_streaming=False).events([Query("SUBSCRIBE t", None)])]  # type: ignore[arg-type]
        assert [event.kind for event in events] == ["Error"] and events[0].payload["code"] == "0A000"
        assert session.cancelled

    asyncio.run(body())


def test_authentication_follows_the_pgwire_rules() -> None:
    from headrace.catalog.roles import make_scram_verifier
    from headrace.errors import HeadraceError
    from headrace.http.sql_api import SqlEndpoint
    from headrace.pgwire.auth import parse_auth_rules
    from headrace.pgwire.security import SecurityConfig

    alice = make_scram_verifier("sekrit", iterations=4096)

    class Passwords:
        def password_verifier(self, user: str) -> Any:
            return alice if user == "alice" else None

    endpoint = SqlEndpoint()
    endpoint.security = SecurityConfig(parse_auth_rules("loopback=trust,all=scram-sha-256"), Passwords())
    endpoint.authenticate("anyone", None, "127.0.0.1")  # trust on loopback
    endpoint.authenticate("alice", "sekrit", "10.0.0.7")
    for user, password in (("alice", "wrong"), ("alice", None), ("bob", "sekrit")):
        with pytest.raises(HeadraceError) as raised:
            endpoint.authenticate(user, password, "10.0.0.7")
        assert (raised.value.sqlstate, raised.value.http_status) == ("28P01", 401)
    endpoint.security = SecurityConfig(parse_auth_rules("loopback=trust"), Passwords())
    with pytest.raises(HeadraceError) as raised:
        endpoint.authenticate("alice", "sekrit", "10.0.0.7")
    assert raised.value.sqlstate == "28000"
