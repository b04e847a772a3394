"""--spark-master / SPARK_REMOTE: parsed and checked before anything starts (pipeline/spark_master.py), the Spark
Connect server's side checked for what the pipeline's Python needs there (pipeline/connect_check.py), and the
pipeline process's own state (pipeline/status.py): a bad or unreachable master makes `headrace up` fail fast."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headrace.pipeline.connect_check import compatibility_problem
from headrace.pipeline.spark_master import BadSparkMaster, check_reachable, choose_master, parse_master
from headrace.pipeline.status import PIPELINE_COLUMNS, PipelineCollector, PipelineStatus


@pytest.mark.parametrize(("url", "kind", "endpoints"), [
    ("local", "local", ()),
    ("local[2]", "local", ()),
    ("local[*]", "local", ()),
    ("local[4,2]", "local", ()),
    ("spark://h:7077", "standalone", (("h", 7077),)),
    ("spark://a:1,b:2", "standalone", (("a", 1), ("b", 2))),
    ("spark://h", "standalone", (("h", 7077),)),
    ("sc://h", "connect", (("h", 15002),)),
    ("sc://h:1234/;user_id=x", "connect", (("h", 1234),)),
    ("sc://[::1]:15002", "connect", (("::1", 15002),)),
    ("yarn", "yarn", ()),
    ("k8s://https://api:6443", "k8s", ()),
])
def test_master_urls(url: str, kind: str, endpoints: tuple[tuple[str, int], ...]) -> None:
    master = parse_master(url)
    assert (master.kind, master.endpoints) == (kind, endpoints)
    assert master.is_local == (kind == "local")


@pytest.mark.parametrize("url", ["", "foo", "local[0]", "local[x]", "spark://", "spark://h:99999", "sc://",
                                 "sc://h:port", "http://h:7077", "mesos://h:5050", "k8s://"])
def test_bad_master_urls_are_refused_with_what_is_accepted(url: str) -> None:
    with pytest.raises(BadSparkMaster) as refused:
        parse_master(url)
    assert "spark://" in str(refused.value) or "host[:port]" in str(refused.value)


def test_the_flag_wins_over_spark_remote_which_wins_over_local() -> None:
    assert choose_master("local[2]", "sc://h") == "local[2]"
    assert choose_master(None, "sc://h") == "sc://h"
    assert choose_master(None, None) == "local[*]"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_master_is_reported_within_the_timeout() -> None:
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(BadSparkMaster) as unreachable:
        check_reachable(parse_master(f"sc://127.0.0.1:{port}"), timeout_s=1.0)
    assert time.monotonic() - started < 5
    assert "Spark Connect server" in str(unreachable.value) and f"127.0.0.1:{port}" in str(unreachable.value)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_reachable(parse_master(f"spark://127.0.0.1:{_closed_port()},127.0.0.1:{listening.getsockname()[1]}"),
                        timeout_s=1.0)  # one master of an HA list is enough


def test_the_connect_servers_python_must_match() -> None:
    assert compatibility_problem("3.11|0.1.0||/usr/bin/python3", "3.11", "0.1.0") is None
    problem = compatibility_problem("3.12|0.1.0||/opt/py", "3.11", "0.1.0")
    assert problem and "Python 3.12" in problem and "same minor" in problem
    problem = compatibility_problem("3.11|-|ModuleNotFoundError: No module named 'headrace'|/opt/py", "3.11", "0.1.0")
    assert problem and "cannot import headrace" in problem and "pip install headrace==0.1.0" in problem
    assert "/opt/py" in problem
    problem = compatibility_problem("3.11|0.0.9||/opt/py", "3.11", "0.1.0")
    assert problem and "0.0.9" in problem


def test_pipeline_state_restarts_and_metrics() -> None:
    status = PipelineStatus()
    status.pipeline_starting("spark://h:7077")
    assert status.pipeline()["state"] == "starting"
    status.pipeline_ready()
    status.pipeline_exited(1, "ConnectionError: lost the master")
    status.pipeline_starting("spark://h:7077")
    assert status.pipeline()["state"] == "restarting"  # until it is ready again
    rows = status.pipeline_rows()
    assert len(rows) == 1 and len(rows[0]) == len(PIPELINE_COLUMNS)
    assert rows[0][:4] == ("spark://h:7077", "restarting", 1, "ConnectionError: lost the master")
    status.pipeline_ready()
    status.update([{"state": "running"}, {"state": "failing"}, {"state": "failing"}])
    families = {family.name: family for family in PipelineCollector(status).collect()}
    assert families["headrace_pipeline_up"].samples[0].value == 1
    assert families["headrace_pipeline_restarts"].samples[0].value == 1
    assert {s.labels["state"]: s.value for s in families["headrace_pipeline_sources"].samples} == \
        {"failing": 2, "running": 1, "starting": 0}


def _up(tmp_path: Path, master: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", "up", "--data-dir", str(tmp_path / "data"),
                           "--pg-port", "0", "--http-port", "0", "--spark-master", master],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_headrace_up_fails_fast_on_a_bad_or_unreachable_master(tmp_path: Path) -> None:
    bad = _up(tmp_path, "spark//nohost")
    assert bad.returncode == 2 and "is not a Spark master URL" in bad.stderr
    started = time.monotonic()
    unreachable = _up(tmp_path, f"spark://127.0.0.1:{_closed_port()}")
    assert unreachable.returncode == 1, unreachable.stderr
    assert "cannot be reached" in unreachable.stderr
    assert time.monotonic() - started < 30
    assert "headrace is up" not in unreachable.stdout
