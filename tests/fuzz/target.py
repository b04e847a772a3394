"""The server the fuzz suite attacks, and what it must still be afterwards: alive, within its memory bound, its
canary source complete (every acknowledged canary request present exactly once) and its log free of the bytes
the fuzzers sent."""

from __future__ import annotations

import os
import random
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.e2e.server_process import HeadraceProcess, wait_for
from tests.e2e.webhook_client import post_webhook
from tests.fuzz.generators import MARK

# PostgreSQL's answers to anything a client can cause carry a class other than XX (internal error).
INTERNAL_ERROR = "XX000"
RSS_GROWTH_BOUND_MB = 300  # what a fuzz run may add to the server's resident memory, caches included


def seconds_per_target() -> float:
    """HEADRACE_FUZZ_SECONDS: 10 s per fuzzer in `make test`, minutes in `make fuzz`."""
    return float(os.environ.get("HEADRACE_FUZZ_SECONDS", "10"))


DEFAULT_SEED = "20261127"  # `make test` replays the same inputs (the first ones, as far as its time allows)


def seeded_random(name: str) -> tuple[random.Random, int]:
    """HEADRACE_FUZZ_SEED=<n> replays a run, `random` (what `make fuzz` uses) draws a fresh seed, printed by the
    test on failure; by default the fixed DEFAULT_SEED, so that CI does not fail on a finding it was never shown."""
    given = os.environ.get("HEADRACE_FUZZ_SEED", DEFAULT_SEED)
    seed = random.SystemRandom().getrandbits(32) if given == "random" else int(given)
    return random.Random(f"{seed}:{name}"), seed


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class FuzzTarget:
    server: HeadraceProcess
    canary_sent: int = 0
    baseline_rss_mb: float = 0.0
    findings: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.server.process is not None
        return self.server.process.pid

    def set_up(self) -> None:
        with psycopg.connect(self.server.dsn, autocommit=True) as conn:
            conn.execute("CREATE SOURCE canary FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'k')")
            conn.execute("CREATE SOURCE fz_text FROM WEBHOOK BODY FORMAT TEXT")
            conn.execute("CREATE TABLE fz_t (a int, b text)")
            conn.execute("INSERT INTO fz_t VALUES (1, 'one'), (2, 'two'), (NULL, NULL)")
            conn.execute("CREATE MATERIALIZED VIEW fz_v AS SELECT body->>'k' AS k, count(*) AS n FROM canary "
                         "GROUP BY body->>'k'")
        self.post_canaries(20)
        self.assert_canary_complete()
        self.baseline_rss_mb = rss_mb(self.pid)

    def post_canaries(self, count: int) -> None:
        for _ in range(count):
            key = f"canary-{self.canary_sent}"
            response = post_webhook(self.server.webhook_url("canary"), f'{{"k": "{key}"}}'.encode())
            assert response.status_code == 200, (response.status_code, response.text)
            self.canary_sent += 1

    def assert_canary_complete(self, timeout: float = 120) -> None:
        """Every canary request sent so far (each acknowledged 200) is in the source exactly once, and the view
        over the source has caught up with it."""
        expected = {f"canary-{i}" for i in range(self.canary_sent)}

        def caught_up() -> bool:
            with psycopg.connect(self.server.dsn, autocommit=True) as conn:
                rows = conn.execute("SELECT body->>'k', count(*) FROM canary WHERE body->>'k' LIKE 'canary-%' "
                                    "GROUP BY 1").fetchall()
                counts = dict(rows)
                assert all(n == 1 for n in counts.values()), f"canary rows doubled: {counts}"
                view = dict(conn.execute("SELECT k, n FROM fz_v WHERE k LIKE 'canary-%'").fetchall())
                return set(counts) == expected and view == counts
        wait_for(caught_up, timeout=timeout, message=f"{len(expected)} canary rows in source and view")

    def assert_healthy(self) -> None:
        assert self.server.process is not None and self.server.process.poll() is None, self.server.output()[-3000:]
        with psycopg.connect(self.server.dsn, autocommit=True, connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        growth = rss_mb(self.pid) - self.baseline_rss_mb
        assert growth < RSS_GROWTH_BOUND_MB, f"server RSS grew by {growth:.0f} MB"
        self.post_canaries(5)
        self.assert_canary_complete()
        assert MARK not in self.server.output(), "the server log carries bytes a client sent"


# --- the client side of the wire, just enough to read what the server answers -------------------------------------

def read_backend(sock: socket.socket, until_ready: bool, timeout: float) -> tuple[list[tuple[str, dict[str, str]]], bool]:
    """Read backend messages until ReadyForQuery (if `until_ready`), the socket closes or `timeout` passes.
    Returns (errors as (type, fields) for ErrorResponse and NoticeResponse, whether the connection is closed)."""
    sock.settimeout(timeout)
    buffer = bytearray()
    errors: list[tuple[str, dict[str, str]]] = []
    closed = False
    while True:
        while len(buffer) >= 5:
            type_byte = chr(buffer[0])
            (length,) = struct.unpack_from("!i", buffer, 1)
            if length < 4:
                raise AssertionError(f"server sent a message {type_byte!r} with length {length}")
            if len(buffer) < 1 + length:
                break
            body = bytes(buffer[5:1 + length])
            del buffer[:1 + length]
            if type_byte in "EN":
                errors.append((type_byte, _fields(body)))
            if type_byte == "Z" and until_ready:
                return errors, False
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, TimeoutError):
            return errors, closed
        except ConnectionResetError:
            return errors, True
        if not chunk:
            return errors, True
        buffer += chunk


def _fields(body: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in body.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode("utf-8", "replace")
    return fields


def startup_message(user: str) -> bytes:
    body = struct.pack("!I", 196608) + b"user\0" + user.encode() + b"\0database\0headrace\0\0"
    return struct.pack("!I", len(body) + 4) + body
