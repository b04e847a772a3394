"""Every clause of CREATE SOURCE ... FROM WEBHOOK, secrets, ALTER / DROP SOURCE, against a real
server: formats, header columns and filters, CHECK with secrets, WINDOW, and that secrets never
show up anywhere but where they are used."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from typing import Any

import psycopg
import pytest

from headrace.store import serving
from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.webhook_client import Response, post_webhook

pytestmark = pytest.mark.e2e

SECRET_VALUE = "hunter2-super-secret-value"


def run(server: HeadraceProcess, *statements: str) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def query(server: HeadraceProcess, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def sql_error(server: HeadraceProcess, statement: str) -> psycopg.Error:
    with psycopg.connect(server.dsn, autocommit=True) as conn, pytest.raises(psycopg.Error) as raised:
        conn.execute(statement)
    return raised.value


def post(server: HeadraceProcess, name: str, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return post_webhook(server.webhook_url(name), body, headers)


def rows_of(server: HeadraceProcess, sql: str, count: int) -> list[tuple[Any, ...]]:
    return wait_for(lambda: (found := query(server, sql)) and len(found) == count and found, timeout=90,
                    message=f"{count} rows of {sql}")  # type: ignore[return-value]


def test_text_json_ndjson_and_json_array_bodies(server: HeadraceProcess) -> None:
    run(server,
        "CREATE SOURCE fmt_text FROM WEBHOOK BODY FORMAT TEXT",
        "CREATE SOURCE fmt_json FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')",
        "CREATE SOURCE fmt_array FROM WEBHOOK BODY FORMAT JSON ARRAY IDEMPOTENT (body->>'id')")
    assert post(server, "fmt_text", "héllo\nworld".encode()).status_code == 200
    assert post(server, "fmt_text", b"\xff\xfe").status_code == 400
    assert post(server, "fmt_json", b'{"id": "a", "n": 1}\n{"id": "b", "n": 2}\n').status_code == 200
    assert post(server, "fmt_json", b'{"id": "c"} {').status_code == 400  # one bad row: nothing written
    assert post(server, "fmt_array", b'[{"id": "x", "n": 1}, {"id": "y", "n": 2}, {"id": "z", "n": 3}]').status_code == 200
    assert post(server, "fmt_array", b'{"id": "solo", "n": 4}').status_code == 200
    assert post(server, "fmt_array", b"[]").status_code == 200

    assert rows_of(server, "SELECT body FROM fmt_text", 1) == [("héllo\nworld",)]
    assert rows_of(server, "SELECT idempotency_key, (body->>'n')::int FROM fmt_json ORDER BY 1", 2) == [("a", 1), ("b", 2)]
    assert rows_of(server, "SELECT idempotency_key FROM fmt_array ORDER BY 1", 4) == [("solo",), ("x",), ("y",), ("z",)]
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        description = conn.execute("SELECT body, received_at FROM fmt_text").description
        assert [column.type_code for column in description] == [25, 1184]  # text, timestamptz


@pytest.mark.skipif("BLOB" not in serving.SUPPORTED_TYPES, reason="the serving store cannot hold bytea columns yet")
def test_bytes_body_and_bytes_header_column(server: HeadraceProcess) -> None:
    run(server, "CREATE SOURCE fmt_bytes FROM WEBHOOK BODY FORMAT BYTES INCLUDE HEADER 'x-raw' AS raw BYTES")
    payload = b"\x00\xff\x10binary"
    assert post(server, "fmt_bytes", payload, {"X-Raw": "r1"}).status_code == 200
    assert rows_of(server, "SELECT body, raw FROM fmt_bytes", 1) == [(payload, b"r1")]


def test_header_columns_and_header_filters(server: HeadraceProcess) -> None:
    run(server, "CREATE SOURCE hdrs FROM WEBHOOK BODY FORMAT JSON "
                "INCLUDE HEADER 'x-event-type' AS event_type INCLUDE HEADER 'x-missing' AS missing "
                "INCLUDE HEADERS (NOT 'authorization', NOT 'user-agent')")
    response = post(server, "hdrs", b'{"a": 1}', {"X-Event-Type": "order.paid", "Authorization": "Bearer t",
                                                 "X-Custom": "c"})
    assert response.status_code == 200
    [(event_type, missing, custom, authorization)] = rows_of(
        server, "SELECT event_type, missing, headers->>'x-custom', headers->>'authorization' FROM hdrs", 1)
    assert (event_type, missing, custom, authorization) == ("order.paid", None, "c", None)


def signed(body: bytes, secret: str = SECRET_VALUE) -> dict[str, str]:
    return {"X-Signature": hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()}


CHECKED = ("CREATE SOURCE checked FROM WEBHOOK BODY FORMAT JSON "
           "CHECK (WITH (BODY AS raw BYTES, HEADERS, SECRET hook_secret AS key BYTES) "
           "constant_time_eq(encode(hmac(raw, key, 'sha256'), 'hex'), headers['x-signature'])) "
           "IDEMPOTENT (body->>'id')")


def test_check_with_a_secret_accepts_signed_requests_only(server: HeadraceProcess) -> None:
    run(server, f"CREATE SECRET hook_secret AS '{SECRET_VALUE}'", CHECKED)
    good = b'{"id": "ok"}'
    assert post(server, "checked", good, signed(good)).status_code == 200
    for headers in (signed(good, "wrong"), {}, {"X-Signature": "zz"}):
        response = post(server, "checked", b'{"id": "forged"}', headers)
        assert (response.status_code, response.text) == (400, "request failed the CHECK")
    assert rows_of(server, "SELECT idempotency_key FROM checked", 1) == [("ok",)]

    # ALTER SECRET: the next request is checked against the new value
    run(server, "ALTER SECRET hook_secret AS 'rotated'")
    rotated = b'{"id": "after-rotation"}'
    assert post(server, "checked", rotated, signed(rotated)).status_code == 400
    assert post(server, "checked", rotated, signed(rotated, "rotated")).status_code == 200
    assert rows_of(server, "SELECT idempotency_key FROM checked ORDER BY 1", 2) == [("after-rotation",), ("ok",)]

    # a secret in use cannot be dropped; CASCADE drops its sources, whose endpoint is gone at once
    error = sql_error(server, "DROP SECRET hook_secret")
    assert error.sqlstate == "2BP01" and "checked" in str(error)
    run(server, "DROP SECRET hook_secret CASCADE")
    assert post(server, "checked", good, signed(good, "rotated")).status_code == 404
    assert ("hook_secret",) not in query(server, "SHOW SECRETS")


def test_secrets_are_never_shown_or_stored_with_the_catalog(server: HeadraceProcess) -> None:
    run(server, f"CREATE SECRET quiet AS '{SECRET_VALUE}'",
        "CREATE SECRET IF NOT EXISTS quiet AS 'other'",
        "CREATE SECRET quiet_bytes AS decode('c2VjcmV0', 'base64')",
        "CREATE SOURCE quiet_src FROM WEBHOOK BODY FORMAT JSON CHECK (WITH (SECRET quiet) quiet = 'x')")
    assert {("quiet",), ("quiet_bytes",)} <= set(query(server, "SHOW SECRETS"))
    error = sql_error(server, f"CREATE SECRET quiet AS '{SECRET_VALUE}'")
    assert SECRET_VALUE not in str(error) and error.sqlstate == "42710"
    error = sql_error(server, "CREATE SECRET broken AS decode('hunter2!', 'base64')")
    assert "hunter2" not in str(error) and "hunter2" not in str(error.diag.message_detail)
    response = post(server, "quiet_src", b"{}")
    assert response.status_code == 400 and SECRET_VALUE not in response.text
    catalog = (server.data_dir / "catalog.json").read_text()
    assert "quiet" in catalog and SECRET_VALUE not in catalog
    secrets_file = server.data_dir / "secrets.json"
    assert stat.S_IMODE(os.stat(secrets_file).st_mode) == 0o600
    assert SECRET_VALUE not in server.output()
    error = sql_error(server, "CREATE SOURCE no_secret FROM WEBHOOK BODY FORMAT JSON CHECK (WITH (SECRET nope) nope = '')")
    assert 'unknown secret "nope"' in str(error)
    run(server, "DROP SOURCE quiet_src", "DROP SECRET quiet, quiet_bytes", "DROP SECRET IF EXISTS quiet")


def test_alter_source_window_and_its_bounds(server: HeadraceProcess) -> None:
    run(server, "CREATE SOURCE window_bounds FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id') WINDOW '3 days'")
    stored = json.loads((server.data_dir / "catalog.json").read_text())
    [entry] = [item for item in stored["items"] if "window_bounds" in item["create_sql"]]
    assert entry["create_sql"].endswith("WINDOW '3 days'")
    run(server, "ALTER SOURCE window_bounds SET (WINDOW = '7 days')")
    stored = json.loads((server.data_dir / "catalog.json").read_text())
    assert any(item["create_sql"].endswith("WINDOW '7 days'") for item in stored["items"])
    for window in ("'0 hours'", "'31 days'", "'-1 day'"):
        assert sql_error(server, f"ALTER SOURCE window_bounds SET (WINDOW = {window})").sqlstate == "22023"
    error = sql_error(server, "CREATE SOURCE too_long FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id') WINDOW '60 days'")
    assert error.sqlstate == "22023" and "maximum" in str(error)
    run(server, "CREATE SOURCE unkeyed FROM WEBHOOK BODY FORMAT JSON")
    assert sql_error(server, "ALTER SOURCE unkeyed SET (WINDOW = '1 day')").sqlstate == "0A000"
    assert sql_error(server, "ALTER SOURCE nowhere SET (WINDOW = '1 day')").sqlstate == "42P01"
    # the source still takes requests after the ALTER
    assert post(server, "window_bounds", b'{"id": "w"}').status_code == 200
    assert rows_of(server, "SELECT idempotency_key FROM window_bounds", 1) == [("w",)]


def test_drop_source_removes_its_endpoint_at_once(server: HeadraceProcess) -> None:
    run(server, "CREATE SOURCE short_lived FROM WEBHOOK BODY FORMAT JSON")
    assert post(server, "short_lived", b"{}").status_code == 200
    run(server, "DROP SOURCE short_lived")
    assert post(server, "short_lived", b"{}").status_code == 404
    assert ("short_lived", "webhook") not in query(server, "SHOW SOURCES")


def test_bad_expressions_fail_create_source(server: HeadraceProcess) -> None:
    cases = {
        "CREATE SOURCE bad1 FROM WEBHOOK BODY FORMAT JSON CHECK (length(body))": "CHECK must be a boolean",
        "CREATE SOURCE bad2 FROM WEBHOOK BODY FORMAT JSON CHECK (nope = 'x')": 'column "nope" does not exist',
        "CREATE SOURCE bad3 FROM WEBHOOK BODY FORMAT BYTES IDEMPOTENT (body->>'id')": "operator does not exist",
        "CREATE SOURCE bad4 FROM WEBHOOK BODY FORMAT XML": "syntax error",
    }
    for statement, message in cases.items():
        assert message in str(sql_error(server, statement)), statement
    assert not any(name.startswith("bad") for name, _ in query(server, "SHOW SOURCES"))
