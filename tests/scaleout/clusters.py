"""Spark run from pyspark's own distribution, as a user's cluster would be, for the scale-out tests: a standalone
master with workers, and a Spark Connect server. Every daemon has its own directories under a temporary dir (never
headrace's data dir), its own process group (kill -9 of one executor or of the whole cluster), and free ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.server_process import free_port


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _env(base: Path, extra: Mapping[str, str] = ()) -> dict[str, str]:  # type: ignore[assignment]
    return {**os.environ, "SPARK_HOME": str(spark_home()), "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(base / "logs"), "SPARK_CONF_DIR": str(base / "conf"),
            "SPARK_LOCAL_DIRS": str(base / "local"), **dict(extra)}


def _wait_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}: {log.read_text(errors='replace')[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listens on {port}: {log.read_text(errors='replace')[-3000:]}")


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def _start(name: str, base: Path, args: list[str], env: Mapping[str, str]) -> Daemon:
    (base / "logs").mkdir(parents=True, exist_ok=True)
    (base / "conf").mkdir(parents=True, exist_ok=True)
    (base / "local").mkdir(parents=True, exist_ok=True)
    log = base / "logs" / f"{name}.out"
    with open(log, "ab") as output:
        process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdout=output,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(env),
                                   start_new_session=True)
    return Daemon(name, process, log)


@dataclass
class StandaloneCluster:
    base: Path
    master_port: int = 0
    daemons: list[Daemon] = field(default_factory=list)
    worker_dirs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def start(self, workers: int = 2) -> None:
        self.master_port = free_port()
        env = _env(self.base, {"SPARK_DAEMON_MEMORY": "256m"})
        master = _start("master", self.base / "master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.master_port),
            "--webui-port", str(free_port())], env)
        self.daemons.append(master)
        _wait_port(self.master_port, master.process, master.log)
        for index in range(workers):
            work_dir = self.base / f"worker{index}" / "work"
            work_dir.mkdir(parents=True, exist_ok=True)
            self.worker_dirs.append(work_dir)
            port = free_port()
            worker = _start(f"worker{index}", self.base / f"worker{index}", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", str(port),
                "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g", "--work-dir", str(work_dir),
                self.url], _env(self.base / f"worker{index}", {"SPARK_WORKER_DIR": str(work_dir),
                                                               "SPARK_DAEMON_MEMORY": "256m"}))
            self.daemons.append(worker)
            _wait_port(port, worker.process, worker.log)
        self._wait_registered(workers)

    def _wait_registered(self, workers: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        master_log = self.daemons[0].log
        while time.monotonic() < deadline:
            if master_log.read_text(errors="replace").count("Registering worker") >= workers:
                return
            time.sleep(0.3)
        raise TimeoutError(f"workers did not register: {master_log.read_text(errors='replace')[-2000:]}")

    def executor_pids(self) -> list[int]:
        """The executor JVMs the workers run now (CoarseGrainedExecutorBackend)."""
        pids = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    command = Path(f"/proc/{entry.name}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"CoarseGrainedExecutorBackend" in command and str(self.base).encode() in command:
                    pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        for pid in self.executor_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for daemon in reversed(self.daemons):
            daemon.kill()


@dataclass
class ConnectServer:
    base: Path
    port: int = 0
    daemon: Daemon | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = free_port()
        jar = next((spark_home() / "jars").glob("spark-connect_*.jar"))
        self.daemon = _start("connect", self.base, [
            "org.apache.spark.deploy.SparkSubmit", "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master", "local[2]", "--driver-memory", "1g",
            "--conf", f"spark.connect.grpc.binding.port={self.port}",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.ui.enabled=false",
            "--conf", f"spark.local.dir={self.base / 'local'}",
            "--conf", f"spark.sql.warehouse.dir={self.base / 'warehouse'}",
            "--conf", "spark.python.authenticate.socketTimeout=120s",
            str(jar)], _env(self.base))
        _wait_port(self.port, self.daemon.process, self.daemon.log, timeout=120)

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.kill()
