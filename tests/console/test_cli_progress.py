"""The CLI's progress bars (src/headrace/cli_progress.py): drawn on a terminal (a pseudo-terminal here) from what
/health/ready answers, off a terminal nothing is drawn and lines print as before."""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from headrace import cli_progress
from headrace.cli_progress import parts_ready, readiness, scenario_bar, watch_startup


class _Health(BaseHTTPRequestHandler):
    answers: list[tuple[int, dict[str, object]]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status, body = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


STARTING = {"status": "not ready", "not_ready": [{"part": "pipeline", "state": "starting"}],
            "parts": {"server": "ready", "pipeline": "starting", "store": "ready"}}
READY = {"status": "ready", "not_ready": [], "parts": {"server": "ready", "pipeline": "running", "store": "ready"}}


def test_parts_ready_names_what_is_waited_for() -> None:
    assert parts_ready(STARTING) == (2, "pipeline: starting")
    assert parts_ready(READY) == (3, "ready")
    assert parts_ready({}) == (0, "server: starting")
    failed = {**READY, "not_ready": [{"part": "materialization", "name": "public.s", "state": "failed"}]}
    assert parts_ready(failed) == (3, "materialization public.s: failed")


def test_readiness_reads_503_and_200_and_gives_up_on_404(health_server: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{health_server.server_address[1]}/health/ready"
    _Health.answers = [(503, STARTING), (200, READY), (404, {})]
    assert readiness(url) == (False, STARTING)
    assert readiness(url) == (True, READY)
    assert readiness(url) is None
    assert readiness("http://127.0.0.1:1/health/ready") == (False, {"parts": {"server": "not listening yet"}})


def test_startup_bar_on_a_terminal_until_ready(health_server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _Health.answers = [(503, STARTING), (503, STARTING), (200, READY)]
    monkeypatch.setattr(cli_progress, "POLL_INTERVAL_S", 0.05)
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr("sys.stdout", terminal)
        thread = watch_startup("0.0.0.0", health_server.server_address[1], stream=terminal)
        assert thread is not None
        thread.join(timeout=10)
        assert not thread.is_alive()
        terminal.flush()
    drawn = _read_all(leader)
    assert "starting headrace" in drawn and "pipeline: starting" in drawn


def test_no_bar_off_a_terminal() -> None:
    assert watch_startup("127.0.0.1", 1, stream=io.StringIO()) is None
    lines = io.StringIO()
    with scenario_bar(2, stream=lines) as finished:
        finished("  PASS  one (0.1 s)")
        finished("  SKIP  two (0.0 s)")
    assert lines.getvalue() == "  PASS  one (0.1 s)\n  SKIP  two (0.0 s)\n"


def test_scenario_bar_on_a_terminal_prints_each_line() -> None:
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as terminal:
        with scenario_bar(2, stream=terminal) as finished:
            finished("  PASS  exactly_once (1.0 s)")
            finished("  FAIL  fencing (2.0 s)")
        terminal.flush()
    drawn = _read_all(leader)
    assert "PASS  exactly_once" in drawn and "FAIL  fencing" in drawn


def _read_all(leader: int) -> str:
    """Everything the terminal received: one read may return only part of it; with the follower closed, Linux
    ends the leader's reads with EIO once it is drained."""
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")
