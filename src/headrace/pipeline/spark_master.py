"""Which Spark the pipeline runs on (`--spark-master`, or SPARK_REMOTE), checked before anything starts.

    local, local[N], local[*], local[N,F]    Spark inside the pipeline process's JVM, on this host (the default)
    spark://host:port[,host:port...]        a standalone cluster (its executors read logs through the read service)
    sc://host[:port][/;params]              a Spark Connect server (default port 15002)
    yarn, k8s://...                         passed to Spark as they are (not tested here)

A URL of none of these shapes, or a master / Connect server that does not accept a TCP connection within the
timeout, is a configuration error: `headrace up` exits with it (docs/deploy.md), rather than restarting a pipeline
that cannot start."""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_MASTER = "local[*]"
CONNECT_DEFAULT_PORT = 15002
STANDALONE_DEFAULT_PORT = 7077
REACH_TIMEOUT_S = 10.0
_LOCAL = re.compile(r"^local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?$")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+)(:(\d{1,5}))?$")


class BadSparkMaster(ValueError):
    """--spark-master (or SPARK_REMOTE) is not a master URL headrace can use, or it cannot be reached."""


@dataclass(frozen=True)
class SparkMaster:
    url: str
    kind: str  # local | standalone | connect | yarn | k8s
    endpoints: tuple[tuple[str, int], ...] = ()  # what must accept a connection (standalone masters, Connect server)

    @property
    def is_local(self) -> bool:
        """Spark runs on this host, in the pipeline's JVM: its Python workers may read the log files directly."""
        return self.kind == "local"

    @property
    def is_connect(self) -> bool:
        return self.kind == "connect"


def choose_master(flag: str | None, spark_remote: str | None) -> str:
    """--spark-master if given, else SPARK_REMOTE (Spark's own convention for Spark Connect), else local[*]."""
    return flag or spark_remote or DEFAULT_MASTER


def parse_master(url: str) -> SparkMaster:
    text = url.strip()
    if _LOCAL.match(text):
        return SparkMaster(text, "local")
    if text.startswith("spark://"):
        endpoints = tuple(_host_port(part, STANDALONE_DEFAULT_PORT, url) for part in text[len("spark://"):].split(","))
        return SparkMaster(text, "standalone", endpoints)
    if text.startswith("sc://"):
        authority = text[len("sc://"):].split("/", 1)[0].split(";", 1)[0]
        return SparkMaster(text, "connect", (_host_port(authority, CONNECT_DEFAULT_PORT, url),))
    if text == "yarn":
        return SparkMaster(text, "yarn")
    if text.startswith("k8s://") and urlsplit(text[len("k8s://"):]).netloc:
        return SparkMaster(text, "k8s")
    raise BadSparkMaster(
        f"--spark-master {url!r} is not a Spark master URL: use local[N], spark://host:port (a standalone cluster), "
        "sc://host:port (a Spark Connect server), yarn or k8s://...")


def _host_port(text: str, default_port: int, url: str) -> tuple[str, int]:
    match = _HOST_PORT.match(text)
    if not match or (match.group(3) is not None and not 0 < int(match.group(3)) < 65536):
        raise BadSparkMaster(f"--spark-master {url!r}: {text!r} is not host[:port]")
    host = match.group(1).strip("[]")
    return host, int(match.group(3)) if match.group(3) else default_port


def check_reachable(master: SparkMaster, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Every endpoint of a standalone or Connect master accepts a TCP connection within `timeout_s` (one of a
    standalone HA list is enough); else BadSparkMaster saying which."""
    if not master.endpoints:
        return
    deadline = time.monotonic() + timeout_s
    errors = []
    while True:
        errors.clear()
        for host, port in master.endpoints:
            try:
                with socket.create_connection((host, port), timeout=max(0.5, min(2.0, deadline - time.monotonic()))):
                    return
            except OSError as error:
                errors.append(f"{host}:{port}: {error.strerror or error}")
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    what = "Spark Connect server" if master.is_connect else "Spark master"
    raise BadSparkMaster(f"the {what} of --spark-master {master.url} cannot be reached within {timeout_s:.0f} s "
                         f"({'; '.join(errors)})")
