"""Authentication, roles and TLS against a real server: psycopg (libpq) and asyncpg over TLS with a
throwaway self-signed certificate, cleartext and SCRAM-SHA-256 passwords from CREATE ROLE, 28P01 on
a bad password, trust for the bootstrap superuser on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess

pytestmark = pytest.mark.e2e

# The cleartext user first (first match wins), the bootstrap superuser trusted on loopback, SCRAM for the rest.
AUTH_RULES = "clear_user@all=password,headrace@loopback=trust,all=scram-sha-256"


def make_self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadraceProcess]:
    directory = tmp_path_factory.mktemp("auth_tls")
    cert, key = make_self_signed_certificate(directory)
    process = HeadraceProcess(directory / "data",
                              extra_args=["--tls-cert", str(cert), "--tls-key", str(key), "--auth", AUTH_RULES])
    process.start()
    with psycopg.connect(process.dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE scram_user LOGIN PASSWORD 'scram-secret'")
        conn.execute("CREATE USER clear_user PASSWORD 'clear-secret'")  # USER implies LOGIN
        conn.execute("CREATE ROLE no_login PASSWORD 'whatever'")
    yield process
    process.stop()


def dsn(server: HeadraceProcess, user: str, password: str | None = None, sslmode: str = "prefer") -> str:
    text = f"host=127.0.0.1 port={server.pg_port} user={user} dbname=headrace sslmode={sslmode} connect_timeout=5"
    return text + (f" password={password}" if password is not None else "")


def test_tls_with_sslmode_require_and_plain_connections(secured: HeadraceProcess) -> None:
    with psycopg.connect(dsn(secured, "headrace", sslmode="require"), autocommit=True) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(dsn(secured, "headrace", sslmode="disable"), autocommit=True) as conn:
        assert not conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_encryption_requests_on_a_raw_socket(secured: HeadraceProcess) -> None:
    for code, answer in ((80877104, b"N"), (80877103, b"S")):  # GSSENCRequest, SSLRequest
        with socket.create_connection(("127.0.0.1", secured.pg_port), timeout=5) as sock:
            sock.sendall(struct.pack("!ii", 8, code))
            assert sock.recv(1) == answer


@pytest.mark.parametrize("sslmode", ["require", "disable"])
def test_scram_password(secured: HeadraceProcess, sslmode: str) -> None:
    with psycopg.connect(dsn(secured, "scram_user", "scram-secret", sslmode), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.info.parameter_status("session_authorization") == "scram_user"
    with pytest.raises(psycopg.OperationalError, match='password authentication failed for user "scram_user"'):
        psycopg.connect(dsn(secured, "scram_user", "wrong", sslmode))


def test_cleartext_password_over_tls(secured: HeadraceProcess) -> None:
    with psycopg.connect(dsn(secured, "clear_user", "clear-secret", "require"), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match='password authentication failed for user "clear_user"'):
        psycopg.connect(dsn(secured, "clear_user", "nope", "require"))


def test_bad_password_sqlstate_is_28p01(secured: HeadraceProcess) -> None:
    async def attempt(user: str, password: str) -> Any:
        return await asyncpg.connect(host="127.0.0.1", port=secured.pg_port, user=user, password=password,
                                     database="headrace", ssl=False, timeout=5)

    for user in ("scram_user", "clear_user", "no_login", "nobody"):
        with pytest.raises(asyncpg.exceptions.InvalidPasswordError) as caught:
            asyncio.run(attempt(user, "wrong"))
        assert caught.value.sqlstate == "28P01"

    async def good() -> int:
        conn = await attempt("scram_user", "scram-secret")
        try:
            return int(await conn.fetchval("SELECT 1"))
        finally:
            await conn.close()
    assert asyncio.run(good()) == 1


def test_alter_and_drop_role(secured: HeadraceProcess) -> None:
    with psycopg.connect(secured.dsn, autocommit=True) as admin:
        admin.execute("CREATE ROLE rotating LOGIN PASSWORD 'first'")
        with psycopg.connect(dsn(secured, "rotating", "first"), autocommit=True) as conn:
            # Anyone may change their own password, nothing else.
            conn.execute("ALTER ROLE rotating PASSWORD 'second'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("CREATE ROLE sneaky LOGIN PASSWORD 'x'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("ALTER ROLE rotating SUPERUSER")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn(secured, "rotating", "first"))
        psycopg.connect(dsn(secured, "rotating", "second")).close()
        with pytest.raises(psycopg.errors.DuplicateObject):
            admin.execute("CREATE ROLE rotating")
        admin.execute("DROP ROLE rotating")
        with pytest.raises(psycopg.errors.UndefinedObject):
            admin.execute("DROP ROLE rotating")
        cursor = admin.execute("DROP ROLE IF EXISTS rotating")
        assert cursor.statusmessage == "DROP ROLE"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(dsn(secured, "rotating", "second"))


def test_passwords_are_stored_as_scram_verifiers_only(secured: HeadraceProcess) -> None:
    stored = (secured.data_dir / "roles.json").read_text()
    assert "scram-secret" not in stored and "clear-secret" not in stored
    roles = {role["name"]: role for role in json.loads(stored)["roles"]}
    assert roles["scram_user"]["verifier"].startswith("SCRAM-SHA-256$4096:")
    assert roles["no_login"]["login"] is False and roles["clear_user"]["login"] is True
