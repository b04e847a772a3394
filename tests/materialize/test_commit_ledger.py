"""The driver records each materialization's commits and failures (metrics/materializations.py LEDGER: what
headrace_internal.materializations and /metrics read), and the error point `start_commit:error@<name>` fails the
commits of that materialization only, the runtime seeing the error."""

from __future__ import annotations

import pytest

from headrace import failpoints
from headrace.materialize.protocol import MaterializationError
from headrace.metrics.materializations import LEDGER

from .conftest import DriverServer, webhook_doc, webhook_spec


def test_commits_and_failures_are_recorded(driver_server: DriverServer, monkeypatch: pytest.MonkeyPatch) -> None:
    name = "source_ledger_u1"
    LEDGER.forget(name)
    runtime = driver_server.runtime(webhook_spec(name))
    runtime.open()
    runtime.transact([(0, ["a"], webhook_doc("a", 1))], {"batch_id": 1, "log_end": 64})
    record = LEDGER.get(name)
    assert record is not None
    assert (record.opens, record.transactions, record.failures, record.committed_position) == (1, 1, 0, 64)
    assert record.commit_seconds.count == 1 and record.last_commit_at is not None
    monkeypatch.setattr(failpoints, "_ERRORS", {"start_commit": "source_other"})  # armed for another one
    runtime.transact([(0, ["b"], webhook_doc("b", 2))], {"batch_id": 2, "log_end": 128})
    monkeypatch.setattr(failpoints, "_ERRORS", {"start_commit": name})
    with pytest.raises(MaterializationError, match="fail point start_commit armed for source_ledger_u1"):
        runtime.transact([(0, ["c"], webhook_doc("c", 3))], {"batch_id": 3, "log_end": 192})
    record = LEDGER.get(name)
    assert record is not None
    assert (record.transactions, record.failures, record.consecutive_failures, record.committed_position) == \
        (2, 1, 1, 128)
    assert record.last_error == "FailPointError: fail point start_commit armed for source_ledger_u1"
    runtime.close()
    monkeypatch.setattr(failpoints, "_ERRORS", {})
    again = driver_server.runtime(webhook_spec(name))
    assert again.open() == {"batch_id": 2, "log_end": 128}  # the failed commit left nothing
    again.transact([(0, ["c"], webhook_doc("c", 3))], {"batch_id": 3, "log_end": 192})
    record = LEDGER.get(name)
    assert record is not None and (record.opens, record.consecutive_failures, record.failures) == (2, 0, 1)
    again.close()
