"""The kit's instruments: its bindings and scripted documents, the model they must produce, a connection wrapper that
crashes a runtime at a chosen message, and the oracles (Load through the protocol, or a reader of the target).

Documents. Keyed binding `items` (id VARCHAR key; count BIGINT, label VARCHAR, ratio DOUBLE, flag BOOLEAN, note
JSON) and delta binding `events` (id VARCHAR key; item VARCHAR, amount BIGINT, hr_timestamp BIGINT, hr_diff
BIGINT). For an exactly-once driver `count` is a SUM: the runtime Loads the stored document and stores
stored + this transaction, so a transaction whose effects land twice (a replay on top of an applied commit) shows as
a wrong count. For an at-least-once driver documents are last-write-wins (a replay rewrites the same document),
the guarantee such drivers give for full documents. A document `{"_meta": {"op": "d"}}` deletes its key.

The model is the kit's own reduction of the same documents: after transaction n commits, Load of every key the
script touched must return the model's document (absent keys: no Loaded), and the target's append stream must hold
each delta document exactly once (at least once for at-least-once drivers).

`KitConnection` wraps a DriverConnection: it records Opened checkpoints and Loaded documents, and can crash
(close the connection abruptly, as a dying process would, and raise `SimulatedCrash` through the runtime) right
after sending a message of a given type or on receiving one. `probe_loads` opens its own connection, sends Open,
Acknowledge, the Loads and Flush, reads the Loaded documents and hangs up without committing (an abandoned
transaction): the protocol's own read of the driver's state."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.materialize.conformance.targets import DriverUnderTest
from headrace.materialize.protocol import (
    Acknowledge, Acknowledged, Binding, DriverError, ErrorResponse, FencedOff, Flush, Flushed, Load, Loaded,
    MaterializationSpec, Open, Opened, Request, Response)
from headrace.materialize.recovery import RecoveryLog
from headrace.materialize.runtime import DriverConnection, Runtime, is_deletion

Document = dict[str, Any]
ITEM_TYPES = {"id": "VARCHAR", "count": "BIGINT", "label": "VARCHAR", "ratio": "DOUBLE", "flag": "BOOLEAN",
              "note": "JSON"}
EVENT_TYPES = {"id": "VARCHAR", "item": "VARCHAR", "amount": "BIGINT", "hr_timestamp": "BIGINT", "hr_diff": "BIGINT"}
BASE_TIMESTAMP = 1_700_000_000_000  # hr_timestamp of transaction n is BASE_TIMESTAMP + n (ms)
ITEM_KEYS = [f"k{i}" for i in range(6)]


class SimulatedCrash(Exception):
    """The kit cut the runtime's connection at a phase boundary."""


class KitError(Exception):
    """The kit could not run a scenario as scripted (reported as a FAIL with this message)."""


# ---------------------------------------------------------------------------------------------- bindings


def items_binding(table: str, extra: tuple[str, ...] = (), key: tuple[str, ...] = ("id",)) -> Binding:
    types = {**ITEM_TYPES, **{name: "VARCHAR" for name in extra}}
    values = tuple(name for name in types if name not in key)
    return Binding((table,), key, values, {name: types[name] for name in key + values})


def events_binding(table: str, extra: tuple[str, ...] = (), key: tuple[str, ...] = ("id",)) -> Binding:
    types = {**EVENT_TYPES, **{name: "VARCHAR" for name in extra}}
    values = tuple(name for name in types if name not in key)
    return Binding((table,), key, values, {name: types[name] for name in key + values}, delta_updates=True)


# ---------------------------------------------------------------------------------------------- documents


def item_document(key: str, txn: int, count: int, extra: tuple[str, ...] = ()) -> Document:
    document: Document = {"id": key, "count": count, "label": f"{key} at t{txn}", "ratio": txn / 4,
                          "flag": txn % 2 == 0, "note": {"txn": txn, "tags": ["kit", key]}}
    document.update({name: f"{name} of {key} at t{txn}" for name in extra})
    return document


def deletion(key: str) -> Document:
    return {"id": key, "_meta": {"op": "d"}}


def generated_items(txn: int, extra: tuple[str, ...] = ()) -> list[tuple[str, Document]]:
    """Transaction `txn`'s item documents: three keys written (one of them twice, combined), every third
    transaction a deletion; over consecutive transactions every key is inserted, updated, deleted, re-inserted."""
    keys = [ITEM_KEYS[(txn + offset) % len(ITEM_KEYS)] for offset in (0, 1, 3)]
    documents = [(key, item_document(key, txn, txn, extra)) for key in keys]
    documents.append((keys[0], item_document(keys[0], txn, 1, extra)))
    if txn % 3 == 0:
        documents.append((ITEM_KEYS[(txn + 4) % len(ITEM_KEYS)], deletion(ITEM_KEYS[(txn + 4) % len(ITEM_KEYS)])))
    return documents


