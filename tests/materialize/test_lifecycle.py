"""TransactionLifecycle: one test per ordering rule, and a property test against a reference model."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.materialize.lifecycle import TransactionLifecycle
from headrace.materialize.protocol import (
    Acknowledge,
    Acknowledged,
    Binding,
    ErrorResponse,
    Flush,
    Flushed,
    Load,
    Loaded,
    MaterializationSpec,
    Open,
    Opened,
    ProtocolOrderError,
    StartCommit,
    StartedCommit,
    Store,
)

SPEC = MaterializationSpec("m", (
    Binding(("t0",), ("k",), ("v",), {"k": "VARCHAR", "v": "JSON"}),
    Binding(("t1",), ("k",), ("v",), {"k": "VARCHAR", "v": "JSON"}, delta_updates=True),
))
OPEN = Open(SPEC, 0, 0xFFFFFFFF, {})


def store(binding: int = 0, key: str = "a") -> Store:
    return Store(binding, [key], [1], {"k": key, "v": 1}, exists=False)


def opened_and_acknowledged() -> TransactionLifecycle:
    """Open, Opened, Acknowledge, Acknowledged: ready for Loads and Flush."""
    machine = TransactionLifecycle()
    machine.on_request(OPEN)
    machine.on_response(Opened(None))
    machine.on_request(Acknowledge())
    machine.on_response(Acknowledged())
    return machine


def flushed(machine: TransactionLifecycle) -> TransactionLifecycle:
    machine.on_request(Flush())
    machine.on_response(Flushed())
    return machine


def committed(machine: TransactionLifecycle) -> TransactionLifecycle:
    machine.on_request(StartCommit({"n": 1}))
    machine.on_response(StartedCommit())
    return machine


def test_a_whole_transaction_and_the_next_one_are_accepted() -> None:
    machine = opened_and_acknowledged()
    machine.on_request(Load(0, ["a"]))
    machine.on_request(Load(0, ["b"]))
    machine.on_request(Flush())
    machine.on_response(Loaded(0, ["a"], {"k": "a"}))
    machine.on_response(Flushed())
    machine.on_request(store(0, "a"))
    machine.on_request(store(1, "a"))
    committed(machine)
    machine.on_request(Acknowledge())
    machine.on_request(Load(0, ["a"]))  # the same key again: a new transaction
    machine.on_response(Acknowledged())
    machine.on_response(Loaded(0, ["a"], {"k": "a"}))  # Loads may be answered before Flush
    flushed(machine)
    committed(machine)


def test_open_must_come_first_and_once() -> None:
    with pytest.raises(ProtocolOrderError, match="Acknowledge sent before Open"):
        TransactionLifecycle().on_request(Acknowledge())
    machine = TransactionLifecycle()
    machine.on_request(OPEN)
    with pytest.raises(ProtocolOrderError, match="Open must be the first request, but follows Open"):
        machine.on_request(OPEN)


def test_opened_follows_open_once() -> None:
    with pytest.raises(ProtocolOrderError, match="Opened must answer Open, but the last request is nothing"):
        TransactionLifecycle().on_response(Opened(None))
    machine = TransactionLifecycle()
    machine.on_request(OPEN)
    machine.on_response(Opened({}))
    with pytest.raises(ProtocolOrderError, match="Opened must be the first response, but follows Opened"):
        machine.on_response(Opened(None))


def test_acknowledge_follows_open_or_start_commit() -> None:
    machine = opened_and_acknowledged()
    with pytest.raises(ProtocolOrderError, match="Acknowledge must follow Open or StartCommit, but follows "
                                                 "Acknowledge"):
        machine.on_request(Acknowledge())
    flushed(machine)
    with pytest.raises(ProtocolOrderError, match="but follows Flush"):
        machine.on_request(Acknowledge())


def test_acknowledge_waits_for_opened_and_started_commit() -> None:
    machine = TransactionLifecycle()
    machine.on_request(OPEN)
    with pytest.raises(ProtocolOrderError, match="Acknowledge sent before Opened was received"):
        machine.on_request(Acknowledge())
    machine = flushed(opened_and_acknowledged())
    machine.on_request(StartCommit({}))
    with pytest.raises(ProtocolOrderError, match="Acknowledge sent before StartedCommit was received"):
        machine.on_request(Acknowledge())


def test_acknowledge_and_acknowledged_are_unordered() -> None:
    early = TransactionLifecycle()  # Acknowledged before Acknowledge
    early.on_request(OPEN)
    early.on_response(Opened(None))
    early.on_response(Acknowledged())
    early.on_request(Acknowledge())
    early.on_request(Flush())
    late = committed(flushed(opened_and_acknowledged()))  # Acknowledge before Acknowledged
    late.on_request(Acknowledge())
    late.on_request(Load(0, ["a"]))
    late.on_response(Acknowledged())
    late.on_request(Flush())


def test_acknowledged_follows_opened_or_started_commit() -> None:
    machine = opened_and_acknowledged()
    with pytest.raises(ProtocolOrderError, match="Acknowledged must follow Opened or StartedCommit, but follows "
                                                 "Acknowledged"):
        machine.on_response(Acknowledged())
    with pytest.raises(ProtocolOrderError, match="Acknowledged sent before Opened"):
        TransactionLifecycle().on_response(Acknowledged())


def test_load_follows_acknowledge_or_load() -> None:
    machine = TransactionLifecycle()
    machine.on_request(OPEN)
    machine.on_response(Opened(None))
    with pytest.raises(ProtocolOrderError, match="Load must follow Acknowledge or Load or LoadColumns or Flush, but follows Open"):
        machine.on_request(Load(0, ["a"]))
    machine = opened_and_acknowledged()
    machine.on_request(Flush())
    with pytest.raises(ProtocolOrderError, match="Load of a further round sent before Flushed was received"):
        machine.on_request(Load(0, ["a"]))


def test_a_further_round_of_loads_after_flushed() -> None:
    """Views over views: Loads, Flush, Loaded, Flushed may repeat before the Stores; a key still once."""
    machine = opened_and_acknowledged()
    machine.on_request(Load(0, ["a"]))
    machine.on_request(Flush())
    machine.on_response(Loaded(0, ["a"], {}))
    machine.on_response(Flushed())
    with pytest.raises(ProtocolOrderError, match="Flushed sent before Flush was received"):
        machine.on_response(Flushed())
    machine.on_request(Load(0, ["b"]))
    with pytest.raises(ProtocolOrderError, match="sent twice in one transaction"):
        machine.on_request(Load(0, ["a"]))
    machine.on_request(Flush())
    machine.on_response(Loaded(0, ["b"], {}))
    machine.on_response(Flushed())
    machine.on_request(StartCommit({}))
    machine.on_response(StartedCommit())


def test_a_key_is_loaded_at_most_once_per_transaction() -> None:
    machine = opened_and_acknowledged()
    machine.on_request(Load(0, ["a"]))
    machine.on_request(Load(0, [1]))
    machine.on_request(Load(0, [True]))  # distinct from 1, as in Flow's packed keys
    with pytest.raises(ProtocolOrderError, match=r"key \['a'\] sent twice"):
        machine.on_request(Load(0, ["a"]))


def test_delta_updates_bindings_are_never_loaded() -> None:
    machine = opened_and_acknowledged()
    with pytest.raises(ProtocolOrderError, match="Load sent for delta-updates binding 1"):
        machine.on_request(Load(1, ["a"]))
    with pytest.raises(ProtocolOrderError, match="Load names binding 2, but Open declared 2"):
        machine.on_request(Load(2, ["a"]))


def test_flush_is_never_sent_before_acknowledged() -> None:
    machine = TransactionLifecycle()
    machine.on_request(OPEN)
    machine.on_response(Opened(None))
    machine.on_request(Acknowledge())
    machine.on_request(Load(0, ["a"]))
    with pytest.raises(ProtocolOrderError, match="Flush sent before Acknowledged was received"):
        machine.on_request(Flush())
    machine.on_response(Acknowledged())
    machine.on_request(Flush())


def test_store_and_start_commit_follow_flush_or_store() -> None:
    machine = opened_and_acknowledged()
    with pytest.raises(ProtocolOrderError, match="Store must follow Flush or Store or StoreColumns, but follows Acknowledge"):
        machine.on_request(store())
    with pytest.raises(ProtocolOrderError, match="StartCommit must follow Flush or Store or StoreColumns, but follows "
                                                 "Acknowledge"):
        machine.on_request(StartCommit({}))
    flushed(machine)
    machine.on_request(store())
    machine.on_request(StartCommit({}))
    with pytest.raises(ProtocolOrderError, match="Store must follow Flush or Store or StoreColumns, but follows StartCommit"):
        machine.on_request(store())


def test_stores_wait_for_flushed() -> None:
    machine = opened_and_acknowledged()
    machine.on_request(Flush())
    with pytest.raises(ProtocolOrderError, match="Store sent before Flushed was received"):
        machine.on_request(store())
    with pytest.raises(ProtocolOrderError, match="StartCommit sent before Flushed was received"):
        machine.on_request(StartCommit({}))
    with pytest.raises(ProtocolOrderError, match="Store names binding 5"):
        flushed_machine = flushed(opened_and_acknowledged())
        flushed_machine.on_request(store(binding=5))


def test_loaded_follows_acknowledged_and_answers_a_load() -> None:
    machine = TransactionLifecycle()
    machine.on_request(OPEN)
    machine.on_response(Opened(None))
    machine.on_request(Acknowledge())
    machine.on_request(Load(0, ["a"]))
    with pytest.raises(ProtocolOrderError, match="Loaded must follow Acknowledged or Loaded or LoadedColumns or Flushed, but follows Opened"):
        machine.on_response(Loaded(0, ["a"], {}))
    machine.on_response(Acknowledged())
    with pytest.raises(ProtocolOrderError, match=r"key \['b'\] answers no outstanding Load"):
        machine.on_response(Loaded(0, ["b"], {}))
    machine.on_response(Loaded(0, ["a"], {}))
    with pytest.raises(ProtocolOrderError, match=r"key \['a'\] answers no outstanding Load"):
        machine.on_response(Loaded(0, ["a"], {}))


def test_flushed_follows_acknowledged_or_loaded_and_flush() -> None:
    machine = opened_and_acknowledged()
    with pytest.raises(ProtocolOrderError, match="Flushed sent before Flush was received"):
        machine.on_response(Flushed())
    machine = TransactionLifecycle()
    machine.on_request(OPEN)
    machine.on_response(Opened(None))
    with pytest.raises(ProtocolOrderError, match="Flushed must follow Acknowledged or Loaded or LoadedColumns or Flushed, but follows Opened"):
        machine.on_response(Flushed())


def test_started_commit_follows_flushed_and_start_commit() -> None:
    machine = opened_and_acknowledged()
    with pytest.raises(ProtocolOrderError, match="StartedCommit must follow Flushed, but follows Acknowledged"):
        machine.on_response(StartedCommit())
    flushed(machine)
    with pytest.raises(ProtocolOrderError, match="StartedCommit sent before StartCommit was received"):
        machine.on_response(StartedCommit())


def test_errors_are_accepted_anywhere_and_change_nothing() -> None:
    machine = TransactionLifecycle()
    machine.on_response(ErrorResponse("boom"))
    assert machine.last_request is None and machine.last_response is None


# ---------------------------------------------------------------------------------------------- property test
# The reference model restates the rules over the whole history: each stream must be a prefix of its regular
# language, and the cross-stream rules are counts ("Flush number i needs Acknowledged number i").

# A transaction may hold further rounds of Loads after Flushed (views over views): F(L+F)*.
REQUEST_PREFIX = re.compile(r"(O(AL*F(L+F)*S*C)*(AL*(F(L+F)*(L+|S*))?)?)?")
RESPONSE_PREFIX = re.compile(r"(P(KD*X(D*X)*T)*(KD*(X(D*X)*D*)?)?)?")
TOKENS = {Open: "O", Acknowledge: "A", Load: "L", Flush: "F", Store: "S", StartCommit: "C",
          Opened: "P", Acknowledged: "K", Loaded: "D", Flushed: "X", StartedCommit: "T"}

Event = tuple[str, Any]
ALPHABET: list[Event] = [
    ("request", OPEN), ("request", Acknowledge()), ("request", Flush()), ("request", StartCommit({})),
    ("request", Load(0, ["a"])), ("request", Load(0, ["b"])), ("request", Load(1, ["a"])),
    ("request", Load(2, ["a"])), ("request", store(0)), ("request", store(1)), ("request", store(2)),
    ("response", Opened(None)), ("response", Acknowledged()), ("response", Flushed()), ("response", StartedCommit()),
    ("response", Loaded(0, ["a"], {})), ("response", Loaded(0, ["b"], {})), ("response", Loaded(1, ["a"], {})),
]


def count(kind: type, msgs: list[Any]) -> int:
    return sum(1 for m in msgs if type(m) is kind)


def reference_legal(history: list[Event], event: Event) -> bool:
    requests = [m for side, m in history if side == "request"]
    responses = [m for side, m in history if side == "response"]
    side, msg = event
    if side == "request":
        tokens = "".join(TOKENS[type(m)] for m in requests + [msg])
        if not REQUEST_PREFIX.fullmatch(tokens):
            return False
        txn = count(Acknowledge, requests)  # the request transaction `msg` belongs to (1-based, after Ack)
        if isinstance(msg, Acknowledge):
            return count(Opened, responses) + count(StartedCommit, responses) >= txn + 1
        if isinstance(msg, Load):
            if msg.binding not in (0, 1) or SPEC.bindings[msg.binding].delta_updates:
                return False
            last_ack = max(i for i, m in enumerate(requests) if isinstance(m, Acknowledge))
            if isinstance(requests[-1], Flush) and count(Flushed, responses) < count(Flush, requests):
                return False  # a further round only once the last Flush is answered
            return all(not (isinstance(m, Load) and (m.binding, m.key) == (msg.binding, msg.key))
                       for m in requests[last_ack:])
        if isinstance(msg, Flush):
            return count(Acknowledged, responses) >= txn
        if isinstance(msg, (Store, StartCommit)):
            if isinstance(msg, Store) and msg.binding not in (0, 1):
                return False
            return count(Flushed, responses) >= txn and count(Flushed, responses) == count(Flush, requests)
        return True  # Open: the regex already says "first, once"
    tokens = "".join(TOKENS[type(m)] for m in responses + [msg])
    if not RESPONSE_PREFIX.fullmatch(tokens):
        return False
    txn = count(Acknowledged, responses)
    if isinstance(msg, Opened):
        return count(Open, requests) == 1
    if isinstance(msg, Flushed):
        return count(Flush, requests) >= txn and count(Flush, requests) > count(Flushed, responses)
    if isinstance(msg, StartedCommit):
        return count(StartCommit, requests) >= txn
    if isinstance(msg, Loaded):
        acks = [i for i, m in enumerate(requests) if isinstance(m, Acknowledge)]
        if len(acks) < txn:
            return False
        start = acks[txn - 1]
        flushes = [i for i, m in enumerate(requests) if isinstance(m, Flush)]
        answered_flushes = count(Flushed, responses)
        if answered_flushes:  # loads before an answered Flush are settled (absent keys never answered)
            start = max(start, flushes[answered_flushes - 1])
        requested = [(m.binding, m.key) for m in requests[start:] if isinstance(m, Load)]
        last_acked = max(i for i, m in enumerate(responses) if isinstance(m, Acknowledged))
        answered = [(m.binding, m.key) for m in responses[last_acked:] if isinstance(m, Loaded)]
        return (msg.binding, msg.key) in requested and (msg.binding, msg.key) not in answered
    return True  # Acknowledged: the regex says it follows Opened or StartedCommit


def apply(machine: TransactionLifecycle, event: Event) -> bool:
    side, msg = event
    try:
        (machine.on_request if side == "request" else machine.on_response)(msg)
    except ProtocolOrderError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_machine_accepts_exactly_the_legal_sequences(data: st.DataObject) -> None:
    machine = TransactionLifecycle()
    history: list[Event] = []
    for _ in range(data.draw(st.integers(min_value=1, max_value=80))):
        legal = [e for e in ALPHABET if reference_legal(history, e)]
        # Mostly legal moves, so sequences get deep into several transactions; some arbitrary ones to probe.
        pick_legal = legal and data.draw(st.integers(min_value=0, max_value=3)) > 0
        event = data.draw(st.sampled_from(legal if pick_legal else ALPHABET))
        expected = reference_legal(history, event)
        assert apply(machine, event) == expected, (history, event)
        if expected:
            history.append(event)  # a rejected message must leave the machine as it was
