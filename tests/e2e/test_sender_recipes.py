"""The sender recipes of docs/webhooks.md, end to end: each signature is computed here the way the
sender computes it (from its published algorithm), posted to a real server, and checked:
a valid signature is 200 and its row is visible; a bad one is 400 and nothing is written; a replay
outside the tolerance (senders that sign a timestamp) is 400; a retry with the same key stays one row."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

import psycopg
import pytest

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.webhook_client import post_webhook

pytestmark = pytest.mark.e2e

# The statements exactly as docs/webhooks.md gives them (secret values are test values).
STANDARD_WEBHOOKS_SECRET = "whsec_" + base64.b64encode(b"standard-webhooks-test-key-32byt").decode()
RECIPES = {
    "standard": [
        f"CREATE SECRET standard_webhooks_secret AS '{STANDARD_WEBHOOKS_SECRET}'",
        """CREATE SOURCE standard_events FROM WEBHOOK BODY FORMAT JSON
  CHECK (
    WITH (BODY AS request_body BYTES, HEADERS, SECRET standard_webhooks_secret AS secret)
    constant_time_eq_any(
      string_to_array(headers['webhook-signature'], ' '),
      'v1,' || encode(hmac(
        convert_to(headers['webhook-id'] || '.' || headers['webhook-timestamp'] || '.', 'UTF8') || request_body,
        decode(split_part(secret, '_', 2), 'base64'),
        'sha256'), 'base64'))
    AND to_timestamp(headers['webhook-timestamp']::bigint)
        BETWEEN now() - interval '5 minutes' AND now() + interval '5 minutes'
  )
  IDEMPOTENT (headers['webhook-id']) WINDOW '4 days'""",
    ],
    "stripe": [
        "CREATE SECRET stripe_webhook_secret AS 'whsec_stripe_test_secret'",
        """CREATE SOURCE stripe_events FROM WEBHOOK BODY FORMAT JSON
  CHECK (
    WITH (BODY AS request_body BYTES, HEADERS, SECRET stripe_webhook_secret AS secret BYTES)
    constant_time_eq_any(
      string_to_array(headers['stripe-signature'], ','),
      'v1=' || encode(hmac(
        convert_to((regexp_match(headers['stripe-signature'], 't=([0-9]+)'))[1] || '.', 'UTF8') || request_body,
        secret, 'sha256'), 'hex'))
    AND to_timestamp((regexp_match(headers['stripe-signature'], 't=([0-9]+)'))[1]::bigint)
        > now() - interval '5 minutes'
  )
  IDEMPOTENT (body->>'id') WINDOW '4 days'""",
    ],
    "github": [
        "CREATE SECRET github_webhook_secret AS 'github-test-secret'",
        """CREATE SOURCE github_events FROM WEBHOOK BODY FORMAT JSON
  INCLUDE HEADER 'x-github-event' AS event
  CHECK (
    WITH (BODY AS request_body BYTES, HEADERS, SECRET github_webhook_secret AS secret BYTES)
    constant_time_eq(headers['x-hub-signature-256'], 'sha256=' || encode(hmac(request_body, secret, 'sha256'), 'hex'))
  )
  IDEMPOTENT (headers['x-github-delivery']) WINDOW '4 days'""",
    ],
    "shopify": [
        "CREATE SECRET shopify_webhook_secret AS 'shopify-test-secret'",
        """CREATE SOURCE shopify_events FROM WEBHOOK BODY FORMAT JSON
  INCLUDE HEADER 'x-shopify-topic' AS topic
  CHECK (
    WITH (BODY AS request_body BYTES, HEADERS, SECRET shopify_webhook_secret AS secret BYTES)
    constant_time_eq(headers['x-shopify-hmac-sha256'], encode(hmac(request_body, secret, 'sha256'), 'base64'))
  )
  IDEMPOTENT (headers['x-shopify-event-id']) WINDOW '24 hours'""",
    ],
    "segment": [
        "CREATE SECRET segment_shared_secret AS 'segment-test-secret'",
        """CREATE SOURCE segment_events FROM WEBHOOK BODY FORMAT JSON
  CHECK (
    WITH (BODY AS request_body BYTES, HEADERS, SECRET segment_shared_secret AS secret BYTES)
    constant_time_eq(headers['x-signature'], encode(hmac(request_body, secret, 'sha1'), 'hex'))
  )
  IDEMPOTENT (body->>'messageId') WINDOW '24 hours'""",
    ],
}


# ---- the senders' signing algorithms ------------------------------------------------------------------

def standard_webhooks_headers(msg_id: str, timestamp: int, body: bytes, secret: str = STANDARD_WEBHOOKS_SECRET) -> dict[str, str]:
    """standardwebhooks.com: base64 HMAC-SHA256 of "{id}.{timestamp}.{body}", keyed by the base64 after whsec_."""
    key = base64.b64decode(secret.split("_", 1)[1])
    signed = f"{msg_id}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": f"v1,{signature}"}


def stripe_headers(timestamp: int, body: bytes, secret: str = "whsec_stripe_test_secret") -> dict[str, str]:
    """Stripe: Stripe-Signature t=<ts>,v1=<hex HMAC-SHA256 of "{t}.{payload}" keyed by the signing secret>."""
    signature = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={timestamp},v1={signature},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"}


def github_headers(delivery: str, body: bytes, secret: str = "github-test-secret") -> dict[str, str]:
    """GitHub: X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>."""
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={signature}", "X-GitHub-Delivery": delivery, "X-GitHub-Event": "push"}


def shopify_headers(event_id: str, body: bytes, secret: str = "shopify-test-secret") -> dict[str, str]:
    """Shopify: X-Shopify-Hmac-SHA256: <base64 HMAC-SHA256 of the body>."""
    signature = base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()
    return {"X-Shopify-Hmac-SHA256": signature, "X-Shopify-Event-Id": event_id, "X-Shopify-Topic": "orders/create"}


def segment_headers(body: bytes, secret: str = "segment-test-secret") -> dict[str, str]:
    """Segment: X-Signature: <hex HMAC-SHA1 of the body>."""
    return {"X-Signature": hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()}


# ---- helpers ------------------------------------------------------------------------------------------------

def setup_recipe(server: HeadraceProcess, recipe: str) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        for statement in RECIPES[recipe]:
            conn.execute(statement)


def query(server: HeadraceProcess, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def eventually(server: HeadraceProcess, sql: str, expected: list[tuple[Any, ...]]) -> None:
    wait_for(lambda: query(server, sql) == expected, timeout=90, message=f"{sql} == {expected}")


def status(server: HeadraceProcess, source: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    response = post_webhook(server.webhook_url(source), body, headers)
    return response.status_code, response.text


REJECTED = (400, "request failed the CHECK")


def test_standard_webhooks(server: HeadraceProcess) -> None:
    setup_recipe(server, "standard")
    body = json.dumps({"type": "invoice.paid", "data": {"amount": 1200}}).encode()
    now = int(time.time())
    assert status(server, "standard_events", body, standard_webhooks_headers("msg_1", now, body)) == (200, "")
    forged = standard_webhooks_headers("msg_2", now, body, secret="whsec_" + base64.b64encode(b"other").decode())
    assert status(server, "standard_events", body, forged) == REJECTED
    tampered = standard_webhooks_headers("msg_3", now, body)
    assert status(server, "standard_events", body + b" ", tampered) == REJECTED
    stale = standard_webhooks_headers("msg_4", now - 600, body)  # validly signed, 10 minutes old
    assert status(server, "standard_events", body, stale) == REJECTED
    future = standard_webhooks_headers("msg_5", now + 600, body)
    assert status(server, "standard_events", body, future) == REJECTED
    retry = standard_webhooks_headers("msg_1", now + 5, body)  # a retry: same id, new timestamp
    assert status(server, "standard_events", body, retry) == (200, "")
    # Key rotation: signed with the retired key and the new one, the valid signature second.
    old_key = "whsec_" + base64.b64encode(b"the-retired-key").decode()
    rotated = standard_webhooks_headers("msg_6", now, body)
    retired = standard_webhooks_headers("msg_6", now, body, secret=old_key)["webhook-signature"]
    rotated["webhook-signature"] = f"{retired} {rotated['webhook-signature']}"
    assert status(server, "standard_events", body, rotated) == (200, "")
    both_wrong = dict(rotated, **{"webhook-signature": f"{retired} {retired.replace('v1,', 'v1,A')}"})
    assert status(server, "standard_events", body, both_wrong) == REJECTED
    other_version = standard_webhooks_headers("msg_7", now, body)  # a valid signature under another version
    other_version["webhook-signature"] = other_version["webhook-signature"].replace("v1,", "v1a,")
    assert status(server, "standard_events", body, other_version) == REJECTED
    eventually(server, "SELECT idempotency_key, body->>'type' FROM standard_events ORDER BY 1",
               [("msg_1", "invoice.paid"), ("msg_6", "invoice.paid")])


def test_stripe(server: HeadraceProcess) -> None:
    setup_recipe(server, "stripe")
    body = json.dumps({"id": "evt_1", "type": "payment_intent.succeeded", "data": {"object": {"amount": 990}}}).encode()
    now = int(time.time())
    assert status(server, "stripe_events", body, stripe_headers(now, body)) == (200, "")
    assert status(server, "stripe_events", body, stripe_headers(now, body, secret="whsec_wrong")) == REJECTED
    other = body.replace(b"evt_1", b"evt_2")
    assert status(server, "stripe_events", other, stripe_headers(now, body)) == REJECTED  # body swapped
    assert status(server, "stripe_events", other, stripe_headers(now - 400, other)) == REJECTED  # replay, too old
    assert status(server, "stripe_events", body, {}) == REJECTED
    assert status(server, "stripe_events", body, stripe_headers(now + 1, body)) == (200, "")  # Stripe's retry
    # A secret being rolled: one v1= per active secret, the valid one second.
    rolled = body.replace(b"evt_1", b"evt_3")
    retired = hmac.new(b"whsec_the_rolled_secret", f"{now}.".encode() + rolled, hashlib.sha256).hexdigest()
    valid = stripe_headers(now, rolled)["Stripe-Signature"].split(",")[1]
    assert status(server, "stripe_events", rolled, {"Stripe-Signature": f"t={now},v1={retired},{valid}"}) == (200, "")
    assert status(server, "stripe_events", rolled, {"Stripe-Signature": f"t={now},v1={retired},v1={retired[::-1]}"}) \
        == REJECTED
    eventually(server, "SELECT idempotency_key, (body->'data'->'object'->>'amount')::int FROM stripe_events ORDER BY 1",
               [("evt_1", 990), ("evt_3", 990)])


def test_github(server: HeadraceProcess) -> None:
    setup_recipe(server, "github")
    body = json.dumps({"ref": "refs/heads/main", "commits": [{"id": "abc"}]}).encode()
    delivery = str(uuid.uuid4())
    assert status(server, "github_events", body, github_headers(delivery, body)) == (200, "")
    assert status(server, "github_events", body, github_headers(str(uuid.uuid4()), body, "wrong")) == REJECTED
    assert status(server, "github_events", body, github_headers(delivery, body)) == (200, "")  # redelivery
    eventually(server, "SELECT idempotency_key, event, body->>'ref' FROM github_events",
               [(delivery, "push", "refs/heads/main")])


def test_shopify(server: HeadraceProcess) -> None:
    setup_recipe(server, "shopify")
    body = json.dumps({"id": 820982911946154508, "total_price": "19.99"}).encode()
    assert status(server, "shopify_events", body, shopify_headers("ev-1", body)) == (200, "")
    assert status(server, "shopify_events", body, shopify_headers("ev-2", body, "wrong")) == REJECTED
    broken = dict(shopify_headers("ev-3", body), **{"X-Shopify-Hmac-SHA256": "not base64!"})
    assert status(server, "shopify_events", body, broken) == REJECTED
    assert status(server, "shopify_events", body, shopify_headers("ev-1", body)) == (200, "")  # retry
    eventually(server, "SELECT idempotency_key, topic, body->>'total_price' FROM shopify_events",
               [("ev-1", "orders/create", "19.99")])


def test_segment(server: HeadraceProcess) -> None:
    setup_recipe(server, "segment")
    body = json.dumps({"type": "track", "event": "Signed Up", "messageId": "ajs-next-1", "userId": "u1"}).encode()
    assert status(server, "segment_events", body, segment_headers(body)) == (200, "")
    assert status(server, "segment_events", body, segment_headers(body, "wrong")) == REJECTED
    assert status(server, "segment_events", body, {}) == REJECTED
    assert status(server, "segment_events", body, segment_headers(body)) == (200, "")  # retry
    eventually(server, "SELECT idempotency_key, body->>'event' FROM segment_events", [("ajs-next-1", "Signed Up")])