def generated_events(txn: int, extra: tuple[str, ...] = ()) -> list[tuple[str, Document]]:
    """Transaction `txn`'s delta documents: three new ids (two insertions, one retraction), one upstream commit."""
    documents = []
    for i in range(3):
        event_id = f"e{txn}-{i}"
        document: Document = {"id": event_id, "item": f"k{i}", "amount": txn * 10 + i,
                              "hr_timestamp": BASE_TIMESTAMP + txn, "hr_diff": 1 if i < 2 else -1}
        document.update({name: f"{name} of {event_id}" for name in extra})
        documents.append((event_id, document))
    return documents


def summing(older: Document | None, newer: Document) -> Document:
    """count is a sum (exactly-once drivers): a transaction applied twice shows in it."""
    if older is None or is_deletion(newer) or is_deletion(older):
        return newer
    return {**newer, "count": older["count"] + newer["count"]}


def last_write_wins(older: Document | None, newer: Document) -> Document:
    return newer


def reducer_for(target: DriverUnderTest) -> Callable[[Document | None, Document], Document]:
    return summing if target.exactly_once else last_write_wins


@dataclass
class Model:
    """The kit's expectation of a keyed binding: its reduction of every committed transaction's documents."""

    reduce: Callable[[Document | None, Document], Document]
    documents: dict[str, Document] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)

    def apply(self, documents: list[tuple[str, Document]]) -> None:
        combined: dict[str, Document] = {}
        for key, document in documents:
            combined[key] = self.reduce(combined.get(key), document)
        for key, document in combined.items():
            self.touched.add(key)
            reduced = self.reduce(self.documents.get(key), document)
            if is_deletion(reduced):
                self.documents.pop(key, None)
            else:
                self.documents[key] = reduced


def projected(document: Document | None, columns: tuple[str, ...]) -> Document | None:
    return None if document is None else {name: document.get(name) for name in columns}


def differences(expected: dict[str, Document], actual: dict[str, Document], keys: set[str],
                columns: tuple[str, ...], limit: int = 3) -> list[str]:
    """Human-readable mismatches between the model and what the driver holds, for the given keys."""
    problems = []
    for key in sorted(keys):
        want = projected(expected.get(key), columns)
        have = projected(actual.get(key), columns)
        if want != have:
            problems.append(f"{key}: expected {_short(want)}, the driver has {_short(have)}")
    if len(problems) > limit:
        problems = problems[:limit] + [f"and {len(problems) - limit} more"]
    return problems


def _short(document: Document | None) -> str:
    return "nothing" if document is None else json.dumps(document, sort_keys=True, default=str)


