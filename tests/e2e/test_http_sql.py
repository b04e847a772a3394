"""The HTTP SQL API on the HTTP port (Materialize's shape): POST /api/sql and the WebSocket
/api/experimental/sql, over the same coordinator as pgwire."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
import psycopg
import pytest

from tests.e2e.server_process import SERVING_ON_POSTGRES, HeadraceProcess, select_after_cold_start

pytestmark = pytest.mark.e2e


def sql_url(server: HeadraceProcess) -> str:
    return f"http://127.0.0.1:{server.http_port}/api/sql"


async def post(server: HeadraceProcess, body: object, **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(sql_url(server), json=body, **kwargs) as response:
            text = await response.text()
            return response.status, json.loads(text) if response.content_type == "application/json" else text


def test_simple_request_several_statements_and_typed_json(server: HeadraceProcess) -> None:
    status, body = asyncio.run(post(server, {"query": (
        "SELECT 1 AS i, 2.50::numeric AS n, 'x' AS t, true AS b, NULL::text AS z, "
        "'{\"k\": [1, \"v\"]}'::jsonb AS j, DATE '2026-11-21' AS d; SHOW client_encoding")}))
    assert status == 200
    first, second = body["results"]
    assert first["tag"] == "SELECT 1" and first["notices"] == []
    (row,) = first["rows"]
    assert isinstance(row[1], str) and float(row[1]) == 2.5  # numbers travel as text, as Materialize's do
    assert row[:1] + row[2:] == ["1", "x", True, None, {"k": [1, "v"]}, "2026-11-21"]
    assert [c["name"] for c in first["desc"]["columns"]] == ["i", "n", "t", "b", "z", "j", "d"]
    assert first["desc"]["columns"][0] == {"name": "i", "type_oid": 23, "type_len": 4, "type_mod": -1}
    assert second["rows"] == [["UTF8"]]


def test_extended_request_params_transactions_and_first_error_stops(server: HeadraceProcess) -> None:
    status, body = asyncio.run(post(server, {"queries": [
        {"query": "SELECT $1::int + 1 AS n", "params": ["41"]},
        {"query": "SELECT $1::text IS NULL AS missing", "params": [None]},
        {"query": "BEGIN"},
        {"query": "SELECT * FROM no_such_relation"},
        {"query": "SELECT 'never'"},
    ]}))
    assert status == 200
    results = body["results"]
    assert results[0]["rows"] == [["42"]] and results[1]["rows"] == [[True]]
    assert results[2] == {"ok": "BEGIN", "notices": []}
    assert results[3]["error"]["code"] == "42P01" and "no_such_relation" in results[3]["error"]["message"]
    assert len(results) == 4


def test_several_statements_are_one_implicit_transaction(server: HeadraceProcess) -> None:
    """As Materialize's API (and PostgreSQL's simple Query) runs them: the first error undoes the table writes
    before it, in either form; a later statement reads an earlier one's writes on the PostgreSQL store."""
    name = f"http_implicit_{uuid.uuid4().hex[:8]}"
    status, body = asyncio.run(post(server, {"query": f"CREATE TABLE {name} (id int PRIMARY KEY)"}))
    assert status == 200 and body["results"][0] == {"ok": "CREATE TABLE", "notices": []}
    status, body = asyncio.run(post(server, {"query": f"INSERT INTO {name} VALUES (1); SELECT 1/0"}))
    assert body["results"][0] == {"ok": "INSERT 0 1", "notices": []}
    assert body["results"][1]["error"]["code"] == "22012"
    status, body = asyncio.run(post(server, {"queries": [
        {"query": f"INSERT INTO {name} VALUES ($1)", "params": ["2"]},
        {"query": f"INSERT INTO {name} VALUES ($1)", "params": ["2"]}]}))
    assert body["results"][1]["error"]["code"] == "23505"
    query = f"INSERT INTO {name} VALUES (3); SELECT id FROM {name} ORDER BY id"
    status, body = asyncio.run(post(server, {"query": query if SERVING_ON_POSTGRES else query.split(";")[0]}))
    assert "error" not in body["results"][-1], body
    with psycopg.connect(server.dsn, autocommit=True) as conn:  # Spark's cold start may outlast one read's wait
        assert select_after_cold_start(conn, f"SELECT id FROM {name} ORDER BY id") == [(3,)]


def test_bad_requests_are_400_and_options_set_variables(server: HeadraceProcess) -> None:
    assert asyncio.run(post(server, {"nothing": 1}))[0] == 400
    assert asyncio.run(post(server, {"queries": [{"query": "SELECT 1", "params": [1]}]}))[0] == 400
    status, body = asyncio.run(post(server, {"query": "SHOW application_name"},
                                    params={"options": json.dumps({"application_name": "from-http"})}))
    assert status == 200 and body["results"][0]["rows"] == [["from-http"]]
    status, body = asyncio.run(post(server, {"query": "COPY (SELECT 1) TO STDOUT"}))
    assert body["results"][0]["error"]["code"] == "0A000"
    assert asyncio.run(post_raw(server, b"not gzip", {"Content-Encoding": "gzip"})) == (400, "request body could "
                                                                                          "not be decoded")


