"""Fail points: the HEADRACE_FAILPOINTS grammar, and a real process group killed on the armed pass only."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from headrace.failpoints import parse

PROGRAM = """
from headrace import failpoints
for number in range(1, 6):
    print(number, flush=True)
    failpoints.reached("after_started_commit")
    failpoints.reached("elsewhere")
"""


def test_parse() -> None:
    assert parse("") == {}
    assert parse("after_started_commit:3") == {"after_started_commit": 3}
    assert parse(" a:2 , b ") == {"a": 2, "b": 1}
    with pytest.raises(ValueError):
        parse("a:0")


def run(failpoints: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HEADRACE_FAILPOINTS"}
    if failpoints is not None:
        env["HEADRACE_FAILPOINTS"] = failpoints
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=30,
                          start_new_session=True)  # its own process group, which the fail point kills


def test_kills_its_process_group_on_the_armed_pass() -> None:
    killed = run("after_started_commit:3")
    assert killed.returncode == -9
    assert killed.stdout.split() == ["1", "2", "3"]
    assert "fail point after_started_commit reached (pass 3)" in killed.stderr


def test_unarmed_points_do_nothing() -> None:
    untouched = run(None)
    assert untouched.returncode == 0 and untouched.stdout.split() == ["1", "2", "3", "4", "5"]
    assert run("other_point:1").returncode == 0


def test_parse_errors() -> None:
    from headrace.failpoints import parse_errors

    assert parse_errors("a:3,b:error,c:error@source_u1") == {"b": None, "c": "source_u1"}
    assert parse("a:3,b:error") == {"a": 3}
    with pytest.raises(ValueError):
        parse_errors("a:errors")