def stream_problems(expected: dict[str, Document], appended: list[Document], exactly_once: bool,
                    columns: tuple[str, ...]) -> list[str]:
    """What is wrong with an append stream: documents missing, appearing twice (exactly-once drivers), unexpected
    (never committed by the kit's model), or with other values than were stored."""
    seen: dict[str, int] = {}
    problems: list[str] = []
    for document in appended:
        event_id = str(document.get("id"))
        seen[event_id] = seen.get(event_id, 0) + 1
        want = projected(expected.get(event_id), columns)
        if want is not None and projected(document, columns) != want and len(problems) < 3:
            problems.append(f"{event_id}: expected {_short(want)}, the target has {_short(document)}")
    missing = sorted(set(expected) - set(seen))
    unexpected = sorted(set(seen) - set(expected))
    twice = sorted(event_id for event_id, count in seen.items() if count > 1 and event_id in expected)
    if missing:
        problems.append(f"missing: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    if unexpected:
        problems.append(f"never committed yet present: {', '.join(unexpected[:6])}")
    if twice and exactly_once:
        problems.append(f"more than once: {', '.join(twice[:6])}{' ...' if len(twice) > 6 else ''}")
    return problems


# ---------------------------------------------------------------------------------------------- connections


class KitConnection:
    """A DriverConnection that records what the driver answered and can crash at a message (module docstring)."""

    def __init__(self, inner: DriverConnection) -> None:
        self._inner = inner
        self.opened: list[dict[str, Any] | None] = []  # the driver's own checkpoints, per Opened
        self.loaded: dict[tuple[int, str], Document] = {}  # (binding, key JSON) -> Loaded document
        self.crash_after_sending: type | None = None
        self.crash_on_receiving: type | None = None
        self.crashed = False

    def send(self, msgs: list[Request]) -> None:
        self._inner.send(msgs)
        if self.crash_after_sending is not None and any(isinstance(m, self.crash_after_sending) for m in msgs):
            self.crash(f"after sending {self.crash_after_sending.__name__}")

    def recv(self) -> Response:
        response = self._inner.recv()
        if isinstance(response, Opened):
            self.opened.append(response.runtime_checkpoint)
        elif isinstance(response, Loaded):
            self.loaded[(response.binding, json.dumps(response.key))] = response.doc
        if self.crash_on_receiving is not None and isinstance(response, self.crash_on_receiving):
            self.crash(f"on receiving {self.crash_on_receiving.__name__}")
        return response

    def crash(self, where: str) -> None:
        self.crashed = True
        self.abandon()
        raise SimulatedCrash(where)

    def abandon(self) -> None:
        """Close the connection at once, mid-transaction if one is open: the driver must roll it back."""
        self._inner.close()

    def close(self) -> None:
        self._inner.close()


# ---------------------------------------------------------------------------------------------- the harness


def checkpoint(run_id: str, txn: int) -> dict[str, Any]:
    return {"conformance_run": run_id, "txn": txn}


def committed_txn(runtime_checkpoint: dict[str, Any] | None) -> int:
    if not runtime_checkpoint:
        return 0
    txn = runtime_checkpoint.get("txn")
    if not isinstance(txn, int):
        raise KitError(f"Open returned a checkpoint the kit never committed: {runtime_checkpoint!r}")
    return txn


class Harness:
    """One conformance run against one target: names, runtimes, recovery logs and oracles."""

    def __init__(self, target: DriverUnderTest, workdir: Path, run_id: str) -> None:
        self.target = target
        self.workdir = workdir
        self.run_id = run_id

    def name(self, scenario: str) -> str:
        return f"kit_{self.run_id}_{scenario}"

    def spec(self, scenario: str, bindings: tuple[Binding, ...]) -> MaterializationSpec:
        return MaterializationSpec(self.name(scenario), bindings, config=self.target.config)

    def log_path(self, scenario: str) -> Path:
        return self.workdir / f"{self.name(scenario)}.recovery.json"

    def uses_log(self) -> bool:
        return self.target.remote_authoritative is not True  # unknown external drivers get one: it cannot hurt

    def runtime(self, spec: MaterializationSpec, scenario: str,
                connection: DriverConnection | None = None) -> Runtime:
        reduce = reducer_for(self.target)
        reducers = [reduce if not binding.delta_updates else last_write_wins for binding in spec.bindings]
        log = RecoveryLog(self.log_path(scenario)) if self.uses_log() else None
        return Runtime(connection or self.target.connect(), spec, reducers=reducers, recovery_log=log)

    def driver_state(self, scenario: str) -> dict[str, Any]:
        return RecoveryLog(self.log_path(scenario)).state.driver_state if self.uses_log() else {}

    def probe_loads(self, spec: MaterializationSpec, scenario: str, binding: int,
                    keys: list[str]) -> dict[str, Document]:
        """Load `keys` of `binding` through the protocol on a connection of its own (module docstring)."""
        connection = self.target.connect()
        try:
            connection.send([Open(spec, 0, 0xFFFFFFFF, self.driver_state(scenario))])
            _expect(connection, Opened)
            connection.send([Acknowledge(), *(Load(binding, [key]) for key in keys)])
            _expect(connection, Acknowledged)
            connection.send([Flush()])
            found: dict[str, Document] = {}
            while True:
                response = _expect(connection, (Loaded, Flushed))
                if isinstance(response, Flushed):
                    return found
                assert isinstance(response, Loaded)
                if response.binding != binding or len(response.key) != 1 or response.key[0] not in keys:
                    raise KitError(f"Loaded answers no Load: binding {response.binding}, key {response.key!r}")
                found[response.key[0]] = response.doc
        finally:
            connection.close()

    def read_stream(self, spec: MaterializationSpec, binding: Binding) -> list[Document] | None:
        """The target's append stream of a delta binding, or None when the kit has no reader for it."""
        if self.target.reader is None:
            return None
        return self.target.reader.appended(spec.name, binding.resource_path, dict(binding.column_types))


def _expect(connection: DriverConnection, kinds: type | tuple[type, ...]) -> Response:
    response = connection.recv()
    if isinstance(response, ErrorResponse):
        raise (FencedOff if response.fenced_off else DriverError)(response.message)
    if not isinstance(response, kinds):
        raise KitError(f"expected {kinds}, the driver sent {type(response).__name__}")
    return response
