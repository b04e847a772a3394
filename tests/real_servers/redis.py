"""A real redis-server for tests: started once per session on a free port in a temporary directory, without
persistence (`--save '' --appendonly no`), stopped at the end. Tests take a fresh database with `redis_db`."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
DATABASES = 16


@dataclass
class RedisServer:
    host: str
    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    _next_db: int = 0

    def url(self, db: int = 0) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    def fresh_db(self) -> int:
        """A database no earlier test of this session used (flushed, in case), cycling through the 16."""
        db = self._next_db % DATABASES
        self._next_db += 1
        client = redis.Redis(host=self.host, port=self.port, db=db)
        try:
            client.flushdb()
        finally:
            client.close()
        return db


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_redis_server() -> RedisServer:
    directory = Path(tempfile.mkdtemp(prefix="headrace-redis-"))
    for _ in range(5):  # the probed port may be taken before redis-server binds it: try another
        port = _free_port()
        process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
             "--appendonly", "no", "--databases", str(DATABASES), "--logfile", str(directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process.poll() is None:
            try:
                client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5)
                try:
                    client.ping()
                finally:
                    client.close()
                return RedisServer("127.0.0.1", port, directory, process)
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        process.kill()
        process.wait(10)
    raise RuntimeError(f"redis-server did not start; see {directory / 'redis.log'}")


def stop_redis_server(server: RedisServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(10)
    shutil.rmtree(server.directory, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis_server()
    try:
        yield server
    finally:
        stop_redis_server(server)


@pytest.fixture
def redis_db(redis_server: RedisServer) -> int:
    """A fresh (empty) database number of the session's server."""
    return redis_server.fresh_db()
