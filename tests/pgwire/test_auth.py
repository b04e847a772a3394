"""Authentication and TLS negotiation in the connection state machine, without sockets: the rules,
cleartext passwords, SCRAM-SHA-256 driven by scramp's client, 28P01 on bad passwords, SSLRequest."""

from __future__ import annotations

import ssl
import struct
from typing import Any

import pytest
import scramp

from headrace.catalog.roles import RoleCatalog
from headrace.pgwire.auth import AuthMethod, AuthRule, choose_method, parse_auth_rules
from headrace.pgwire.connection import ConnectionState, PgConnection, Signal
from headrace.pgwire.security import SecurityConfig

from . import wire_client as wc
from .scripted_session import ScriptedAdapter
from .test_connection import async_test, error_of


def make_roles() -> RoleCatalog:
    roles = RoleCatalog(None)
    roles.create("alice", login=True, password="wonderland")
    roles.create("nologin", login=False, password="secret")
    return roles


class AuthClient:
    def __init__(self, rules: str, address: str | None = "127.0.0.1", tls: bool = False) -> None:
        self.adapter = ScriptedAdapter()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH) if tls else None
        security = SecurityConfig(parse_auth_rules(rules), make_roles(), context)
        self.connection = PgConnection(self.adapter, security, address)

    async def send(self, *chunks: bytes) -> tuple[list[tuple[Any, ...]], list[Any]]:
        self.connection.receive_data(b"".join(chunks))
        effects: list[Any] = []
        while (step := await self.connection.step()) is not None:
            effects += step
        return wc.decode_backend(self.connection.take_output()), effects


def sasl_initial_response(mechanism: str, data: str) -> bytes:
    encoded = data.encode()
    return wc.password(mechanism.encode() + b"\0" + struct.pack("!i", len(encoded)) + encoded)


# --- rules --------------------------------------------------------------------------------------

@pytest.mark.parametrize("rules, user, address, expected", [
    ("trust", "x", "10.0.0.1", AuthMethod.TRUST),
    ("loopback=trust,all=scram-sha-256", "x", "127.0.0.1", AuthMethod.TRUST),
    ("loopback=trust,all=scram-sha-256", "x", "::1", AuthMethod.TRUST),
    ("loopback=trust,all=scram-sha-256", "x", "::ffff:127.0.0.1", AuthMethod.TRUST),
    ("loopback=trust,all=scram-sha-256", "x", "192.168.1.5", AuthMethod.SCRAM_SHA_256),
    ("loopback=trust", "x", "192.168.1.5", AuthMethod.REJECT),
    ("loopback=trust", "x", None, AuthMethod.TRUST),  # a Unix socket is local
    ("headrace@loopback=trust,all=password", "headrace", "127.0.0.1", AuthMethod.TRUST),
    ("headrace@loopback=trust,all=password", "alice", "127.0.0.1", AuthMethod.PASSWORD),
    ("10.0.0.0/8=password, 10.1.0.0/16=reject", "a", "10.1.2.3", AuthMethod.PASSWORD),
    ("10.1.0.0/16=reject,10.0.0.0/8=password", "a", "10.1.2.3", AuthMethod.REJECT),
    ("10.0.0.0/8=password", "a", "::1", AuthMethod.REJECT),
])
def test_first_matching_rule_decides(rules: str, user: str, address: str | None, expected: AuthMethod) -> None:
    assert choose_method(parse_auth_rules(rules), user, address) is expected


@pytest.mark.parametrize("text, message", [("md5", "unknown authentication method"), ("", "at least one rule"),
                                           ("nowhere=trust", "bad host")])
def test_bad_rules_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_auth_rules(text)


def test_default_rules_trust_loopback_only() -> None:
    assert SecurityConfig().auth_rules[0] == AuthRule(AuthMethod.TRUST, None, "loopback")


# --- cleartext password --------------------------------------------------------------------------

@async_test
async def test_cleartext_password_success() -> None:
    client = AuthClient("password")
    replies, effects = await client.send(wc.startup({"user": "alice"}))
    assert replies == [("R", 3)] and effects == [Signal.FLUSH]
    assert client.connection.state is ConnectionState.AUTHENTICATING and not client.adapter.sessions
    replies, _ = await client.send(wc.password(b"wonderland\0"))
    assert replies[0] == ("R", 0) and replies[-1] == ("Z", "I")
    assert client.connection.state is ConnectionState.READY


@pytest.mark.parametrize("user, password", [("alice", b"wrong\0"), ("nobody", b"x\0"), ("nologin", b"secret\0")])
@async_test
async def test_bad_password_is_fatal_28p01(user: str, password: bytes) -> None:
    client = AuthClient("password")
    await client.send(wc.startup({"user": user}))
    replies, effects = await client.send(wc.password(password))
    assert error_of(replies) == {"S": "FATAL", "V": "FATAL", "C": "28P01",
                                 "M": f'password authentication failed for user "{user}"'}
    assert effects == [Signal.CLOSE] and not client.adapter.sessions


@async_test
async def test_empty_password_and_wrong_message_during_auth() -> None:
    client = AuthClient("password")
    await client.send(wc.startup({"user": "alice"}))
    replies, _ = await client.send(wc.password(b"\0"))
    assert error_of(replies)["C"] == "28P01"

    client = AuthClient("password")
    await client.send(wc.startup({"user": "alice"}))
    replies, effects = await client.send(wc.query("SELECT 1"))
    assert error_of(replies)["C"] == "08P01" and effects == [Signal.CLOSE]

    client = AuthClient("password")
    await client.send(wc.startup({"user": "alice"}))
    assert await client.send(wc.terminate()) == ([], [Signal.CLOSE])


