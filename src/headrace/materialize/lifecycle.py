"""The one ordering state machine of the materialization protocol, after Flow's lifecycle.go.

Both sides use it: the runtime calls `on_request` before sending and `on_response` on receipt; the driver calls
`on_request` on receipt and `on_response` before sending. A violation raises ProtocolOrderError naming the
offending message and the one it should have followed, and leaves the machine unchanged.

Rules (request stream, response stream, and the cross-stream rules that tie them):
  Control requests (Spec, Validate, Apply) come before Open, any number, each answered (Spec, Validated,
    Applied) before the next request.
  Open first after those, once; Opened follows Open, once.
  Acknowledge follows Open | StartCommit, and only once Opened | StartedCommit was received (the runtime can
    only acknowledge a commit that it started and recorded).
  Load follows Acknowledge | Load | Flush (the latter once Flushed was received: a further round); a key at most once per transaction; never for a delta-updates binding.
  LoadColumns (a columnar Load of many keys) follows what Load follows, under the same rules (its keys are not
    tracked one by one: the runtime sends each combined key once); Loads and LoadColumns may alternate.
  Flush follows Acknowledge | Load, and never before Acknowledged was received.
  Store, StoreColumns (a columnar Store) and StartCommit follow Flush | Store | StoreColumns, and only once Flushed was received (stores are fully reduced).
  Acknowledged follows Opened | StartedCommit (unordered relative to Acknowledge).
  Loaded follows Acknowledged | Loaded, answering a Load of this transaction not yet answered.
  LoadedColumns follows what Loaded follows (and Loaded may follow it), answering a LoadColumns of its binding
    not yet answered, at most one each.
  Flushed follows Acknowledged | Loaded | Flushed, once Flush was sent.
  Rounds: after Flushed, the runtime may send further Loads and another Flush before its Stores (views over
    views: a downstream view's keys are known only once the upstream view's documents were loaded); every
    round's Loads are evaluated at its Flush, after the previous commit, and a key is still loaded at most once
    per transaction.
  StartedCommit follows Flushed, once StartCommit was sent.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from headrace.materialize.protocol import (
    Acknowledge,
    Acknowledged,
    Applied,
    Apply,
    ErrorResponse,
    Flush,
    Flushed,
    Load,
    LoadColumns,
    Loaded,
    LoadedColumns,
    Open,
    Opened,
    ProtocolOrderError,
    Request,
    Response,
    Spec,
    SpecResponse,
    StartCommit,
    StartedCommit,
    Store,
    StoreColumns,
    Validate,
    Validated,
    key_identity,
)

# Each control request and the response that answers it.
_CONTROL_ANSWERS: dict[type, type] = {Spec: SpecResponse, Validate: Validated, Apply: Applied}
_CONTROL_RESPONSES = {response: request for request, response in _CONTROL_ANSWERS.items()}

_REQUEST_FOLLOWS: dict[type, tuple[type, ...]] = {
    Acknowledge: (Open, StartCommit),
    Load: (Acknowledge, Load, LoadColumns, Flush),  # after Flush: a further round of Loads, once Flushed arrived
    LoadColumns: (Acknowledge, Load, LoadColumns, Flush),
    Flush: (Acknowledge, Load, LoadColumns),
    Store: (Flush, Store, StoreColumns),
    StoreColumns: (Flush, Store, StoreColumns),  # a columnar Store: same place, same rules
    StartCommit: (Flush, Store, StoreColumns),
}
_RESPONSE_FOLLOWS: dict[type, tuple[type, ...]] = {
    Acknowledged: (Opened, StartedCommit),
    Loaded: (Acknowledged, Loaded, LoadedColumns, Flushed),  # after Flushed: answering a further round's Loads
    LoadedColumns: (Acknowledged, Loaded, LoadedColumns, Flushed),
    Flushed: (Acknowledged, Loaded, LoadedColumns, Flushed),
    StartedCommit: (Flushed,),
}


def _name(kind: type | None) -> str:
    if kind is SpecResponse:
        return "Spec (response)"
    return "nothing" if kind is None else kind.__name__


def _check_follows(kind: type, last: type | None, follows: Mapping[type, Any], side: str, opening: type) -> None:
    """The one ordering rule shared by requests and responses: `kind` may only follow what its table allows."""
    allowed = follows.get(kind)
    if allowed is None:
        raise ProtocolOrderError(f"{kind.__name__} is not a {side}")
    if last is None:
        raise ProtocolOrderError(f"{kind.__name__} sent before {opening.__name__}")
    if last not in allowed:
        raise ProtocolOrderError(f"{kind.__name__} must follow {_either(allowed)}, but follows {_name(last)}")


def _either(kinds: tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kinds)


class TransactionLifecycle:
    """Tracks the last request and last response, plus the keys loaded in the current transaction."""

    def __init__(self) -> None:
        self._last_request: type | None = None
        self._last_response: type | None = None
        self._delta_updates: tuple[bool, ...] = ()  # per binding, learned from Open
        self._loaded_keys: set[Hashable] = set()  # keys sent in Loads this transaction
        self._unanswered_keys: set[Hashable] = set()  # of those, keys no Loaded answered yet
        self._flush_answered = False  # the last Flush has its Flushed
        self._unanswered_columns: list[int] = []  # bindings of LoadColumns not answered yet

    @property
    def last_request(self) -> type | None:
        return self._last_request

    @property
    def last_response(self) -> type | None:
        return self._last_response

    def on_request(self, msg: Request) -> None:
        kind = type(msg)
        if kind in _CONTROL_ANSWERS or kind is Open:
            self._check_before_open(kind)
            if kind is Open:
                assert isinstance(msg, Open)
                self._delta_updates = tuple(b.delta_updates for b in msg.spec.bindings)
            self._last_response = None  # each control pair, and then the transactions, start afresh
            self._last_request = kind
            return
        _check_follows(kind, self._last_request, _REQUEST_FOLLOWS, "request", Open)
        if kind is Acknowledge:
            self._check_acknowledge()
            self._loaded_keys.clear()
            self._unanswered_keys.clear()
            self._unanswered_columns.clear()
        elif kind is Load or kind is LoadColumns:
            assert isinstance(msg, (Load, LoadColumns))
            if self._last_request is Flush and not self._flush_answered:
                raise ProtocolOrderError("Load of a further round sent before Flushed was received "
                                         f"(last response: {_name(self._last_response)})")
            if isinstance(msg, Load):
                self._check_load(msg)
            else:
                self._check_binding(LoadColumns, msg.binding)
                if self._delta_updates[msg.binding]:
                    raise ProtocolOrderError(f"LoadColumns sent for delta-updates binding {msg.binding}")
                self._unanswered_columns.append(msg.binding)
        elif kind is Flush:
            self._flush_answered = False
            if self._last_response not in (Acknowledged, Loaded, LoadedColumns, Flushed):
                raise ProtocolOrderError("Flush sent before Acknowledged was received "
                                         f"(last response: {_name(self._last_response)})")
        else:  # Store, StoreColumns, StartCommit
            if self._last_response is not Flushed or not self._flush_answered:
                raise ProtocolOrderError(f"{kind.__name__} sent before Flushed was received "
                                         f"(last response: {_name(self._last_response)})")
            if kind is Store or kind is StoreColumns:
                assert isinstance(msg, (Store, StoreColumns))
                self._check_binding(kind, msg.binding)
        self._last_request = kind

    def on_response(self, msg: Response) -> None:
        kind = type(msg)
        if kind is ErrorResponse:
            return  # an error may come at any time; the connection ends with it
        if kind in _CONTROL_RESPONSES:
            request = _CONTROL_RESPONSES[kind]
            if self._last_request is not request or self._last_response is kind:
                raise ProtocolOrderError(f"{_name(kind)} must answer {request.__name__}, but the last request "
                                         f"is {_name(self._last_request)}"
                                         + (" (already answered)" if self._last_response is kind else ""))
            self._last_response = kind
            return
        if kind is Opened:
            if self._last_response is not None:
                raise ProtocolOrderError(f"Opened must be the first response, but follows "
                                         f"{_name(self._last_response)}")
            if self._last_request is not Open:
                raise ProtocolOrderError(f"Opened must answer Open, but the last request is "
                                         f"{_name(self._last_request)}")
            self._last_response = Opened
            return
        _check_follows(kind, self._last_response, _RESPONSE_FOLLOWS, "response", Opened)
        if kind is Loaded:
            assert isinstance(msg, Loaded)
            identity = key_identity(msg.binding, msg.key)
            if identity not in self._unanswered_keys:
                raise ProtocolOrderError(f"Loaded for binding {msg.binding} key {msg.key!r} answers no "
                                         "outstanding Load of this transaction")
            self._unanswered_keys.discard(identity)
        elif kind is LoadedColumns:
            assert isinstance(msg, LoadedColumns)
            if msg.binding not in self._unanswered_columns:
                raise ProtocolOrderError(f"LoadedColumns for binding {msg.binding} answers no outstanding "
                                         "LoadColumns of this transaction")
            self._unanswered_columns.remove(msg.binding)
        elif kind is Flushed:
            if self._last_request is not Flush or self._flush_answered:
                raise ProtocolOrderError(f"Flushed sent before Flush was received "
                                         f"(last request: {_name(self._last_request)})")
            self._unanswered_keys.clear()  # keys absent from the store are simply never Loaded
            self._unanswered_columns.clear()
            self._flush_answered = True
        elif kind is StartedCommit:
            if self._last_request is not StartCommit:
                raise ProtocolOrderError(f"StartedCommit sent before StartCommit was received "
                                         f"(last request: {_name(self._last_request)})")
        self._last_response = kind

    def _check_before_open(self, kind: type) -> None:
        last = self._last_request
        if last is None:
            return
        if last not in _CONTROL_ANSWERS:
            what = "Open" if kind is Open else f"{kind.__name__} (a control request)"
            raise ProtocolOrderError(f"{what} must be the first request, but follows {_name(last)}")
        if self._last_response is not _CONTROL_ANSWERS[last]:
            raise ProtocolOrderError(f"{kind.__name__} sent before {_name(_CONTROL_ANSWERS[last])} answered "
                                     f"{last.__name__}")

    def _check_acknowledge(self) -> None:
        if self._last_request is Open and self._last_response is None:
            raise ProtocolOrderError("Acknowledge sent before Opened was received")
        if self._last_request is StartCommit and self._last_response is Flushed:
            raise ProtocolOrderError("Acknowledge sent before StartedCommit was received")

    def _check_load(self, msg: Load) -> None:
        self._check_binding(Load, msg.binding)
        if self._delta_updates[msg.binding]:
            raise ProtocolOrderError(f"Load sent for delta-updates binding {msg.binding}")
        identity = key_identity(msg.binding, msg.key)
        if identity in self._loaded_keys:
            raise ProtocolOrderError(f"Load of binding {msg.binding} key {msg.key!r} sent twice in one "
                                     "transaction")
        self._loaded_keys.add(identity)
        self._unanswered_keys.add(identity)

    def _check_binding(self, kind: type, binding: int) -> None:
        if not 0 <= binding < len(self._delta_updates):
            raise ProtocolOrderError(f"{kind.__name__} names binding {binding}, but Open declared "
                                     f"{len(self._delta_updates)}")

