"""The HTTP port (fast front + aiohttp app, real registry and logs) in a process of its own, so
tests drive it from outside with raw sockets and read its CPU time from /proc, without Spark.

    python -m tests.http.http_server DATA_DIR [--header-timeout-s S] [--body-timeout-s S]
        [--keepalive-timeout-s S] [--max-concurrent N] [--allowed-origin O]...
prints "PORT <n>" once listening; sources: headrace.public.events (TEXT)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from headrace.catalog.items import WebhookSource
from headrace.http.app import make_app, run_http
from headrace.http.settings import HttpSettings
from headrace.webhook.ingest import IngestRegistry, IngestSettings


async def serve(args: argparse.Namespace) -> None:
    registry = IngestRegistry(IngestSettings(max_concurrent_requests=args.max_concurrent,
                                             max_concurrent_requests_per_source=args.max_concurrent))
    registry.add(WebhookSource(id="u1", name="events", body_format="text", include_headers=False, idempotent_expr=None,
                               create_sql="CREATE SOURCE events FROM WEBHOOK BODY FORMAT TEXT"), args.data_dir / "u1")
    settings = HttpSettings(header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                            keepalive_timeout_s=args.keepalive_timeout_s, allowed_origins=tuple(args.allowed_origin))
    front = await run_http(make_app(registry, http=settings), "127.0.0.1", 0)
    print(f"PORT {front.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await front.cleanup()
    await registry.close_all()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--header-timeout-s", type=float, default=60.0)
    parser.add_argument("--body-timeout-s", type=float, default=60.0)
    parser.add_argument("--keepalive-timeout-s", type=float, default=75.0)
    parser.add_argument("--max-concurrent", type=int, default=500)
    parser.add_argument("--allowed-origin", action="append", default=[])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(parser.parse_args()))


class HttpServerProcess:
    """Starts the module above; `port`, `cpu_seconds()` (user + system, from /proc), `log()`."""

    def __init__(self, data_dir: Path, extra_args: Sequence[str] = ()) -> None:
        self.log_path = data_dir.parent / f"{data_dir.name}-http.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen([sys.executable, "-m", "tests.http.http_server", str(data_dir), *extra_args],
                                        stdout=subprocess.PIPE, stderr=self._log)
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the HTTP server did not start: {line!r} {self.log()}")
        self.port = int(line.split()[1])

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def wait_until(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


if __name__ == "__main__":
    main()
