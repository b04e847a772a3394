"""pgwire's limits: message length caps before and after authentication (decoder, no sockets), hostssl / hostnossl
rules, the refusal of trust rules on a public address, 53300 over the connection limit, and the authentication and
idle-session timeouts of the transport (a real socket to start_pgwire_server, the scripted coordinator)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from headrace.errors import ProtocolViolation
from headrace.pgwire import messages
from headrace.pgwire.auth import AuthMethod, choose_method, insecure_trust_rules, parse_auth_rules
from headrace.pgwire.connection import PgConnection, Signal
from headrace.pgwire.limits import PgLimits, too_many_clients
from headrace.pgwire.messages.frontend import MAX_AUTH_TOKEN_LENGTH, MessageTooLong
from headrace.pgwire.security import SecurityConfig
from headrace.pgwire.server import start_pgwire_server

from . import wire_client as wc
from .scripted_session import ScriptedAdapter
from .test_connection import async_test, error_of


def typed(kind: bytes, length: int) -> bytes:
    return kind + struct.pack("!i", length)


# --- message caps -------------------------------------------------------------------------------------------

def decoder_after_startup() -> messages.FrontendDecoder:
    decoder = messages.FrontendDecoder()
    assert isinstance(decoder.feed(wc.startup({"user": "u"})), list)
    return decoder


@pytest.mark.parametrize("kind, length", [
    (b"p", MAX_AUTH_TOKEN_LENGTH + 1), (b"p", (1 << 30) - 1), (b"Q", 10_001), (b"Q", (1 << 30) - 1),
    (b"d", 1 << 20), (b"B", 100_000),
])
def test_before_authentication_lengths_are_capped(kind: bytes, length: int) -> None:
    decoder = decoder_after_startup()
    with pytest.raises(ProtocolViolation, match="invalid message length"):
        decoder.feed(typed(kind, length))  # refused on the header: nothing of the body is waited for


def test_a_password_message_up_to_the_auth_token_length_is_accepted() -> None:
    decoder = decoder_after_startup()
    body = b"x" * (MAX_AUTH_TOKEN_LENGTH - 4)
    assert decoder.feed(typed(b"p", MAX_AUTH_TOKEN_LENGTH) + body) == [messages.PasswordMessage(body)]


def test_after_authentication_the_configured_cap_applies() -> None:
    decoder = decoder_after_startup()
    decoder.authenticated(1 << 20)
    sql = "SELECT '" + "x" * 500_000 + "'"
    assert decoder.feed(wc.query(sql)) == [messages.Query(sql)]
    with pytest.raises(MessageTooLong) as too_long:
        decoder.feed(typed(b"Q", (1 << 20) + 1))
    assert too_long.value.sqlstate == "54000"
    decoder = decoder_after_startup()
    decoder.authenticated(1 << 20)
    with pytest.raises(ProtocolViolation, match="invalid message length"):
        decoder.feed(typed(b"S", 10_001))  # PostgreSQL's own small-message limit still holds


@async_test
async def test_a_huge_query_after_authentication_is_fatal_54000() -> None:
    connection = PgConnection(ScriptedAdapter(), max_message_bytes=1 << 20)
    connection.receive_data(wc.startup({"user": "headrace"}))
    assert await connection.step() == [Signal.FLUSH]
    connection.take_output()
    connection.receive_data(typed(b"Q", (1 << 30) - 1) + b"SELECT")
    assert await connection.step() == [Signal.CLOSE]
    error = error_of(wc.decode_backend(connection.take_output()))
    assert error["C"] == "54000" and error["S"] == "FATAL"


# --- rules --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rules, tls, expected", [
    ("hostssl all=scram-sha-256", True, AuthMethod.SCRAM_SHA_256),
    ("hostssl all=scram-sha-256", False, AuthMethod.REJECT),
    ("hostnossl all=reject,all=scram-sha-256", False, AuthMethod.REJECT),
    ("hostnossl all=reject,all=scram-sha-256", True, AuthMethod.SCRAM_SHA_256),
    ("host all=password", False, AuthMethod.PASSWORD),
    ("host all=password", True, AuthMethod.PASSWORD),
    ("hostssl alice@10.0.0.0/8=password,all=scram-sha-256", True, AuthMethod.PASSWORD),
    ("hostssl alice@10.0.0.0/8=password,all=scram-sha-256", False, AuthMethod.SCRAM_SHA_256),
])
def test_hostssl_and_hostnossl(rules: str, tls: bool, expected: AuthMethod) -> None:
    assert choose_method(parse_auth_rules(rules), "alice", "10.1.2.3", tls) is expected


def test_unknown_connection_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown connection type 'local'"):
        parse_auth_rules("local all=trust")


@async_test
async def test_plain_connection_without_a_rule_gets_postgresqls_words() -> None:
    security = SecurityConfig(parse_auth_rules("hostssl all=scram-sha-256"))
    connection = PgConnection(ScriptedAdapter(), security, "10.1.2.3")
    connection.receive_data(wc.startup({"user": "alice", "database": "headrace"}))
    assert await connection.step() == [Signal.CLOSE]
    error = error_of(wc.decode_backend(connection.take_output()))
    assert error["C"] == "28000" and error["S"] == "FATAL"
    assert error["M"] == 'no pg_hba.conf entry for host "10.1.2.3", user "alice", database "headrace", no encryption'


@pytest.mark.parametrize("rules, host, insecure", [
    ("trust", "0.0.0.0", True),
    ("all=trust", "::", True),
    ("loopback=trust,all=scram-sha-256", "0.0.0.0", False),
    ("127.0.0.0/8=trust,all=scram-sha-256", "0.0.0.0", False),
    ("10.0.0.0/8=trust", "0.0.0.0", True),
    ("hostssl all=trust", "192.168.1.10", True),
    ("trust", "127.0.0.1", False),
    ("trust", "localhost", False),
    ("trust", "::1", False),
    ("all=scram-sha-256", "0.0.0.0", False),
])
def test_trust_beyond_loopback_on_a_public_address(rules: str, host: str, insecure: bool) -> None:
    assert bool(insecure_trust_rules(parse_auth_rules(rules), host)) is insecure


# --- connection limit and timeouts over a socket ------------------------------------------------------------------

@async_test
async def test_over_the_limit_the_startup_packet_is_answered_53300() -> None:
    connection = PgConnection(ScriptedAdapter(), refusal=too_many_clients())
    connection.receive_data(wc.startup({"user": "headrace"}))
    assert await connection.step() == [Signal.CLOSE]
    error = error_of(wc.decode_backend(connection.take_output()))
    assert (error["C"], error["M"], error["S"]) == ("53300", "sorry, too many clients already", "FATAL")


async def _read_until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes:
    received = b""
    async with asyncio.timeout(timeout):
        while chunk := await reader.read(65536):
            received += chunk
    return received


@async_test
async def test_connection_limit_auth_timeout_and_idle_timeout_over_a_socket() -> None:
    limits = PgLimits(max_connections=3, auth_timeout_s=0.5, idle_session_timeout_s=0.6)
    server = await start_pgwire_server(ScriptedAdapter(), "127.0.0.1", 0, None, limits)
    port = server.sockets[0].getsockname()[1]
    try:
        # Three silent sockets hold every slot: a fourth client is told 53300 once it sends its startup packet.
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(wc.startup({"user": "headrace"}))
        error = error_of(wc.decode_backend(await _read_until_closed(reader, 5)))
        assert error["C"] == "53300"
        writer.close()
        # The authentication timeout closes the silent ones without a word (no startup packet was sent).
        for silent_reader, silent_writer in silent:
            assert await _read_until_closed(silent_reader, 5) == b""
            silent_writer.close()
        await asyncio.sleep(0.05)
        # Now a client gets in; idle outside a transaction past idle_session_timeout it is closed with 57P05,
        # while a client that keeps querying is not.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(wc.startup({"user": "headrace"}))
        busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port)
        busy_writer.write(wc.startup({"user": "headrace"}))
        greeting = await reader.readuntil(b"Z\0\0\0\x05I")
        assert greeting.startswith(b"R")
        await busy_reader.readuntil(b"Z\0\0\0\x05I")
        for _ in range(8):  # 1.2 s of activity, two idle timeouts' worth
            busy_writer.write(wc.query("SELECT 1"))
            await busy_reader.readuntil(b"Z\0\0\0\x05I")
            await asyncio.sleep(0.15)
        closing = wc.decode_backend(await _read_until_closed(reader, 5))
        error = error_of(closing)
        assert (error["C"], error["S"]) == ("57P05", "FATAL")
        busy_writer.write(wc.query("SELECT 1"))
        assert (await busy_reader.readuntil(b"Z\0\0\0\x05I")).endswith(b"I")
        busy_writer.close()
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
