"""Scenarios 1, 2, 4 and 6 of the conformance kit (3 and 5, the restarts, are in restarts.py).

Each scenario uses a materialization (and tables) of its own, named `kit_<run id>_<scenario>`, so scenarios do not
disturb each other and repeated runs against one server do not collide. Each returns a ScenarioResult; an exception
a scenario did not expect from the driver becomes a FAIL naming it (the runner in __init__.py does that)."""

from __future__ import annotations

import json

from headrace.materialize.conformance.harness import (
    ITEM_KEYS, Document, Harness, KitConnection, Model, checkpoint, differences, events_binding, generated_events,
    generated_items, item_document, deletion, items_binding, projected, reducer_for, stream_problems)
from headrace.materialize.conformance.report import FAIL, PASS, SKIP, ScenarioResult
from headrace.materialize.protocol import (
    FIELD_REQUIRED, LOCATION_REQUIRED, PROTOCOL_VERSION, Binding, MaterializationSpec)

# Scenario 2's script: inserts, updates (exists=true), two documents of one key in one transaction, deletions, a
# deleted key inserted again.
SCRIPT: list[list[tuple[str, Document]]] = [
    [(key, item_document(key, 1, i + 1)) for i, key in enumerate(ITEM_KEYS[:4])],
    [("k0", item_document("k0", 2, 10)), ("k1", item_document("k1", 2, 10)), ("k4", item_document("k4", 2, 5))],
    [("k2", deletion("k2")), ("k3", item_document("k3", 3, 7)), ("k0", item_document("k0", 3, 1)),
     ("k0", item_document("k0", 3, 2))],
    [("k2", item_document("k2", 4, 3)), ("k4", item_document("k4", 4, 1)), ("k1", deletion("k1"))],
]


def _bindings(harness: Harness, scenario: str, extra: tuple[str, ...] = (),
              key: tuple[str, ...] = ("id",)) -> tuple[Binding, ...]:
    name = harness.name(scenario)
    events = events_binding(f"{name}_events", extra, key)
    return (events,) if harness.target.delta_only else (items_binding(f"{name}_items", extra, key), events)


# ---------------------------------------------------------------------------------------------- 1


def spec_validate_apply(harness: Harness) -> ScenarioResult:
    guarantee = "Spec, Validate and Apply answer as the protocol says; Apply is idempotent"
    spec = harness.spec("s1", _bindings(harness, "s1"))
    runtime = harness.runtime(spec, "s1")
    try:
        answer = runtime.spec_of_driver()
        if answer.protocol != PROTOCOL_VERSION:
            return ScenarioResult("1 spec/validate/apply", FAIL, guarantee,
                                  f"Spec answered protocol {answer.protocol}, not {PROTOCOL_VERSION}")
        validated = runtime.validate()  # refuses forbidden, incompatible or missing required fields itself
        problems = []
        for binding, checked in zip(spec.bindings, validated.bindings):
            unanswered = sorted(set(binding.column_types) - set(checked.constraints))
            if unanswered:
                problems.append(f"{binding.resource_path[0]}: no constraint for {', '.join(unanswered)}")
            for key in binding.key:
                constraint = checked.constraints.get(key)
                if constraint is not None and constraint.type not in (LOCATION_REQUIRED, FIELD_REQUIRED):
                    problems.append(f"key {key} is {constraint.type}, not required")
        if problems:
            return ScenarioResult("1 spec/validate/apply", FAIL, guarantee, "; ".join(problems))
        first = runtime.apply()
    finally:
        runtime.close()
    again = harness.runtime(spec, "s1")
    try:
        second = again.apply(last_spec=spec)  # the same spec again: nothing to do, and no error
        again.open()
    finally:
        again.close()
    return ScenarioResult("1 spec/validate/apply", PASS, guarantee,
                          f"protocol {answer.protocol}; {len(spec.bindings)} binding(s) validated; Apply: "
                          f"{first.action_description!r}; again: {second.action_description!r}")


# ---------------------------------------------------------------------------------------------- 2