@async_test
async def test_reject_rule() -> None:
    client = AuthClient("loopback=trust", address="10.9.8.7")
    replies, effects = await client.send(wc.startup({"user": "alice"}))
    assert error_of(replies)["C"] == "28000" and effects == [Signal.CLOSE]
    assert 'host "10.9.8.7", user "alice"' in error_of(replies)["M"]


# --- SCRAM-SHA-256 ------------------------------------------------------------------------------

async def scram_exchange(client: AuthClient, user: str, password: str) -> list[tuple[Any, ...]]:
    replies, _ = await client.send(wc.startup({"user": user}))
    assert replies == [("R", 10, ["SCRAM-SHA-256"])]
    scram = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
    replies, _ = await client.send(sasl_initial_response("SCRAM-SHA-256", scram.get_client_first()))
    assert [reply[:2] for reply in replies] == [("R", 11)]
    scram.set_server_first(replies[0][2].decode())
    replies, _ = await client.send(wc.password(scram.get_client_final().encode()))
    if replies[0][:2] == ("R", 12):
        scram.set_server_final(replies[0][2].decode())  # raises unless the server proved it knows the key
    return replies


@async_test
async def test_scram_success() -> None:
    client = AuthClient("scram-sha-256")
    replies = await scram_exchange(client, "alice", "wonderland")
    assert [reply[:2] for reply in replies[:2]] == [("R", 12), ("R", 0)] and replies[-1] == ("Z", "I")
    assert client.connection.state is ConnectionState.READY


@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("nobody", "x")])
@async_test
async def test_scram_bad_password_or_unknown_user_fail_alike(user: str, password: str) -> None:
    client = AuthClient("scram-sha-256")
    replies = await scram_exchange(client, user, password)
    assert error_of(replies)["C"] == "28P01" and wc.kinds(replies) == ["E"]
    assert client.connection.state is ConnectionState.CLOSED


@async_test
async def test_scram_wrong_mechanism_and_malformed_messages() -> None:
    client = AuthClient("scram-sha-256")
    await client.send(wc.startup({"user": "alice"}))
    replies, _ = await client.send(sasl_initial_response("SCRAM-SHA-1", "n,,n=,r=abc"))
    assert error_of(replies)["C"] == "28000"

    client = AuthClient("scram-sha-256")
    await client.send(wc.startup({"user": "alice"}))
    replies, _ = await client.send(sasl_initial_response("SCRAM-SHA-256", "garbage"))
    assert error_of(replies)["C"] == "08P01"

    client = AuthClient("scram-sha-256")
    await client.send(wc.startup({"user": "alice"}))
    replies, _ = await client.send(wc.password(b"SCRAM-SHA-256\0\0\0\0\x09short"))
    assert error_of(replies)["C"] == "08P01"


# --- TLS negotiation ----------------------------------------------------------------------------

@async_test
async def test_ssl_request_is_accepted_when_tls_is_configured() -> None:
    client = AuthClient("trust", tls=True)
    replies_raw = client.connection
    client.connection.receive_data(wc.ssl_request())
    assert await client.connection.step() == [Signal.START_TLS]
    assert replies_raw.take_output() == b"S"
    client.connection.tls_started()
    assert client.connection.tls_active
    # A second SSLRequest inside TLS is refused; then the startup goes on.
    client.connection.receive_data(wc.ssl_request())
    assert await client.connection.step() == [Signal.FLUSH]
    assert client.connection.take_output() == b"N"
    replies, _ = await client.send(wc.startup({"user": "alice"}))
    assert replies[-1] == ("Z", "I")


@async_test
async def test_gssenc_is_refused_even_with_tls() -> None:
    client = AuthClient("trust", tls=True)
    client.connection.receive_data(wc.gssenc_request())
    assert await client.connection.step() == [Signal.FLUSH]
    assert client.connection.take_output() == b"N"


@async_test
async def test_data_pipelined_after_ssl_request_is_a_protocol_violation() -> None:
    client = AuthClient("trust", tls=True)
    replies, effects = await client.send(wc.ssl_request(), wc.startup({"user": "alice"}))
    assert error_of(replies)["C"] == "08P01" and effects == [Signal.CLOSE]


# --- the role catalog ---------------------------------------------------------------------------

def test_roles_keep_verifiers_not_passwords(tmp_path: Any) -> None:
    roles = RoleCatalog(tmp_path)
    roles.create("bob", login=True, password="hunter2")
    stored = (tmp_path / "roles.json").read_text()
    assert "hunter2" not in stored and "SCRAM-SHA-256$4096:" in stored
    reopened = RoleCatalog(tmp_path)
    verifier = reopened.password_verifier("bob")
    assert verifier is not None and verifier.matches_password("hunter2") and not verifier.matches_password("x")
    assert [(role.name, role.oid, role.superuser) for role in reopened.list_roles()] == \
        [("headrace", 10, True), ("bob", 16384, False)]
    reopened.alter("bob", password=None, clear_password=True)
    assert RoleCatalog(tmp_path).password_verifier("bob") is None
    # A verifier given in PostgreSQL's form is kept as is.
    reopened.alter("bob", password=roles.find("bob").verifier)  # type: ignore[union-attr]
    assert RoleCatalog(tmp_path).password_verifier("bob").matches_password("hunter2")  # type: ignore[union-attr]
    reopened.drop("bob")
    assert RoleCatalog(tmp_path).find("bob") is None
