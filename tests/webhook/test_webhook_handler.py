"""Request validation, idempotency keys, the record codec and the ingest registry (no HTTP)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.catalog.items import WebhookSource
from headrace.errors import DuplicateObject, FeatureNotSupported, ServiceUnavailable, UndefinedColumn
from headrace.log.reader import read_records, scan_end
from headrace.webhook.handler import WebhookHandler, WebhookRejected
from headrace.webhook.ingest import IngestRegistry, SourceIngestor
from headrace.webhook.record import WebhookRecord, decode, encode


def source(key: str | None = None, *, include_headers: bool = False, body_format: str = "json") -> WebhookSource:
    return WebhookSource(id="u1", name="events", body_format=body_format, include_headers=include_headers,
                         idempotent_expr=key, create_sql="CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON")


def rejection(handler: WebhookHandler, body: bytes, headers: list[tuple[str, str]] | None = None) -> WebhookRejected:
    with pytest.raises(WebhookRejected) as raised:
        handler.validate(headers or [], body, 0)
    return raised.value


@given(
    received_at_us=st.integers(min_value=0, max_value=1 << 62),
    key=st.none() | st.text(),
    headers=st.none() | st.dictionaries(st.text(), st.text()),
    body_text=st.text(),
)
def test_record_round_trip(received_at_us: int, key: str | None, headers: dict[str, str] | None, body_text: str) -> None:
    record = WebhookRecord(received_at_us, key, headers, body_text)
    assert decode(encode(record)) == record


def test_record_encoding_is_compact() -> None:
    payload = encode(WebhookRecord(1700000000000000, None, None, '{"a":1}'))
    assert payload == b'{"t":1700000000000000,"b":"{\\"a\\":1}"}'
    assert encode(WebhookRecord(1, "k", {"x": "é"}, "[]")) == '{"t":1,"k":"k","h":{"x":"é"},"b":"[]"}'.encode()


def test_accepts_any_single_json_value() -> None:
    handler = WebhookHandler(source())
    for body in (b"{}", b"[1, 2]", b'"text"', b"42", b"null", b" true \n"):
        record = handler.validate([], body, 123)
        assert record == WebhookRecord(123, None, None, body.decode())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "request body is empty"),
        (b" \n ", "request body is empty"),
        (b"\xc3\x28", "not valid UTF-8"),
        (b"{", "not valid JSON"),
        (b"{} {}", "not valid JSON"),  # one value, not a stream
        (b"NaN", "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    ],
)
def test_rejects_bodies_that_are_not_one_json_value(body: bytes, message: str) -> None:
    rejected = rejection(WebhookHandler(source()), body)
    assert rejected.status == 400 and message in rejected.message


def test_headers_are_lowercased_joined_and_stored_only_when_included() -> None:
    headers = [("X-Event", "a"), ("x-event", "b"), ("Content-Type", "application/json"), ("X-Bad", "\udcff")]
    stored = WebhookHandler(source(include_headers=True)).validate(headers, b"{}", 0).headers
    assert stored == {"x-event": "a, b", "content-type": "application/json", "x-bad": "\ufffd"}
    encode(WebhookRecord(0, None, stored, "{}"))  # storable as UTF-8
    assert WebhookHandler(source()).validate(headers, b"{}", 0).headers is None


def test_key_expression_sees_headers_without_include_headers() -> None:
    handler = WebhookHandler(source("headers->>'idempotency-key'"))
    record = handler.validate([("Idempotency-Key", "k-1")], b"{}", 0)
    assert record.idempotency_key == "k-1" and record.headers is None


def test_keys_are_text_and_equal_documents_give_equal_keys() -> None:
    assert WebhookHandler(source("body->'id'")).validate([], b'{"id": 12}', 0).idempotency_key == "12"
    assert WebhookHandler(source("body->'id'")).validate([], b'{"id": "x"}', 0).idempotency_key == '"x"'
    by_object = WebhookHandler(source("body->'ref'"))
    first = by_object.validate([], b'{"ref": {"b": 1, "a": [1.0, true]}}', 0).idempotency_key
    second = by_object.validate([], b'{"ref":{"a":[1.0,true],"b":1}}', 0).idempotency_key
    assert first == second == '{"a": [1.0, true], "b": 1}'


def test_null_key_and_failing_key_are_400_without_internals() -> None:
    assert rejection(WebhookHandler(source("body->>'id'")), b'{"id": null}').message == "idempotency key is null"
    assert rejection(WebhookHandler(source("body->>'id'")), b"{}").message == "idempotency key is null"
    failing = rejection(WebhookHandler(source("((body->>'n')::int)::text")), b'{"n": "secret-value"}')
    assert failing.status == 400 and "secret-value" not in failing.message


def test_bad_definitions_fail_when_the_handler_is_built() -> None:
    with pytest.raises(UndefinedColumn):
        WebhookHandler(source("payload->>'id'"))
    with pytest.raises(FeatureNotSupported):
        WebhookHandler(source(body_format="bytes"))


def test_ingestor_appends_valid_requests_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        ingestor = SourceIngestor(source("body->>'id'"), tmp_path)
        first = await ingestor.ingest([], b'{"id": "a"}', 10)
        with pytest.raises(WebhookRejected):
            await ingestor.ingest([], b"oops", 11)
        second = await ingestor.ingest([], b'{"id": "b"}', 12)
        await ingestor.close()
        records = [(offset, decode(payload)) for offset, payload in read_records(tmp_path, 0, scan_end(tmp_path, 0))]
        assert [offset for offset, _ in records] == [first, second]
        assert [(r.received_at_us, r.idempotency_key) for _, r in records] == [(10, "a"), (12, "b")]

    asyncio.run(scenario())


def test_registry(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = IngestRegistry()
        ingestor = registry.add(source(), tmp_path / "u1")
        assert registry.lookup("headrace", "public", "events") is ingestor
        assert registry.lookup("headrace", "public", "other") is None
        with pytest.raises(DuplicateObject):
            registry.add(source(), tmp_path / "u1-again")
        await ingestor.ingest([], b"{}", 0)
        await registry.remove("headrace", "public", "events")
        assert registry.lookup("headrace", "public", "events") is None
        with pytest.raises(ServiceUnavailable):  # a request that looked it up just before the DROP
            await ingestor.ingest([], b"{}", 0)
        await registry.remove("headrace", "public", "events")  # removing twice is harmless
        registry.add(source(), tmp_path / "u2")
        await registry.close_all()
        assert len(registry) == 0

    asyncio.run(scenario())