def scripted_transactions(harness: Harness) -> ScenarioResult:
    target = harness.target
    name = "2 scripted transactions"
    guarantee = "after each commit, Load returns the model's documents"
    if target.delta_only:
        return ScenarioResult(name, SKIP, guarantee, "delta-only driver: no standard updates (see scenario 5)")
    spec = harness.spec("s2", _bindings(harness, "s2"))
    items, events = spec.bindings
    connection = KitConnection(target.connect())
    runtime = harness.runtime(spec, "s2", connection)
    model = Model(reducer_for(target))
    appended: dict[str, Document] = {}
    problems: list[str] = []
    try:
        runtime.validate()
        runtime.apply()
        runtime.open()
        for txn, documents in enumerate(SCRIPT, start=1):
            connection.loaded.clear()
            events_of_txn = generated_events(txn)
            runtime.transact([(0, [key], doc) for key, doc in documents]
                             + [(1, [key], doc) for key, doc in events_of_txn], checkpoint(harness.run_id, txn))
            loaded = {json.loads(key)[0]: doc for (binding, key), doc in connection.loaded.items() if binding == 0}
            mismatch = differences(model.documents, loaded, {key for key, _ in documents}, items.columns)
            if mismatch and not problems:
                problems.append(f"Loads of transaction {txn} (after {txn - 1} committed): " + "; ".join(mismatch))
            model.apply(documents)
            appended.update(events_of_txn)
        runtime.wait_acknowledged()  # recovery-log drivers apply the last commit now
    finally:
        runtime.close()
    held = harness.probe_loads(spec, "s2", 0, sorted(model.touched))
    mismatch = differences(model.documents, held, model.touched, items.columns)
    if mismatch:
        problems.append(f"after the last commit: {'; '.join(mismatch)}")
    stream = harness.read_stream(spec, events)
    stream_note = "no reader for the delta binding's target: its stream was not checked"
    if stream is not None:
        stream_note = f"{len(stream)} delta documents read back"
        stream_problems_found = stream_problems(appended, stream, target.exactly_once, events.columns)
        if stream_problems_found:
            problems.append("delta binding: " + "; ".join(stream_problems_found))
    if problems:
        return ScenarioResult(name, FAIL, guarantee, " | ".join(problems))
    return ScenarioResult(name, PASS, guarantee,
                          f"{len(SCRIPT)} transactions (inserts, updates, deletions, a key combined twice); "
                          f"{len(model.documents)} keys held as modelled; {stream_note}")


# ---------------------------------------------------------------------------------------------- 4


def zombie_open(harness: Harness) -> ScenarioResult:
    target = harness.target
    name = "4 zombie open"
    guarantee = "a fenced-off runtime commits nothing"
    if not target.fences:
        reason = ("the driver does not fence (declared): with a recovery log, the log's single owner keeps "
                  "zombies out" if target.spec != "http" else
                  "HTTP has nothing to fence with: a zombie's POSTs carry the idempotency keys of the same changes")
        return ScenarioResult(name, SKIP, guarantee, reason)
    spec = harness.spec("s4", _bindings(harness, "s4"))
    binding = spec.bindings[0]
    delta = binding.delta_updates
    generate = generated_events if delta else generated_items
    model = Model(reducer_for(target))
    expected_events: dict[str, Document] = {}

    def documents(txn: int) -> list[tuple[int, list[str], Document]]:
        return [(0, [key], doc) for key, doc in generate(txn)]

    setup = harness.runtime(spec, "s4")
    try:
        setup.validate()
        setup.apply()
        setup.open()
        setup.transact(documents(1), checkpoint(harness.run_id, 1))
        setup.wait_acknowledged()
    finally:
        setup.close()
    model.apply(generate(1))
    expected_events.update(generate(1))
    zombie, successor = harness.runtime(spec, "s4"), harness.runtime(spec, "s4")
    zombie_error: Exception | None = None
    zombie_documents = [(0, ["zombie"], (dict(generated_events(9)[0][1], id="zombie") if delta
                                         else item_document("zombie", 9, 1000)))]
    zombie_documents += [(0, [key], doc) for key, doc in generate(2)]  # the same keys B writes, other values
    zombie_documents = [(b, k, {**d, "label": "from the zombie"} if not delta else {**d, "item": "zombie"})
                        for b, k, d in zombie_documents]
    try:
        zombie.open()
        successor.open()  # fences the zombie off
        try:
            zombie.transact(zombie_documents, checkpoint(harness.run_id, 2))
            zombie.wait_acknowledged()
        except Exception as exc:  # FencedOff, or another error: either way it must have committed nothing
            zombie_error = exc
        successor.transact(documents(2), checkpoint(harness.run_id, 2))
        successor.wait_acknowledged()
    finally:
        zombie.close()
        successor.close()
    model.apply(generate(2))
    expected_events.update(generate(2))
    if delta:
        stream = harness.read_stream(spec, binding)
        if stream is None:
            return ScenarioResult(name, SKIP, guarantee, "no reader for the target: cannot see what the zombie left")
        problems = stream_problems(expected_events, stream, target.exactly_once, binding.columns)
    else:
        keys = model.touched | {"zombie"}
        problems = differences(model.documents, harness.probe_loads(spec, "s4", 0, sorted(keys)), keys,
                               binding.columns)
    if zombie_error is None:
        return ScenarioResult(name, FAIL, guarantee, "runtime A committed after runtime B opened the same "
                              "materialization (no FencedOff, no error)" +
                              (f"; and its writes are visible: {'; '.join(problems)}" if problems else ""))
    if problems:
        return ScenarioResult(name, FAIL, guarantee, f"A failed ({_brief(zombie_error)}) but the target is not "
                              f"B's: {'; '.join(problems)}")
    return ScenarioResult(name, PASS, guarantee, f"A failed with {_brief(zombie_error)}; nothing of A appears; "
                          "B's transaction committed")


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:140]}"


