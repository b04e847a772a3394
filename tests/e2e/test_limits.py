"""Hostile input against a real server, from outside the process (issue 20): DuckDB's file functions and other
escapes refused over pgwire and HTTP, statement size / depth limits while webhooks keep answering, message length
caps before and after authentication, the connection limit, the authentication timeout, hostssl rules and the
refusal to trust the world on a public address."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, free_port
from tests.e2e.test_auth_tls import make_self_signed_certificate

pytestmark = pytest.mark.e2e

MAX_CONNECTIONS = 12
AUTH_TIMEOUT_S = 2.0
SECRET_VALUE = "hunter2-do-not-leak"
AUTH_RULES = "headrace@loopback=trust,hostssl all=scram-sha-256"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadraceProcess]:
    directory = tmp_path_factory.mktemp("limits")
    cert, key = make_self_signed_certificate(directory)
    process = HeadraceProcess(directory / "data", extra_args=[
        "--tls-cert", str(cert), "--tls-key", str(key), "--auth", AUTH_RULES,
        "--max-connections", str(MAX_CONNECTIONS), "--auth-timeout", str(AUTH_TIMEOUT_S)])
    process.start()
    with psycopg.connect(process.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SECRET leak_me AS '{SECRET_VALUE}'")
        conn.execute("CREATE ROLE tls_user LOGIN PASSWORD 'tls-secret'")
        conn.execute("CREATE SOURCE hooks FROM WEBHOOK BODY FORMAT JSON")
    yield process
    process.stop()


def sqlstate_of(server: HeadraceProcess, sql: str) -> tuple[str | None, str]:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        try:
            rows = conn.execute(sql).fetchall()
        except psycopg.Error as error:
            return error.sqlstate, str(error)
    return None, repr(rows)


def http_sql(server: HeadraceProcess, sql: str) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/api/sql",
                                     data=json.dumps({"query": sql}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


# --- file access ----------------------------------------------------------------------------------------------

FILE_FUNCTIONS = ["read_text", "read_blob", "read_csv", "read_csv_auto", "read_json", "read_json_auto",
                  "read_json_objects", "read_ndjson", "read_parquet", "parquet_scan", "parquet_metadata", "sniff_csv",
                  "query", "query_table"]


@pytest.mark.parametrize("function", FILE_FUNCTIONS)
def test_file_functions_are_unknown_functions(limited: HeadraceProcess, function: str) -> None:
    secrets = limited.data_dir.resolve() / "secrets.json"
    assert secrets.exists()
    for sql in (f"SELECT * FROM {function}('{secrets}')", f"SELECT {function}('/etc/shadow')",
                f"SELECT count(*) FROM (SELECT * FROM {function}('/etc/passwd')) AS t"):
        state, text = sqlstate_of(limited, sql)
        assert state == "42883", (sql, state, text)
        assert f"function {function}(unknown) does not exist" in text
        status, body = http_sql(limited, sql)
        assert '"code":"42883"' in body.replace(" ", ""), (status, body)
        assert SECRET_VALUE not in text and SECRET_VALUE not in body


@pytest.mark.parametrize("sql", [
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM '/etc/passwd'",
    "ATTACH '/tmp/headrace-limits-attach.duckdb' AS other",
    "INSTALL httpfs",
    "LOAD httpfs",
    "COPY (SELECT 1) TO '/tmp/headrace-limits-copy.csv'",
    "SET enable_external_access = true",
    "SET threads = 1",
    "PRAGMA enable_profiling",
    "SELECT current_setting('enable_external_access')",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM duckdb_secrets()",
    "SELECT getvariable('x')",
])
def test_store_escapes_are_refused(limited: HeadraceProcess, sql: str) -> None:
    state, text = sqlstate_of(limited, sql)
    assert state is not None and state != "XX000" or sql.startswith("SET "), (state, text)
    status, body = http_sql(limited, sql)
    assert '"XX000"' not in body
    assert not Path("/tmp/headrace-limits-copy.csv").exists()
    assert not Path("/tmp/headrace-limits-attach.duckdb").exists()
    # SET only changes headrace's session variable of that name, never the store's settings:
    with psycopg.connect(limited.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(f"SELECT * FROM read_text('{limited.data_dir.resolve() / 'secrets.json'}')")
        assert refused.value.sqlstate == "42883"


def test_secrets_file_is_not_readable_through_sql(limited: HeadraceProcess) -> None:
    secrets = str(limited.data_dir.resolve() / "secrets.json")
    attempts = [f"SELECT * FROM read_text('{secrets}')", f"SELECT * FROM read_json('{secrets}')",
                f"SELECT * FROM read_blob('{secrets}')", f"SELECT * FROM read_csv('{secrets}')",
                f"SELECT pg_read_file('{secrets}')", f"SELECT * FROM READ_TEXT('{secrets}')",
                f"SELECT * FROM \"read_text\"('{secrets}')", f"SELECT * FROM main.read_text('{secrets}')"]
    for sql in attempts:
        state, text = sqlstate_of(limited, sql)
        assert state is not None and state != "XX000", (sql, state, text)
        assert SECRET_VALUE not in text
        assert SECRET_VALUE not in http_sql(limited, sql)[1]


# --- statements -----------------------------------------------------------------------------------------------

def test_internal_errors_are_postgresql_errors(limited: HeadraceProcess) -> None:
    assert sqlstate_of(limited, "SELECT $0")[0] == "42P02"
    assert sqlstate_of(limited, "SELECT " + "(" * 1000 + "1" + ")" * 1000)[0] == "54001"
    assert sqlstate_of(limited, "SELECT " + "+".join(["1"] * 5000))[0] == "54001"
    state, text = sqlstate_of(limited, "SELECT " + ", ".join(["1"] * 50_000))
    assert state == "54011" and "target lists can have at most 1664 entries" in text
    with psycopg.connect(limited.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as deep:
            conn.execute("SELECT " + "+".join(["1"] * 5000))
        assert deep.value.diag.message_hint and "max_stack_depth" in deep.value.diag.message_hint
    status, body = http_sql(limited, "SELECT $0")
    assert "42P02" in body


def test_ten_megabyte_statement_is_refused_quickly_while_webhooks_answer(limited: HeadraceProcess) -> None:
    latencies: list[float] = []
    stop = threading.Event()

    def send_webhooks() -> None:
        with socket.create_connection(("127.0.0.1", limited.http_port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            number = 0
            while not stop.is_set():
                body = json.dumps({"n": number}).encode()
                request = (f"POST /api/webhook/headrace/public/hooks HTTP/1.1\r\nHost: x\r\n"
                           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
                started = time.perf_counter()
                sock.sendall(request)
                answer = b""
                while b"\r\n\r\n" not in answer:
                    answer += sock.recv(4096)
                latencies.append(time.perf_counter() - started)
                assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
                number += 1
                time.sleep(0.01)

    sender = threading.Thread(target=send_webhooks)
    sender.start()
    try:
        time.sleep(2.0)
        baseline = sorted(latencies[10:])  # this machine's own noise (CPU shared with other work)
        huge = "SELECT " + "+".join(["1"] * 5_000_000)  # 10 MB
        started = time.monotonic()
        state, text = sqlstate_of(limited, huge)
        assert state == "54000" and "statement is too long" in text
        assert time.monotonic() - started < 5.0
        status, body = http_sql(limited, huge[:2_000_000])  # (the HTTP port caps bodies at 5 MiB itself: 413)
        assert "54000" in body and "statement is too long" in body, (status, body[:200])
        # Just under the size limit and not deep: parsed for real (seconds of sqlglot), off the event loop.
        parsed_for_long = "SELECT 1 WHERE 1 IN (" + ",".join(["1"] * 40_000) + ")"
        assert len(parsed_for_long) < 1 << 20
        during = len(latencies)
        started = time.monotonic()
        state, text = sqlstate_of(limited, parsed_for_long)
        parse_seconds = time.monotonic() - started
        assert state is None, text
        time.sleep(0.2)
    finally:
        stop.set()
        sender.join()
    while_parsing = sorted(latencies[during:])
    assert parse_seconds > 0.5 and len(while_parsing) >= 10
    p50, p99 = while_parsing[len(while_parsing) // 2], while_parsing[int(len(while_parsing) * 0.99) - 1]
    baseline_p99 = baseline[int(len(baseline) * 0.99) - 1]
    print(f"statement parsed and planned in {parse_seconds:.1f}s; {len(while_parsing)} webhooks meanwhile: "
          f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {while_parsing[-1] * 1000:.1f} ms "
          f"(before: p99 {baseline_p99 * 1000:.1f} ms)")
    # Parsed on the event loop, every webhook during the parse would wait for all of it (seconds). The parse thread
    # shares the GIL (and sqlglot's tree is cyclic garbage for the collector) and, in CI, the cores with other work:
    # the median must stay within 50 ms, the tail is bounded loosely against the same run's baseline.
    assert p50 < 0.050
    assert p99 < max(0.250, 3 * baseline_p99)
    assert while_parsing[-1] < parse_seconds / 2


# --- messages and connections --------------------------------------------------------------------------------

def startup_packet(user: str) -> bytes:
    body = struct.pack("!i", 196608) + f"user\0{user}\0database\0headrace\0\0".encode()
    return struct.pack("!i", len(body) + 4) + body


def read_messages(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(timeout)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
        pass
    return received


def error_fields(data: bytes) -> dict[str, str]:
    at = data.index(b"E")
    length = struct.unpack("!i", data[at + 1:at + 5])[0]
    fields = {}
    for part in data[at + 5:at + 1 + length].split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode()
    return fields


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def send_quietly(sock: socket.socket, data: bytes) -> int:
    try:
        sock.sendall(data)
        return len(data)
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
        return 0


def test_huge_length_before_authentication_is_refused_without_buffering(limited: HeadraceProcess) -> None:
    assert limited.process is not None
    before = rss_kib(limited.process.pid)
    with socket.create_connection(("127.0.0.1", limited.pg_port), timeout=10) as sock:
        sock.sendall(startup_packet("tls_user"))  # hostssl: no rule for a plain connection, refused at once
        assert error_fields(read_messages(sock))["C"] == "28000"
    with socket.create_connection(("127.0.0.1", limited.pg_port), timeout=10) as sock:
        sock.sendall(struct.pack("!i", (1 << 30) - 1) + b"\0" * 65536)  # a startup packet claiming 1 GB
        error = error_fields(read_messages(sock))
        assert error["C"] == "08P01" and error["S"] == "FATAL"
    with tls_connection(limited) as tls:
        # A user who must still authenticate (SCRAM over TLS) answers AuthenticationSASL with a message claiming
        # 1 GB, and keeps sending: the server must refuse at the length, not buffer 50 MB.
        tls.sendall(startup_packet("tls_user"))
        assert tls.recv(65536)[:1] == b"R"
        chunk = b"p" + struct.pack("!i", (1 << 30) - 1) + b"x" * (1 << 20)
        for _ in range(50):
            if not send_quietly(tls, chunk):
                break
        answer = read_messages(tls)
        assert error_fields(answer)["C"] == "08P01"
    assert rss_kib(limited.process.pid) - before < 30 * 1024, "the server buffered what the client sent"


def test_message_over_the_cap_after_authentication_is_54000(limited: HeadraceProcess) -> None:
    with socket.create_connection(("127.0.0.1", limited.pg_port), timeout=10) as sock:
        sock.sendall(startup_packet("headrace"))
        greeting = b""
        while b"Z\0\0\0\x05" not in greeting:
            greeting += sock.recv(65536)
        sock.sendall(b"Q" + struct.pack("!i", (1 << 30) - 1) + b"SELECT ")
        error = error_fields(read_messages(sock))
        assert error["C"] == "54000" and "exceeds the server's limit" in error["M"]


def test_connection_limit_is_53300(limited: HeadraceProcess) -> None:
    connections = []
    try:
        refused: psycopg.OperationalError | None = None
        for _ in range(MAX_CONNECTIONS + 1):
            try:
                connections.append(psycopg.connect(limited.dsn, autocommit=True, connect_timeout=5))
            except psycopg.OperationalError as error:
                refused = error
                break
        assert refused is not None and "sorry, too many clients already" in str(refused)
        assert connections[0].execute("SELECT current_setting('max_connections')").fetchone() == (str(MAX_CONNECTIONS),)
        assert len(connections) <= MAX_CONNECTIONS
    finally:
        for connection in connections:
            connection.close()
    time.sleep(0.2)
    with psycopg.connect(limited.dsn, autocommit=True) as conn:  # slots free again
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_idle_unauthenticated_sockets_are_closed_by_the_auth_timeout(limited: HeadraceProcess) -> None:
    silent = [socket.create_connection(("127.0.0.1", limited.pg_port)) for _ in range(300)]
    stalled = []
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", limited.pg_port))
        sock.sendall(startup_packet("headrace")[:10])  # half a startup packet, then nothing
        stalled.append(sock)
    try:
        started = time.monotonic()
        for sock in silent + stalled:
            assert read_messages(sock, timeout=AUTH_TIMEOUT_S + 10) == b""  # closed without a word, as PostgreSQL
        assert time.monotonic() - started < AUTH_TIMEOUT_S + 10
    finally:
        for sock in silent + stalled:
            sock.close()
    time.sleep(0.2)
    with psycopg.connect(limited.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def tls_connection(server: HeadraceProcess) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", server.pg_port), timeout=10)
    sock.sendall(struct.pack("!ii", 8, 80877103))  # SSLRequest
    assert sock.recv(1) == b"S"
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context.wrap_socket(sock)


def test_auth_timeout_during_a_password_exchange_is_fatal(limited: HeadraceProcess) -> None:
    with tls_connection(limited) as tls:
        tls.sendall(startup_packet("tls_user"))
        assert tls.recv(65536)[:1] == b"R"  # AuthenticationSASL: the server waits for the client's answer
        started = time.monotonic()
        error = error_fields(read_messages(tls, timeout=AUTH_TIMEOUT_S + 10))
        assert error["C"] == "57014" and "canceling authentication due to timeout" in error["M"]
        assert AUTH_TIMEOUT_S - 0.5 < time.monotonic() - started < AUTH_TIMEOUT_S + 5


# --- hostssl and trust on public addresses -----------------------------------------------------------------------

def test_hostssl_requires_tls(limited: HeadraceProcess) -> None:
    base = f"host=127.0.0.1 port={limited.pg_port} user=tls_user password=tls-secret dbname=headrace connect_timeout=5"
    with psycopg.connect(base + " sslmode=require", autocommit=True) as conn:
        assert conn.pgconn.ssl_in_use and conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(base + " sslmode=disable")
    assert 'no pg_hba.conf entry for host "127.0.0.1", user "tls_user", database "headrace", no encryption' \
        in str(refused.value)
    result = subprocess.run(["psql", f"{base} sslmode=disable", "-c", "SELECT 1"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PGCONNECT_TIMEOUT": "5"})
    assert result.returncode != 0 and "no pg_hba.conf entry" in result.stderr


@pytest.mark.parametrize("auth", ["trust", "all=trust", "10.0.0.0/8=trust,all=scram-sha-256"])
def test_trusting_the_world_on_a_public_address_is_refused(tmp_path: Path, auth: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "headrace.cli", "up", "--data-dir", str(tmp_path / "data"), "--host", "0.0.0.0",
         "--pg-port", str(free_port()), "--http-port", str(free_port()), "--auth", auth],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "refusing to listen on 0.0.0.0" in result.stderr and "--insecure" in result.stderr
    assert not (tmp_path / "data" / "store.duckdb").exists()


def test_the_locked_down_store_still_materializes(limited: HeadraceProcess) -> None:
    """Nothing the store does needs external access: webhook rows still reach SQL through the pipeline."""
    for number in range(5):
        request = urllib.request.Request(limited.webhook_url("hooks"), data=json.dumps({"check": number}).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
    deadline = time.monotonic() + 240  # Spark's first batch, on a busy machine
    visible = 0
    while time.monotonic() < deadline:
        state, text = sqlstate_of(limited, "SELECT count(*) FROM hooks WHERE body->>'check' IS NOT NULL")
        if state is None and (visible := int(text.strip("[](),"))) == 5:
            break
        time.sleep(1)
    assert visible == 5, text
