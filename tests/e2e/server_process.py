"""A real `headrace up` process for end-to-end tests: free ports, a temporary data dir, and the
means to kill -9 every process it started (server, pipeline, JVM share one process group).

Its store PostgreSQL is, unless the test asks for the embedded default (`embedded_store=True`), a fresh database in
the test process's shared cluster (tests/real_servers/postgres.py), passed as `--store`: an initdb per server would
cost each test seconds. The embedded store's postmaster is not in the process group (pg_ctl detaches it), so a
kill -9 leaves it running, as in production; `stop()` stops one left behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psycopg

# The suite's servers keep their rows in the store PostgreSQL (the default, docs/store.md); `HEADRACE_SERVING_STORE=duckdb`
# runs them on the DuckDB serving store instead, whose catalog answers are headrace's emulation where they differ from
# PostgreSQL's own (tests assert each).
SERVING_ON_POSTGRES = os.environ.get("HEADRACE_SERVING_STORE", "postgres") == "postgres"

from headrace.store.postgres_cluster import find_bindir, pg_ctl_stop, postmaster_pid, server_account
from tests.real_servers.postgres import new_store_database


UP_BANNER = "headrace is up"

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PortTaken(RuntimeError):
    """headrace could not bind its port: another process took it after free_port() picked it."""


class HeadraceProcess:
    def __init__(self, data_dir: Path, extra_args: Sequence[str] = (), *, embedded_store: bool = False) -> None:
        self.data_dir = data_dir
        self.extra_args = tuple(extra_args)  # more `headrace up` options, e.g. --auth, --tls-cert
        self.embedded_store = embedded_store
        self.store_url: str | None = None  # the shared cluster's database, made at the first start, kept after
        self.pg_port = free_port()
        self.http_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.output_path = data_dir.parent / f"{data_dir.name}-server.log"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.pg_port} user=headrace dbname=headrace"

    def webhook_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.http_port}/api/webhook/headrace/public/{name}"

    def start(self, timeout: float = 60.0, env: Mapping[str, str] | None = None) -> None:
        """Start `headrace up`; `env` adds variables for this start only (e.g. HEADRACE_FAILPOINTS). A port picked
        free can be taken by another process before headrace binds it: then new ports, up to three times (read
        `dsn` and `webhook_url` after a start)."""
        for attempt in range(3):
            try:
                return self._start_once(timeout, env)
            except PortTaken:
                if attempt == 2:
                    raise
                self.pg_port, self.http_port = free_port(), free_port()

    def _start_once(self, timeout: float, env: Mapping[str, str] | None) -> None:
        if not self.embedded_store and self.store_url is None and "--store" not in self.extra_args:
            self.store_url = new_store_database()
        store_args = ["--store", self.store_url] if self.store_url is not None else []
        earlier_output = self.output()
        banners_before = earlier_output.count(UP_BANNER)
        output = open(self.output_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "headrace.cli", "up", "--data-dir", str(self.data_dir),
             "--pg-port", str(self.pg_port), "--http-port", str(self.http_port), "--spark-master", "local[2]",
             *store_args, *self.extra_args],
            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, **env} if env else None,
        )
        output.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.output()
                if "address already in use" in output[len(earlier_output):]:
                    raise PortTaken(output[len(earlier_output):][-500:])
                raise RuntimeError(f"headrace exited with {self.process.returncode}:\n{output}")
            # Up once its banner is out (its store PostgreSQL answers by then) and it answers a query.
            if self.output().count(UP_BANNER) == banners_before:
                time.sleep(0.1)
                continue
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise TimeoutError(f"headrace did not accept connections:\n{self.output()}")

    def output(self) -> str:
        return self.output_path.read_text(errors="replace") if self.output_path.exists() else ""

    def pipeline_log(self) -> str:
        path = self.data_dir / "pipeline" / "pipeline.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def kill9(self) -> None:
        """kill -9 every process of this server: the server, its pipeline and Spark's JVM; returns once each of
        them has exited (holds no file, lock or port any more)."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the whole group is gone already (a fail point kills its own process group)
        self.process.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and live_group_members(self.process.pid):
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.stop_store_left_running()
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill9()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # stragglers (JVM) of a clean stop
        except ProcessLookupError:
            pass
        self.stop_store_left_running()

    @property
    def store_datadir(self) -> Path:
        """The embedded store's PGDATA (store/postgres_server.py)."""
        return self.data_dir / "postgres" / "data"

    def stop_store_left_running(self) -> None:
        """An embedded store's postmaster outlives a kill -9 of headrace: stop it (immediately)."""
        if self.embedded_store and postmaster_pid(self.store_datadir) is not None:
            pg_ctl_stop(find_bindir(), self.store_datadir, account=server_account(), mode="immediate")


def live_group_members(process_group: int) -> list[int]:
    """The processes of `process_group` that have not exited yet. A zombie has (its files, locks, sockets and memory
    are released when its last thread exits): only its process table entry is left until its parent reaps it, and
    the pipeline's and the JVM's parent after a kill -9 is PID 1, which on these machines reaps a second or two
    later; waiting for that cost each kill -9 ~2 s."""
    live = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            state, _, group = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[:3]
            exited = state in ("Z", "X") and len(os.listdir(f"/proc/{entry.name}/task")) <= 1  # no thread left
        except (OSError, ValueError):
            continue  # gone meanwhile
        if int(group) == process_group and not exited:
            live.append(int(entry.name))
    return live


def wait_for(predicate, timeout: float, interval: float = 0.2, message: str = "condition") -> object:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {message}; last value {last!r}")


def select_after_cold_start(conn: psycopg.Connection, sql: str, attempts: int = 5) -> list[tuple[object, ...]]:
    """A read right after a (re)start waits for Spark's cold start and first micro-batch, which on a loaded machine
    can exceed one read's 60 s bound (57P03): try again, as a client would."""
    for _ in range(attempts - 1):
        try:
            return conn.execute(sql).fetchall()
        except psycopg.errors.CannotConnectNow:
            continue
    return conn.execute(sql).fetchall()
