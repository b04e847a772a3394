"""Drivers outside the headrace process: `CREATE SINK ... INTO EXTERNAL (COMMAND = '...')` or `(ADDRESS = '...')`.

`ExternalDriver(command)` runs the command through the shell, in its own process group, with
HEADRACE_DRIVER_ADDRESS=127.0.0.1:<free port> in its environment; the driver must serve the Driver service
(driver.proto) there. `start()` waits until the port accepts connections (an error carrying the tail of the
process's stderr if it exits first, or after `start_timeout`). `connection()` returns a GrpcDriverConnection,
first restarting the process if it died (a crashed driver comes back on the runner's next attempt, which reopens
from its checkpoint). `stop()` sends SIGTERM to the process group, then SIGKILL after `stop_timeout`.

The driver's stdout and stderr are logged line by line (logger `headrace.materialize.rpc.external`), and the last
lines of its stderr are kept for error messages.

`RemoteDriver(address)` is the ADDRESS form: a driver someone else runs; `connection()` just connects.
`driver_for(options)` picks one from a sink's EXTERNAL options.

Inside a server, `access` (catalog/host_access.py: `headrace up --allow-command`) is checked before every start
of the process, so a sink recorded by an older version or an edited catalog cannot run a command the server's
operator did not allow. `access` None (driver-test, the conformance kit) runs what it is given.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from headrace.catalog.host_access import HostAccess
from headrace.errors import InvalidParameterValue, ServiceUnavailable
from headrace.materialize.rpc.client import GrpcDriverConnection
from headrace.materialize.rpc.server import ADDRESS_VARIABLE

logger = logging.getLogger(__name__)

STDERR_TAIL_LINES = 20
_POLL_SECONDS = 0.05


class DriverStartError(ServiceUnavailable):
    """An external driver's process exited, or did not listen, before it could be connected to."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the driver binds it shortly after; a race we accept, as tests do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class ExternalDriver:
    """A driver process started from a shell command (see module docstring). Thread-safe."""

    def __init__(self, command: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                 start_timeout: float = 30.0, stop_timeout: float = 5.0, connect_timeout: float = 10.0,
                 name: str = "driver", access: HostAccess | None = None) -> None:
        if not command.strip():
            raise InvalidParameterValue("EXTERNAL driver COMMAND is empty")
        self.command = command
        self._access = access
        self.name = name
        self._env = dict(env or {})
        self._cwd = cwd
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._connect_timeout = connect_timeout
        self._lock = threading.RLock()
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._readers: list[threading.Thread] = []
        self.address: str | None = None
        self.starts = 0  # processes started so far (restarts included)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the process (if it is not running) and wait until its port accepts connections."""
        with self._lock:
            if self.running():
                return
            if self._access is not None:
                self._access.check_command(self.command)
            if self._process is not None:
                logger.warning("%s exited with status %s; restarting it", self.name, self._process.returncode)
                self._reap()
            port = free_port()
            self.address = f"127.0.0.1:{port}"
            self._stderr_tail.clear()
            self._process = subprocess.Popen(
                self.command, shell=True, cwd=self._cwd,
                env={**os.environ, **self._env, ADDRESS_VARIABLE: self.address}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True)  # its own process group: stop() reaches the shell's children too
            self.starts += 1
            self._readers = [self._drain(self._process.stdout, "stdout", keep=False),
                             self._drain(self._process.stderr, "stderr", keep=True)]
            try:
                self._await_listening(port)
            except BaseException:
                self._terminate()
                raise

    def connection(self) -> GrpcDriverConnection:
        """A new stream to the driver, (re)starting its process first if it is not running."""
        with self._lock:
            self.start()
            assert self.address is not None
            address = self.address
        return GrpcDriverConnection(address, timeout=self._connect_timeout)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after stop_timeout; idempotent."""
        with self._lock:
            self._terminate()

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr_tail)

    # ------------------------------------------------------------------------------------------ internals

    def _await_listening(self, port: int) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._start_timeout
        while True:
            if self._process.poll() is not None:
                for reader in self._readers:  # the tail is complete once its pipe closed
                    reader.join(timeout=1.0)
                raise DriverStartError(f"{self.name} exited with status {self._process.returncode} before "
                                       f"listening on {self.address}{self._tail_for_error()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise DriverStartError(f"{self.name} did not listen on {self.address} within "
                                       f"{self._start_timeout} s{self._tail_for_error()}")
            time.sleep(_POLL_SECONDS)

    def _tail_for_error(self) -> str:
        tail = self.stderr_tail()
        return f"; its stderr ends with:\n{tail}" if tail else " (no stderr output)"

    def _drain(self, stream: IO[bytes] | None, label: str, keep: bool) -> threading.Thread:
        """Log a pipe's lines (so the driver never blocks on a full pipe); keep stderr's last lines."""

        def pump() -> None:
            assert stream is not None
            with stream:
                for raw in stream:
                    line = raw.decode("utf-8", "replace").rstrip()
                    if keep:
                        self._stderr_tail.append(line)
                    logger.info("%s %s: %s", self.name, label, line)

        thread = threading.Thread(target=pump, name=f"{self.name}-{label}", daemon=True)
        thread.start()
        return thread

    def _terminate(self) -> None:
        process = self._process
        if process is None:
            return
        # The shell may not exec the command (dash does not): wait for the whole group, not just the shell, so
        # the driver itself gets its stop_timeout to finish after SIGTERM.
        self._signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + self._stop_timeout
        while self._group_alive(process):
            if time.monotonic() > deadline:
                logger.warning("%s did not stop within %s s of SIGTERM; killing it", self.name, self._stop_timeout)
                break
            time.sleep(_POLL_SECONDS)
        self._signal_group(process, signal.SIGKILL)  # whatever is left of the group
        process.wait()
        self._reap()

    @staticmethod
    def _group_alive(process: subprocess.Popen[bytes]) -> bool:
        """Whether a process of the group still runs. Zombies do not count: the driver exits, but once the shell
        above it is gone it is reaped by init, which can take a while in a container."""
        process.poll()  # reap the shell ourselves
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        proc = Path("/proc")
        if not proc.is_dir():
            return True  # members exist, zombies or not: wait for them (or the timeout)
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[2]) == process.pid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
                return True
        return False

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
        try:
            os.killpg(process.pid, signum)  # start_new_session: the group id is the shell's pid
        except (ProcessLookupError, PermissionError):
            pass

    def _reap(self) -> None:
        for reader in self._readers:
            reader.join(timeout=1.0)
        self._readers = []
        self._process = None


class RemoteDriver:
    """`INTO EXTERNAL (ADDRESS = 'host:port')`: a driver run by someone else."""

    def __init__(self, address: str, connect_timeout: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidParameterValue(f"EXTERNAL driver ADDRESS must be 'host:port', not {address!r}")
        self.address = address
        self._connect_timeout = connect_timeout

    def connection(self) -> GrpcDriverConnection:
        return GrpcDriverConnection(self.address, timeout=self._connect_timeout)

    def stop(self) -> None:
        """Nothing to stop: headrace does not own the process."""


def driver_for(options: Mapping[str, Any], name: str = "driver",
               access: HostAccess | None = None) -> ExternalDriver | RemoteDriver:
    """The driver of a sink's EXTERNAL options: exactly one of COMMAND or ADDRESS (keys case-insensitive)."""
    lowered = {str(k).lower(): v for k, v in options.items()}
    command, address = lowered.get("command"), lowered.get("address")
    if (command is None) == (address is None):
        raise InvalidParameterValue("INTO EXTERNAL needs exactly one of COMMAND = '...' or ADDRESS = 'host:port'")
    if command is not None:
        return ExternalDriver(str(command), name=name, access=access)
    return RemoteDriver(str(address))