async def post_raw(server: HeadraceProcess, data: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """A JSON-typed POST whose body is given as bytes (the fuzz suite found a bad gzip body answered 500)."""
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(f"http://127.0.0.1:{server.http_port}/api/sql", data=data,
                             headers={"Content-Type": "application/json", **headers}) as response:
            return response.status, await response.text()


def test_websocket_session(server: HeadraceProcess) -> None:
    async def body() -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{server.http_port}/api/experimental/sql"
        messages: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url) as ws:
                await ws.send_json({"user": "headrace", "password": "", "options": {"application_name": "ws-test"}})
                await ws.send_json({"query": "SELECT 1 AS one, 'a' AS letter; BEGIN; SELECT * FROM nope"})
                await ws.send_json({"queries": [{"query": "ROLLBACK"}, {"query": "SHOW application_name"}]})
                ready = 0
                async for message in ws:
                    messages.append(json.loads(message.data))
                    if messages[-1]["type"] == "ReadyForQuery":
                        ready += 1
                        if ready == 3:
                            break
        return messages

    messages = asyncio.run(body())
    kinds = [m["type"] for m in messages]
    startup_end = kinds.index("ReadyForQuery")
    assert set(kinds[:startup_end]) == {"ParameterStatus", "BackendKeyData"}
    assert {"name": "application_name", "value": "ws-test"} in [m["payload"] for m in messages[:startup_end]]
    first = messages[startup_end + 1:]
    assert [m["type"] for m in first[:4]] == ["CommandStarting", "Rows", "Row", "CommandComplete"]
    assert first[0]["payload"] == {"has_rows": True, "is_streaming": False}
    assert first[2]["payload"] == ["1", "a"] and first[3]["payload"] == "SELECT 1"
    assert first[4:6] == [{"type": "CommandStarting", "payload": {"has_rows": False, "is_streaming": False}},
                          {"type": "CommandComplete", "payload": "BEGIN"}]
    assert first[6]["type"] == "Error" and first[6]["payload"]["code"] == "42P01"
    assert first[7] == {"type": "ReadyForQuery", "payload": "E"}
    tail = first[8:]
    assert [m["type"] for m in tail] == ["CommandStarting", "CommandComplete", "CommandStarting", "Rows", "Row",
                                         "CommandComplete", "ReadyForQuery"]
    assert tail[4]["payload"] == ["ws-test"] and tail[-1]["payload"] == "I"


def test_websocket_statement_cancelled_through_pgwire(server: HeadraceProcess) -> None:
    """BackendKeyData of a WebSocket session works with a PostgreSQL CancelRequest (same sessions)."""

    async def body() -> dict[str, Any]:
        url = f"http://127.0.0.1:{server.http_port}/api/experimental/sql"
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url) as ws:
                await ws.send_json({"user": "headrace"})
                key: dict[str, Any] = {}
                async for message in ws:
                    decoded = json.loads(message.data)
                    if decoded["type"] == "BackendKeyData":
                        key = decoded["payload"]
                    if decoded["type"] == "ReadyForQuery":
                        break
                await ws.send_json({"query": "SELECT count(*) FROM generate_series(1, 100000000000)"})
                await asyncio.sleep(0.5)
                reader, writer = await asyncio.open_connection("127.0.0.1", server.pg_port)
                writer.write((16).to_bytes(4, "big") + (80877102).to_bytes(4, "big")
                             + int(key["conn_id"]).to_bytes(4, "big") + int(key["secret_key"]).to_bytes(4, "big"))
                await writer.drain()
                await reader.read()
                writer.close()
                async for message in ws:
                    decoded = json.loads(message.data)
                    if decoded["type"] == "Error":
                        return dict(decoded["payload"])
        raise AssertionError("no error")

    error = asyncio.run(asyncio.wait_for(body(), timeout=30))
    assert error["code"] == "57014"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_web_page_cannot_run_sql_through_the_trusted_loopback(server: HeadraceProcess) -> None:
    """What any page open in a browser on the server's machine can send: a cross-site text/plain POST
    (no preflight) and a WebSocket from its own origin. Neither reaches a session."""
    statement = "CREATE TABLE made_by_a_web_page (id int)"

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            for headers in ({"Origin": "http://evil.example", "Content-Type": "text/plain"},
                            {"Content-Type": "text/plain"}):
                async with http.post(sql_url(server), data=json.dumps({"query": statement}),
                                     headers=headers) as response:
                    assert response.status in (403, 415)
                    assert "error" in await response.json()
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"http://127.0.0.1:{server.http_port}/api/experimental/sql",
                                      headers={"Origin": "http://evil.example"})
            assert refused.value.status == 403

    asyncio.run(scenario())
    with psycopg.connect(server.dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.UndefinedTable):
        conn.execute("SELECT * FROM made_by_a_web_page")


def test_websocket_first_message_that_is_a_query_is_an_error(server: HeadraceProcess) -> None:
    async def scenario() -> tuple[list[Any], int | None]:
        received: list[Any] = []
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"http://127.0.0.1:{server.http_port}/api/experimental/sql") as ws:
                await ws.send_json({"query": "SELECT 1"})
                async for message in ws:
                    received.append(json.loads(message.data))
                return received, ws.close_code

    received, close_code = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert [message["type"] for message in received] == ["Error"]
    assert "authentication message" in received[0]["payload"]["message"]
    assert close_code == 1002  # as Materialize closes it: protocol error
