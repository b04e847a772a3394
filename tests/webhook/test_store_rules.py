"""The store's rules at ingest (webhook/store_rules.py, webhook/handler.py): what PostgreSQL 15's jsonb and text
refuse is refused with 400 and PostgreSQL's own message, and nothing is written. The rules are checked against a
real PostgreSQL 15 on a corpus of escapes: the rule refuses exactly what `::jsonb` refuses, with its SQLSTATE."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.catalog.items import WebhookSource
from headrace.sql.ddl import item_from_create_sql
from headrace.webhook.handler import WebhookHandler, WebhookRejected
from headrace.webhook.store_rules import jsonb_refusal, text_bytes_refusal
from tests.real_servers.postgres import PostgresCluster


def source(clauses: str = "", fmt: str = "JSON") -> WebhookSource:
    return replace(item_from_create_sql("u1", f"CREATE SOURCE events FROM WEBHOOK BODY FORMAT {fmt} {clauses}"))


def rejected(item: WebhookSource, body: bytes, headers: list[tuple[str, str]] | None = None) -> str:
    with pytest.raises(WebhookRejected) as raised:
        WebhookHandler(item).validate(headers or [], body, 0)
    assert raised.value.status == 400
    return raised.value.message


ESCAPES = [
    r'"\ud800"', r'"\udbff"', r'"\udc00"', r'"\udfff"', r'"\ud800\u0041"', r'"\ud800\ud800"', r'"\ud800x"',
    r'"a\ud800"', r'"\ud83d\ude00"', r'"\uD83D\uDE00"', r'"\u0000"', r'"x\u0000y"', r'"\\u0000"', r'"\\\u0000"',
    r'"\\ud800"', r'"\\\ud800"', r'"\u0041"', r'"\n\t\""', r'{"a": "\ud800", "b": 1}', r'{"\u0000": 1}',
    r'["\ud83d", "\ude00"]', r'"\ud83d\\ude00"', r'"\ud83d\n"', r'"\udc00\ud800"', r'"plain"', r'{"a": [1, 2.5]}',
]


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[psycopg.Connection]:
    with PostgresCluster(Path(tmp_path_factory.mktemp("rules-pg")) / "pg") as cluster:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            yield conn


def postgres_jsonb(conn: psycopg.Connection, text: str) -> tuple[str, str, str] | None:
    try:
        conn.execute("SELECT %s::jsonb", (text,))
    except psycopg.Error as error:
        return error.sqlstate or "", error.diag.message_primary or "", error.diag.message_detail or ""
    return None


@pytest.mark.parametrize("text", ESCAPES)
def test_jsonb_rule_matches_postgres(postgres: psycopg.Connection, text: str) -> None:
    refusal = jsonb_refusal(text.encode())
    expected = postgres_jsonb(postgres, text)
    assert (None if refusal is None else (refusal.sqlstate, refusal.message, refusal.detail)) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([r"\u0000", r"\ud800", r"\udbff", r"\udc00", r"\ude00", r"\u0041", r"\\", "u",
                                 "a", r"\n", "0"]), max_size=6))
def test_jsonb_rule_matches_postgres_on_generated_escapes(postgres: psycopg.Connection, parts: list[str]) -> None:
    text = '"' + "".join(parts) + '"'
    json.loads(text)  # valid JSON for Python: the rule only decides what jsonb adds
    refusal = jsonb_refusal(text.encode())
    assert (None if refusal is None else refusal.sqlstate) == (
        None if (found := postgres_jsonb(postgres, text)) is None else found[0])


def test_text_rule_matches_postgres(postgres: psycopg.Connection) -> None:
    refusal = text_bytes_refusal(b"a\x00b")
    assert refusal is not None
    with pytest.raises(psycopg.Error) as raised:
        postgres.execute(b"SELECT convert_from('\\x610062'::bytea, 'UTF8')")
    assert (refusal.sqlstate, refusal.message) == (raised.value.sqlstate, raised.value.diag.message_primary)
    assert text_bytes_refusal("héllo".encode()) is None


@pytest.mark.parametrize("fmt", ["JSON", "JSON ARRAY"])
@pytest.mark.parametrize(("body", "sqlstate", "detail"), [
    (rb'"\ud800"', "22P02", "Unicode low surrogate must follow a high surrogate."),
    (rb'{"a": "x\udc00"}', "22P02", "Unicode low surrogate must follow a high surrogate."),
    (rb'{"a": "\u0000"}', "22P05", r"\u0000 cannot be converted to text."),
    (b'[{"ok": 1}, {"a": "\\ud800"}]', "22P02", "Unicode low surrogate"),  # any row of the body
    (b'[{"ok": 1}, "\\u0000"]', "22P05", "cannot be converted to text"),
])
def test_json_bodies_the_store_refuses_are_400(fmt: str, body: bytes, sqlstate: str, detail: str) -> None:
    message = rejected(source(fmt=fmt), body)
    assert message.startswith("request body is refused by the store: ")
    assert detail in message and f"SQLSTATE {sqlstate}" in message


def test_the_refusal_holds_whatever_reads_the_body() -> None:
    # the keyed source evaluates the body (Python's decoder); the unread one validates with orjson
    for clauses in ("", "IDEMPOTENT (body->>'id')", "IDEMPOTENT (headers->>'k')"):
        assert "22P02" in rejected(source(clauses), rb'{"id": "a", "v": "\ud800"}', [("k", "1")])


def test_raw_utf8_surrogates_are_invalid_utf8() -> None:
    for fmt in ("JSON", "JSON ARRAY", "TEXT"):
        assert "not valid UTF-8" in rejected(source(fmt=fmt), b'"\xed\xa0\x80"')


def test_nul_in_text_body_header_and_key() -> None:
    assert '0x00 (SQLSTATE 22021)' in rejected(source(fmt="TEXT"), b"a\x00b")
    assert "header is refused" in rejected(source("INCLUDE HEADERS"), b"{}", [("x-a", "a\x00b")])
    assert "header is refused" in rejected(source("INCLUDE HEADER 'x-a' AS a"), b"{}", [("x-a", "\x00")])
    assert "idempotency key is refused" in rejected(source("IDEMPOTENT (headers->>'k')"), b"{}", [("k", "\x00")])


def test_what_the_store_takes_is_accepted() -> None:
    for fmt, body in (("JSON", rb'{"e": "\ud83d\ude00", "s": "\\u0000", "n": "\n"}'), ("JSON ARRAY", rb'"\u0041"'),
                      ("TEXT", "héllo \\u0000".encode()), ("BYTES", b"\x00\xff")):
        (record,) = WebhookHandler(source("INCLUDE HEADERS", fmt=fmt)).validate([("x-a", "ok")], body, 0)
        assert record.body == body


def test_every_ndjson_row_is_checked() -> None:
    assert "22P02" in rejected(source(), b'{"ok": 1}\n{"a": "\\ud800"}\n')