# ---------------------------------------------------------------------------------------------- 6


def _run_once(harness: Harness, spec: MaterializationSpec, scenario: str, txn: int,
              documents: list[tuple[int, list[str], Document]], last_spec: MaterializationSpec | None) -> str:
    runtime = harness.runtime(spec, scenario)
    try:
        runtime.validate()
        applied = runtime.apply(last_spec=last_spec)
        runtime.open()
        runtime.transact(documents, checkpoint(harness.run_id, txn))
        runtime.wait_acknowledged()
    finally:
        runtime.close()
    return applied.action_description


def schema_added_column(harness: Harness) -> ScenarioResult:
    target = harness.target
    name = "6a schema: added column"
    guarantee = "Apply adds a value column; new documents carry it"
    v1 = harness.spec("s6", _bindings(harness, "s6")[:1])
    v2 = harness.spec("s6", _bindings(harness, "s6", extra=("extra",))[:1])
    binding = v2.bindings[0]
    delta = binding.delta_updates
    generate = generated_events if delta else generated_items
    model = Model(reducer_for(target))
    _run_once(harness, v1, "s6", 1, [(0, [k], d) for k, d in generate(1)], None)
    model.apply(generate(1))
    second = generate(2, ("extra",))
    description = _run_once(harness, v2, "s6", 2, [(0, [k], d) for k, d in second], v1)
    model.apply(second)
    if delta:
        stream = harness.read_stream(v2, binding)
        if stream is None:
            return ScenarioResult(name, SKIP, guarantee, f"Apply answered {description!r}, but the kit has no "
                                  "reader to see the new column")
        expected = dict(generate(1)) | dict(second)
        problems = stream_problems(expected, stream, target.exactly_once, binding.columns)
    else:
        held = harness.probe_loads(v2, "s6", 0, sorted(model.touched))
        problems = differences(model.documents, held, model.touched, binding.columns)
        carried = [key for key, _ in second if key in held and projected(held[key], ("extra",)) ==
                   projected(model.documents.get(key), ("extra",))]
        if not carried and not problems:
            problems.append("no document carries the new column")
    if problems:
        return ScenarioResult(name, FAIL, guarantee, f"Apply answered {description!r}; " + "; ".join(problems))
    kind = "delta documents" if delta else "documents"
    return ScenarioResult(name, PASS, guarantee, f"Apply answered {description!r}; {kind} before and after the "
                          "change read back as modelled (the new column NULL in older ones)")


def schema_changed_key(harness: Harness) -> ScenarioResult:
    target = harness.target
    name = "6b schema: changed key"
    guarantee = "Apply refuses a changed key"
    if target.schemaless:
        return ScenarioResult(name, SKIP, guarantee, "schemaless target: Apply records no key that a change could "
                              "contradict")
    # Its own materialization, applied first with the original key: a driver that cannot be reached
    # (or cannot apply at all) fails here, where an error is not a refusal, instead of passing below.
    original = harness.spec("s6b", _bindings(harness, "s6b", extra=("extra",))[:1])
    changed = harness.spec("s6b", _bindings(harness, "s6b", extra=("extra",), key=("id", "extra"))[:1])
    first = harness.runtime(original, "s6b")
    try:
        first.validate()
        first.apply(last_spec=None)
    finally:
        first.close()
    runtime = harness.runtime(changed, "s6b")
    try:
        runtime.validate()
        applied = runtime.apply(last_spec=original)
    except Exception as exc:  # refused: what the protocol asks
        return ScenarioResult(name, PASS, guarantee, f"refused: {_brief(exc)}")
    finally:
        runtime.close()
    return ScenarioResult(name, FAIL, guarantee, f"Apply of key (id, extra) over key (id) was accepted: "
                          f"{applied.action_description!r}")
