"""The log payload of one accepted webhook request, and its codec.

A compact JSON object with one-letter keys: {"t": received_at_us, "k": key, "h": {...}, "b": body}.
"k" and "h" are left out when absent. Decoding runs on the Spark hot path, so it is one json.loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


@dataclass(frozen=True, slots=True)
class WebhookRecord:
    received_at_us: int  # microseconds since the Unix epoch, taken when the request arrived
    idempotency_key: str | None
    headers: dict[str, str] | None  # only with INCLUDE HEADERS; names lower-cased
    body_text: str  # the request body as received (valid UTF-8)


def encode(record: WebhookRecord) -> bytes:
    fields: dict[str, object] = {"t": record.received_at_us}
    if record.idempotency_key is not None:
        fields["k"] = record.idempotency_key
    if record.headers is not None:
        fields["h"] = record.headers
    fields["b"] = record.body_text
    return _encoder.encode(fields).encode("utf-8")


def decode(payload: bytes) -> WebhookRecord:
    fields = json.loads(payload)
    return WebhookRecord(fields["t"], fields.get("k"), fields.get("h"), fields["b"])
