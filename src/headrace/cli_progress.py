"""Progress bars where the CLI waits (issue 18, item 5), drawn with rich on a terminal only: piped or captured
output (tests, logs, `--json`) stays as it was.

`headrace up`: from the server's start until GET /health/ready answers 200 (the server, the store and the pipeline
serve; http/health.py), a transient bar of those three parts with the one still waited for. `headrace driver-test`:
a bar over the scenarios, each one's result printed above it as it ends."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

READY_PARTS = (("server", "ready"), ("store", "ready"), ("pipeline", "running"))
POLL_INTERVAL_S = 0.5
GIVE_UP_AFTER_S = 900.0


def on_terminal(stream: TextIO) -> bool:
    return stream.isatty()


def readiness(url: str, timeout_s: float = 2.0) -> tuple[bool, dict[str, Any]] | None:
    """(ready, body) of GET /health/ready; None when the server has no such endpoint (an older one)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return True, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        try:
            return False, json.loads(error.read() or b"{}")
        except ValueError:
            return False, {}
    except (OSError, ValueError):
        return False, {"parts": {"server": "not listening yet"}}


def parts_ready(body: dict[str, Any]) -> tuple[int, str]:
    """How many of READY_PARTS serve, and a line naming the first that does not."""
    parts = body.get("parts") or {}
    done = sum(1 for part, good in READY_PARTS if parts.get(part) == good)
    waiting = next((f"{part}: {parts.get(part, 'starting')}" for part, good in READY_PARTS if parts.get(part) != good),
                   None)
    if waiting is None:
        failing = [item for item in body.get("not_ready", []) if item.get("part") == "materialization"]
        waiting = f"materialization {failing[0].get('name')}: {failing[0].get('state')}" if failing else "ready"
    return done, waiting


def watch_startup(host: str, port: int, stream: TextIO = sys.stderr,
                  probe: Callable[[str], tuple[bool, dict[str, Any]] | None] = readiness) -> threading.Thread | None:
    """Start a thread drawing `headrace up`'s start-up bar on `stream` (a terminal) until the server is ready."""
    if not (on_terminal(stream) and on_terminal(sys.stdout)):  # the banner on stdout is printed above the bar
        return None
    reach = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = f"http://{f'[{reach}]' if ':' in reach else reach}:{port}/health/ready"
    thread = threading.Thread(target=_draw_startup, args=(url, stream, probe), name="headrace-startup-progress",
                              daemon=True)
    thread.start()
    return thread


def _draw_startup(url: str, stream: TextIO, probe: Callable[[str], tuple[bool, dict[str, Any]] | None]) -> None:
    progress = Progress(SpinnerColumn(), TextColumn("starting headrace"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=Console(file=stream), transient=True, redirect_stdout=True, redirect_stderr=False)
    deadline = time.monotonic() + GIVE_UP_AFTER_S
    with progress:
        task = progress.add_task("server: starting", total=len(READY_PARTS))
        while time.monotonic() < deadline:
            answer = probe(url)
            if answer is None:
                return  # a server without /health/ready: nothing to show
            ready, body = answer
            done, waiting = parts_ready(body)
            progress.update(task, completed=done, description=waiting)
            if ready:
                return
            time.sleep(POLL_INTERVAL_S)


@contextmanager
def scenario_bar(total: int, stream: TextIO = sys.stderr) -> Iterator[Callable[[str], None]]:
    """A bar over `total` scenarios; the function yielded prints a finished scenario's line above it and advances
    it. Off a terminal, the lines are printed alone."""
    if not on_terminal(stream):
        yield lambda line: print(line, file=stream, flush=True)
        return
    progress = Progress(SpinnerColumn(), TextColumn("driver-test"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(file=stream), transient=True)
    with progress:
        task = progress.add_task("", total=total)

        def finished(line: str) -> None:
            progress.console.print(line, markup=False, highlight=False)
            progress.advance(task)

        yield finished
