"""Fail points for fault-injection tests: SIGKILL the whole process group at a named point of the code.

`HEADRACE_FAILPOINTS="after_started_commit:3"` (comma-separated `name:n` pairs) is read once, when this module is
first imported, and means: the n-th time `reached("after_started_commit")` is called in this process, kill -9 every
process of this process group (server, pipeline, Spark's JVM) at once, as a power cut would. Without the variable
`reached` is a dictionary miss and nothing else, so the call sites cost nothing in production.

Points:
  after_started_commit: the serving driver's commit is durable and StartedCommit is written, and the runtime's next
      Acknowledge is not handled yet (materialize/driver.py): the window of issue 5's kill -9 test.
  sink_after_commit: a sink's transaction is committed (POSTGRES: StartedCommit received; PARQUET and the other
      recovery-log drivers: the recovery log holds it, its files are staged and not applied) and its Acknowledge is
      not sent yet (sink/runner.py): issue 6's kill -9 between StartedCommit and Acknowledged.
  between_table_appends: a COMMIT that wrote several tables has its intent durable and its first table's record
      appended, the others not yet (coordinator/tables.py): restart must complete the transaction.

Error points: `name:error` (or `name:error@subject`) makes `fail(name, subject)` raise FailPointError on every pass
(only when `subject` is the given one), leaving the process alive, so a test can watch headrace handle a failure that
persists (state, retries, /metrics, /health/ready):
  start_commit: the serving or sink driver's commit of materialization `subject` (source_<id>, table_<id>, sink_<id>)
      fails before it starts (materialize/driver.py).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

ENVIRONMENT_VARIABLE = "HEADRACE_FAILPOINTS"


class FailPointError(Exception):
    """What an armed error point raises."""


def parse(spec: str) -> dict[str, int]:
    """`"a:3,b:1"` -> {"a": 3, "b": 1}; a name without a count fires the first time (error points: parse_errors)."""
    points: dict[str, int] = {}
    for item in spec.split(","):
        name, _, count = item.strip().partition(":")
        if not name or count.startswith("error"):
            continue
        points[name] = int(count) if count else 1
        if points[name] < 1:
            raise ValueError(f"{ENVIRONMENT_VARIABLE}: the count of {name!r} must be at least 1, not {count}")
    return points


def parse_errors(spec: str) -> dict[str, str | None]:
    """`"a:error,b:error@source_u1"` -> {"a": None, "b": "source_u1"}: the error points and their subjects."""
    points: dict[str, str | None] = {}
    for item in spec.split(","):
        name, _, action = item.strip().partition(":")
        if name and action.startswith("error"):
            kind, _, subject = action.partition("@")
            if kind != "error":
                raise ValueError(f"{ENVIRONMENT_VARIABLE}: {item.strip()!r}: expected {name}:error[@subject]")
            points[name] = subject or None
    return points


_ARMED: dict[str, int] = parse(os.environ.get(ENVIRONMENT_VARIABLE, ""))
_ERRORS: dict[str, str | None] = parse_errors(os.environ.get(ENVIRONMENT_VARIABLE, ""))
_hits: dict[str, int] = {}
_lock = threading.Lock()


def reached(name: str) -> None:
    """Count one pass through fail point `name`; on its armed pass, SIGKILL this process group (never returns)."""
    if name not in _ARMED:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        firing = _hits[name] == _ARMED[name]
    if firing:
        # One line on stderr, so a test (and a human reading the server log) can tell the fail point fired.
        sys.stderr.write(f"headrace: fail point {name} reached (pass {_ARMED[name]}): SIGKILL process group\n")
        sys.stderr.flush()
        os.killpg(os.getpgrp(), signal.SIGKILL)


def fail(name: str, subject: str | None = None) -> None:
    """Raise FailPointError if error point `name` is armed (for `subject`, when it names one); else nothing."""
    if name not in _ERRORS:
        return
    armed = _ERRORS[name]
    if armed is None or armed == subject:
        raise FailPointError(f"fail point {name} armed for {subject or 'every subject'}")
