"""Server side of the pipeline: starts the pipeline process, tells it the catalog, restarts it
if it dies. The server keeps taking webhooks whatever the pipeline is doing: the log decouples them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from headrace.catalog.items import WebhookSource
from headrace.catalog.views import MaterializedView
from headrace.log.read_service import TOKEN_ENV
from headrace.materialize.transport import read_frame, write_frame
from headrace.pipeline.status import PipelineStatus, one_line_error

log = logging.getLogger(__name__)

RESTART_BACKOFF_MAX_S = 10.0
STOP_GRACE_S = 15.0
# The pipeline (PySpark driver, its JVM and Python workers, which inherit it) runs at a lower CPU priority than
# the server, so a request never waits for a core behind Spark (throughput and ack latency against freshness under
# load; docs/webhooks.md). HEADRACE_PIPELINE_PRIORITY:
# - "idle" (default): Linux SCHED_IDLE, the pipeline runs on CPU the server leaves idle and a waking server thread
#   takes a core from it at once (a niced task keeps its core until its slice ends). Measured at 5,000 webhooks/s
#   on 2 cores: ack p99 16-35 ms, against 19-51 ms at nice 10.
# - a number: that niceness (10 was the default before "idle"; 0 is normal priority, freshness first on a
#   machine busy with other work).
PIPELINE_PRIORITY = os.environ.get("HEADRACE_PIPELINE_PRIORITY", os.environ.get("HEADRACE_PIPELINE_NICENESS", "idle"))


def _lower_priority() -> None:
    """Runs in the forked child before exec (so the JVM it starts inherits it)."""
    if PIPELINE_PRIORITY == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif int(PIPELINE_PRIORITY):
        os.nice(int(PIPELINE_PRIORITY))


EXIT_BAD_MASTER = 3  # pipeline/process.py: the master URL is bad or cannot be reached (not restarted)


class PipelineSupervisor:
    def __init__(self, data_dir: Path, spark_master: str, driver_address: tuple[str, int],
                 log_service: tuple[str, str] | None = None,
                 on_fatal: Callable[[str], None] | None = None) -> None:
        """`log_service`: (http://host:port, token) of the log read service, for masters other than local[...];
        `on_fatal(message)`: the pipeline cannot start at all (a bad or unreachable master): not restarted, the
        server is told (it exits: `headrace up` fails fast)."""
        self.data_dir = data_dir
        self.spark_master = spark_master
        self.driver_address = driver_address
        self.log_service = log_service
        self.on_fatal = on_fatal
        self.fatal: str | None = None
        self._fatal_message: str | None = None  # what the pipeline said before exiting with EXIT_BAD_MASTER
        self._ever_ready = False
        self._sources: list[WebhookSource] = []
        self._views: list[MaterializedView] = []  # maintained in their input source's transactions
        self._generation = 0
        self._writer: asyncio.StreamWriter | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._server: asyncio.Server | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._stopping = False
        self.ready = asyncio.Event()  # the pipeline process has a SparkSession
        self.status = PipelineStatus()  # the pipeline's latest report: headrace_internal.source_status

    async def start(self, sources: list[WebhookSource], views: list[MaterializedView] | None = None) -> None:
        self._sources = list(sources)
        self._views = list(views or [])
        self._server = await asyncio.start_server(self._on_control_connection, "127.0.0.1", 0)
        self._watch_task = asyncio.create_task(self._run_forever())

    def update(self, sources: list[WebhookSource]) -> None:
        self._sources = list(sources)
        self._push()

    def update_views(self, views: list[MaterializedView]) -> None:
        """The materialized views (in dependency order) changed: the pipeline restarts the affected sources."""
        self._views = list(views)
        self._push()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process and self._process.returncode is None else None

    async def stop(self) -> None:
        self._stopping = True
        if self._watch_task:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        process = self._process
        if process and process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_GRACE_S)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
        if self._server:
            self._server.close()

    async def _run_forever(self) -> None:
        failures = 0
        while not self._stopping:
            started = asyncio.get_running_loop().time()
            await self._spawn()
            assert self._process is not None
            code = await self._process.wait()
            self.ready.clear()
            if self._stopping:
                return
            if code == EXIT_BAD_MASTER and not self._ever_ready:
                await asyncio.sleep(0.2)  # its last control message (what is wrong) may still be on its way
                self.fatal = self._fatal_message or f"the pipeline cannot start on --spark-master {self.spark_master}"
                log.error("pipeline: %s", self.fatal)
                self.status.pipeline_exited(code, self.fatal, fatal=True)
                if self.on_fatal is not None:
                    self.on_fatal(self.fatal)
                return
            ran_for = asyncio.get_running_loop().time() - started
            failures = 0 if ran_for > 60 else failures + 1
            delay = min(RESTART_BACKOFF_MAX_S, 0.5 * 2 ** failures)
            log.error("pipeline process exited with %s; restarting in %.1fs", code, delay)
            self._note_exit(code)
            await asyncio.sleep(delay)

    async def _spawn(self) -> None:
        assert self._server is not None
        control_port = self._server.sockets[0].getsockname()[1]
        log_dir = self.data_dir / "pipeline"
        log_dir.mkdir(parents=True, exist_ok=True)
        output = open(log_dir / "pipeline.log", "ab")
        service_args: list[str] = []
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        if self.driver_address[0] in ("127.0.0.1", "localhost", "::1"):
            env["SPARK_LOCAL_IP"] = "127.0.0.1"  # else Spark binds where executors elsewhere can reach its driver
        if self.log_service is not None:
            service_args = ["--log-service", self.log_service[0]]
            env[TOKEN_ENV] = self.log_service[1]  # not on the command line: ps shows that to every user
        self.status.pipeline_starting(self.spark_master)
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "headrace.pipeline.process",
                "--control", f"127.0.0.1:{control_port}",
                "--driver", f"{self.driver_address[0]}:{self.driver_address[1]}",
                "--data-dir", str(self.data_dir), "--spark-master", self.spark_master, *service_args,
                stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=output, env=env,
                preexec_fn=_lower_priority,
            )
        finally:
            output.close()

    async def _on_control_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._push()
        try:
            while (message := await read_frame(reader)) is not None:
                if message.get("type") == "ready":
                    self._ever_ready = True
                    self.status.pipeline_ready()
                    self.ready.set()
                elif message.get("type") == "fatal":
                    self._fatal_message = str(message.get("message"))
                elif message.get("type") == "status":
                    self.status.update(message.get("sources") or [])
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()

    def _note_exit(self, code: int | None) -> None:
        """Every source reads as failing until the restarted pipeline reports again."""
        now = time.time()
        self.status.pipeline_exited(code, _last_error_line(self.data_dir / "pipeline" / "pipeline.log")
                                    or f"pipeline process exited with {code}")
        self.status.update({**row, "state": "failing", "last_error": f"pipeline process exited with {code}",
                            "last_error_at": now} for row in self.status.snapshot())

    def _push(self) -> None:
        if self._writer is None:
            return
        self._generation += 1
        write_frame(self._writer, {
            "type": "sources",
            "generation": self._generation,
            "sources": [{"id": source.id, "create_sql": source.create_sql} for source in self._sources],
            "views": [view.to_entry() for view in self._views],
        })


def _last_error_line(log_file: Path, tail_bytes: int = 20_000) -> str | None:
    """The last error the pipeline process logged before it exited (one line), for pipeline_status.last_error."""
    try:
        with open(log_file, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - tail_bytes))
            text = file.read().decode(errors="replace")
    except OSError:
        return None
    lines = [line for line in text.splitlines() if " ERROR " in line or "Error:" in line or "Exception:" in line]
    return one_line_error(lines[-1]) if lines else None
