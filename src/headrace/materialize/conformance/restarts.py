"""Scenarios 3 and 5: a runtime dies at every phase boundary, a new one recovers, and every transaction's effect
must appear exactly once (at least once for at-least-once drivers).

One materialization per scenario; transaction n crashes at boundary n (in the order of BOUNDARIES), then:
  1. a new runtime opens (with the same recovery log file, unless the driver is remote-authoritative) and gets the
     checkpoint to resume from: the driver's, or the log's;
  2. that checkpoint must be one the crash allows: before StartCommit nothing of transaction n may be committed;
     after the runtime received StartedCommit a remote-authoritative driver has committed it while a recovery-log
     driver has not (the runtime died before its log did); after the log's commit it is committed; right after
     StartCommit was sent, either;
  3. the new runtime replays every transaction after the checkpoint and acknowledges;
  4. the driver's state must equal the model after n transactions: keyed documents through Load (a transaction
     applied twice shows in the summed count), the delta stream through the target's reader (each document once).

A crash closes the runtime's connection abruptly (as a dying process's sockets close): after Open; after sending
its Loads; after sending Flush; after sending its Stores; after sending StartCommit; on receiving StartedCommit
(before its recovery log commits); after the log's commit (before the next Acknowledge); after sending Acknowledge,
on receiving Acknowledged (the driver applied, the log does not know it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from headrace.materialize.conformance.harness import (
    Document, Harness, KitConnection, KitError, Model, SimulatedCrash, checkpoint, committed_txn, differences,
    events_binding, generated_events, generated_items, items_binding, reducer_for, stream_problems)
from headrace.materialize.conformance.report import FAIL, PASS, SKIP, ScenarioResult
from headrace.materialize.protocol import (
    Acknowledged, Binding, Flush, Load, MaterializationSpec, StartCommit, StartedCommit, Store)


@dataclass(frozen=True)
class Boundary:
    name: str
    after_sending: type | None = None
    on_receiving: type | None = None
    may_commit: bool = False  # transaction n may be committed when the runtime dies here
    must_commit: bool = False  # ... must be (for a remote-authoritative driver: see committed_at_started)
    committed_at_started: bool = False  # committed iff the driver holds the checkpoint (StartedCommit received)


AFTER_OPEN = Boundary("after Open")
AFTER_LOG_COMMIT = Boundary("after the recovery log's commit", must_commit=True)
AFTER_ACKNOWLEDGE = Boundary("after Acknowledge, before Acknowledged", on_receiving=Acknowledged, must_commit=True)
BOUNDARIES = (
    AFTER_OPEN,
    Boundary("after Load", after_sending=Load),
    Boundary("after Flush", after_sending=Flush),
    Boundary("after Store", after_sending=Store),
    Boundary("after StartCommit", after_sending=StartCommit, may_commit=True),
    Boundary("after StartedCommit", on_receiving=StartedCommit, committed_at_started=True),
    AFTER_LOG_COMMIT,
    AFTER_ACKNOWLEDGE,
)
SETTLE_SECONDS = 0.05  # lets the driver notice the lost connection before the next runtime opens


def _crash(harness: Harness, spec: MaterializationSpec, scenario: str, boundary: Boundary, txn: int,
           documents: list[tuple[int, list[str], Document]]) -> bool:
    """Run transaction `txn` on a new runtime that dies at `boundary`; False if the boundary was never reached."""
    connection = KitConnection(harness.target.connect())
    runtime = harness.runtime(spec, scenario, connection)
    try:
        runtime.open()
        if boundary is AFTER_OPEN:
            connection.abandon()
            return True
        connection.crash_after_sending = boundary.after_sending
        if boundary is not AFTER_ACKNOWLEDGE:
            connection.crash_on_receiving = boundary.on_receiving
        runtime.transact(documents, checkpoint(harness.run_id, txn))
        if boundary is AFTER_LOG_COMMIT:
            connection.abandon()
            return True
        if boundary is AFTER_ACKNOWLEDGE:
            connection.crash_on_receiving = Acknowledged  # armed only now: the first Acknowledged came in transact
            runtime.wait_acknowledged()
        return False
    except SimulatedCrash:
        return True
    finally:
        connection.abandon()
        time.sleep(SETTLE_SECONDS)


def _allowed(boundary: Boundary, txn: int, driver_holds_checkpoint: bool) -> set[int]:
    if boundary.may_commit:
        return {txn - 1, txn}
    if boundary.must_commit or (boundary.committed_at_started and driver_holds_checkpoint):
        return {txn}
    return {txn - 1}


def run_restarts(harness: Harness, scenario: str, binding: Binding, label: str) -> ScenarioResult:
    """Scenario 3 (a keyed binding) or 5 (a delta binding): see the module docstring."""
    target = harness.target
    guarantee = (f"{target.guarantee} across a crash at every phase boundary"
                 + ("" if target.exactly_once else " (state equals the model for last-write-wins documents)"))
    spec = harness.spec(scenario, (binding,))
    delta = binding.delta_updates
    generate: Callable[[int], list[tuple[str, Document]]] = generated_events if delta else generated_items
    model = Model(reducer_for(target))
    expected_stream: dict[str, Document] = {}
    boundaries = [b for b in BOUNDARIES if not (delta and b.after_sending is Load)]  # delta bindings never Load
    if delta and target.reader is None:
        return ScenarioResult(label, SKIP, guarantee, "no reader for this driver's target: the kit cannot see its "
                              "append stream")
    setup = harness.runtime(spec, scenario)
    try:
        setup.validate()
        setup.apply()
    finally:
        setup.close()
    outcomes: list[str] = []
    for txn, boundary in enumerate(boundaries, start=1):
        documents = [(0, [key], doc) for key, doc in generate(txn)]
        if not _crash(harness, spec, scenario, boundary, txn, documents):
            raise KitError(f"transaction {txn} never reached the crash point {boundary.name}")
        connection = KitConnection(target.connect())
        runtime = harness.runtime(spec, scenario, connection)
        try:
            resumed = committed_txn(runtime.open())
            driver_checkpoint = connection.opened[-1] if connection.opened else None
            if target.remote_authoritative and txn > 1 and driver_checkpoint is None:
                return ScenarioResult(label, FAIL, guarantee, f"crash {boundary.name} (transaction {txn}): the "
                                      "remote-authoritative driver's Open returned no checkpoint")
            allowed = _allowed(boundary, txn, driver_checkpoint is not None)
            if resumed not in allowed:
                return ScenarioResult(label, FAIL, guarantee, f"crash {boundary.name} (transaction {txn}): Open "
                                      f"resumed from transaction {resumed}, expected "
                                      f"{' or '.join(map(str, sorted(allowed)))}")
            for replayed in range(resumed + 1, txn + 1):
                runtime.transact([(0, [key], doc) for key, doc in generate(replayed)],
                                 checkpoint(harness.run_id, replayed))
            runtime.wait_acknowledged()
        finally:
            runtime.close()
        model.apply(generate(txn))
        expected_stream.update(generate(txn))
        outcomes.append(f"{boundary.name}: {'replayed' if resumed < txn else 'committed'}")
        if delta:
            stream = harness.read_stream(spec, binding) or []
            problems = stream_problems(expected_stream, stream, target.exactly_once, binding.columns)
        else:
            held = harness.probe_loads(spec, scenario, 0, sorted(model.touched))
            problems = differences(model.documents, held, model.touched, binding.columns)
        if problems:
            return ScenarioResult(label, FAIL, guarantee, f"after the crash {boundary.name} (transaction {txn}) "
                                  f"and recovery: {'; '.join(problems)}")
    return ScenarioResult(label, PASS, guarantee, f"{len(boundaries)} crashes, each recovered: "
                          + ", ".join(outcomes))


def restarts(harness: Harness) -> ScenarioResult:
    label = "3 restarts at every phase boundary"
    if harness.target.delta_only:
        return ScenarioResult(label, SKIP, f"{harness.target.guarantee} across restarts",
                              "delta-only driver: no keyed binding (its restarts are scenario 5's)")
    return run_restarts(harness, "s3", items_binding(f"{harness.name('s3')}_items"), label)


def delta_updates(harness: Harness) -> ScenarioResult:
    return run_restarts(harness, "s5", events_binding(f"{harness.name('s5')}_events"),
                        "5 delta updates (with restarts)")
