"""The driver conformance kit: `headrace driver-test <driver spec>` and `run_conformance(target)`.

It drives a sink driver through the materialization protocol exactly as the runtime does (a real `Runtime`, the
driver's real connection loop or gRPC server) and reports which guarantees held:

  1 spec/validate/apply        Spec answers the protocol; Validate constrains every field, keys required; Apply
                               creates the target and is idempotent.
  2 scripted transactions      inserts, updates, deletions over several transactions; the next transaction's Loads
                               and a final Load of every key return the kit's model; delta documents read back.
  3 restarts                   a runtime dies at every phase boundary; the next one resumes from the checkpoint Open
                               gives and replays; exactly once (or at least once, as the driver claims).
  4 zombie open                runtime B opens while A is open; A's commit must fail and leave nothing.
  5 delta updates              scenario 3 over a delta-updates binding, checked in the target's append stream.
  6 schema change              Apply with an added value column is accepted and new documents carry it (6a); Apply
                               with a changed key is refused (6b).

The modules: targets.py (what is tested: hosting built-ins in process, starting external drivers, provisioning and
readers), harness.py (bindings, scripted documents, the model, the crashing connection, Load probes), scenarios.py
(1, 2, 4, 6), restarts.py (3, 5), receiver.py (the HTTP receiver), report.py (results, table, JSON, exit codes).
Scenarios never share a materialization; a scenario that raises where it did not expect to is a FAIL naming the
error, and the next scenario still runs."""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from headrace.materialize.conformance.harness import Harness
from headrace.materialize.conformance.report import FAIL, ConformanceReport, ScenarioResult
from headrace.materialize.conformance.restarts import delta_updates, restarts
from headrace.materialize.conformance.scenarios import (
    schema_added_column, schema_changed_key, scripted_transactions, spec_validate_apply, zombie_open)
from headrace.materialize.conformance.targets import DriverUnderTest, UsageError, resolve_target

__all__ = ["SCENARIOS", "ConformanceReport", "DriverUnderTest", "ScenarioResult", "UsageError", "resolve_target",
           "run_conformance"]

Scenario = Callable[[Harness], ScenarioResult]
# name (for --scenario) -> (label in the report, what it checks, the scenario)
SCENARIOS: dict[str, tuple[str, str, Scenario]] = {
    "spec": ("1 spec/validate/apply", "the control requests", spec_validate_apply),
    "transactions": ("2 scripted transactions", "the driver's state equals the model", scripted_transactions),
    "restarts": ("3 restarts at every phase boundary", "recovery", restarts),
    "zombie": ("4 zombie open", "fencing", zombie_open),
    "delta": ("5 delta updates (with restarts)", "append streams", delta_updates),
    "schema-added-column": ("6a schema: added column", "migration", schema_added_column),
    "schema-changed-key": ("6b schema: changed key", "refusal", schema_changed_key),
}


def run_conformance(target: DriverUnderTest, scenarios: Sequence[str] | None = None,
                    workdir: Path | None = None,
                    progress: Callable[[ScenarioResult], None] | None = None) -> ConformanceReport:
    """Run the named scenarios (all by default) against `target`, in order; never raises for a driver's failure."""
    chosen = list(scenarios or SCENARIOS)
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        raise UsageError(f"unknown scenario(s) {', '.join(unknown)}: {', '.join(SCENARIOS)}")
    claims = (f"{target.guarantee}; {'fences zombies' if target.fences else 'no fencing'}"
              + ("; delta updates only" if target.delta_only else ""))
    report = ConformanceReport(target.spec, target.pattern, claims, notes=list(target.notes))
    run_id = secrets.token_hex(3)  # names of this run's materializations and tables: kit_<run id>_<scenario>
    with tempfile.TemporaryDirectory(prefix="headrace-kit-", dir=workdir) as directory:
        harness = Harness(target, Path(directory), run_id)
        for name in chosen:
            label, _, scenario = SCENARIOS[name]
            started = time.monotonic()
            try:
                result = scenario(harness)
            except Exception as exc:  # the driver (or the kit, scripted wrongly) failed where nothing allowed it
                first = str(exc).splitlines()[0] if str(exc) else ""
                result = ScenarioResult(label, FAIL, "", f"unexpected {type(exc).__name__}: {first[:300]}")
            result.seconds = round(time.monotonic() - started, 2)
            report.results.append(result)
            if progress is not None:
                progress(result)
    return report
