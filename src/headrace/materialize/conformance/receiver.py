"""The HTTP receiver the conformance kit runs for the HTTP driver when no --config names an endpoint.

It stands in for a headrace webhook source WITH (IDEMPOTENT): every POST's JSON array body is recorded once per
`Idempotency-Key` (a repeated key is answered 200 and dropped, as the webhook source answers a replay), so the
documents it holds are what an idempotent receiver would hold. It also counts the repeats, so the report can say
that a replay happened and was absorbed. A POST without the header is recorded as it comes (at least once)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ReceivedBatches:
    """What the receiver holds: batches by idempotency key, in arrival order."""

    batches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    unkeyed: list[list[dict[str, Any]]] = field(default_factory=list)
    repeats: int = 0  # POSTs whose key was already recorded (replays absorbed)


class IdempotentReceiver:
    """A local HTTP server recording POSTed JSON arrays, deduplicated on Idempotency-Key."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self.received = ReceivedBatches()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    documents = json.loads(body)
                    if not isinstance(documents, list):
                        raise ValueError("the body is not a JSON array")
                except ValueError as exc:
                    self._answer(400, f"bad body: {exc}")
                    return
                receiver._record(self.headers.get("Idempotency-Key"), documents)
                self._answer(200, "ok")

            def _answer(self, status: int, text: str) -> None:
                payload = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: the report says what matters
                return

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kit-http-receiver", daemon=True)
        self._thread.start()
        self.url = f"http://{host}:{self._server.server_address[1]}/changes"

    def _record(self, key: str | None, documents: list[dict[str, Any]]) -> None:
        with self._lock:
            if key is None:
                self.received.unkeyed.append(documents)
            elif key in self.received.batches:
                self.received.repeats += 1
            else:
                self.received.batches[key] = documents

    def documents(self, key_prefix: str) -> list[dict[str, Any]]:
        """Every recorded document of batches whose idempotency key starts with `key_prefix` (the HTTP driver's
        keys start with the materialization's name), plus the unkeyed ones."""
        with self._lock:
            keyed = [doc for key, batch in self.received.batches.items() if key.startswith(key_prefix)
                     for doc in batch]
            return keyed + [doc for batch in self.received.unkeyed for doc in batch]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
