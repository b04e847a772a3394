"""PipelinedRuntime: an open Runtime's transactions run back to back on a committer thread, fed by producers.

Split from runtime.py (its size); it drives the Runtime's transaction steps directly, as a friend of that class."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from headrace.materialize.protocol import MaterializationError
from headrace.materialize.runtime import Document, Runtime, _cyclic_gc_paused, _Transaction


class PipelinedRuntime:
    """Runs an open Runtime's transactions back to back on a committer thread, fed by producer threads.

    `feed(documents, checkpoint)` combines documents into the pending transaction at once and returns a ticket;
    `wait(ticket)` returns once the transaction holding them committed. The committer's loop, per transaction:
      1. wait for pending documents; Acknowledge; Load the keys combined so far (before Acknowledged);
      2. await Acknowledged (the driver's previous commit), while producers keep feeding the same transaction;
      3. close it: Loads of the keys that arrived meanwhile, Flush, Loaded, Store, StartCommit, StartedCommit.
    Documents fed during steps 2-3 of one transaction therefore join the next: under back-pressure (a slow
    commit) transactions grow instead of queueing. The pending transaction is bounded: `feed` blocks while it
    holds `max_pending_keys` keys. The checkpoint of a transaction is the last one fed into it.
    A failure ends the committer; `feed` and `wait` then raise it."""

    def __init__(self, runtime: Runtime, max_pending_keys: int = 500_000) -> None:
        self.runtime = runtime
        self.max_pending_keys = max_pending_keys
        self.transaction_sizes: list[int] = []  # keys per committed transaction (observability, tests)
        self._condition = threading.Condition()
        self._pending = _Transaction()
        self._pending_checkpoint: dict[str, Any] | None = None
        self._fed_ticket = 0  # the ticket of the newest feed
        self._committed_ticket = 0  # every feed up to this ticket is committed
        self._closing = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._commit_loop, name=f"committer-{runtime.spec.name}",
                                        daemon=True)
        self._thread.start()

    def feed(self, documents: Iterable[tuple[int, list[Any], Document]], runtime_checkpoint: dict[str, Any]) -> int:
        """Combine `documents` into the pending transaction; returns the ticket to `wait` for."""
        batch = list(documents)  # outside the lock: a generator may be slow
        with self._condition:
            while (len(self._pending.combined) >= self.max_pending_keys and self._failure is None
                   and not self._closing):
                self._condition.wait()
            self._raise_failure()
            if self._closing:
                raise MaterializationError("pipelined runtime is closing")
            self.runtime._combine_into(self._pending, batch)
            self._pending_checkpoint = runtime_checkpoint
            self._fed_ticket += 1
            self._condition.notify_all()
            return self._fed_ticket

    def wait(self, ticket: int, timeout: float | None = None) -> None:
        """Block until the transaction holding `ticket` committed (TimeoutError after `timeout` seconds)."""
        with self._condition:
            if not self._condition.wait_for(lambda: self._committed_ticket >= ticket or self._failure is not None,
                                            timeout):
                raise TimeoutError(f"ticket {ticket} not committed within {timeout} s")
            if self._committed_ticket < ticket:
                self._raise_failure()

    def close(self, timeout: float | None = 30.0) -> None:
        """Commit what is pending, stop the committer and close the runtime."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        self._thread.join(timeout)
        self.runtime.close()
        with self._condition:
            self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise MaterializationError(f"pipelined runtime of {self.runtime.spec.name} failed: "
                                       f"{self._failure}") from self._failure

    def _commit_loop(self) -> None:
        runtime = self.runtime
        try:
            while True:
                with self._condition:
                    self._condition.wait_for(lambda: self._fed_ticket > self._committed_ticket or self._closing)
                    if self._fed_ticket == self._committed_ticket:
                        return  # closing with nothing pending
                    early_loads = runtime._new_loads(self._pending)
                with runtime._failing_permanently():
                    runtime._send_acknowledge()
                    runtime._send_loads(early_loads)
                    runtime._await_acknowledged()  # meanwhile, feed() keeps growing the pending transaction
                with self._condition:
                    txn, self._pending = self._pending, _Transaction()
                    checkpoint, ticket = self._pending_checkpoint, self._fed_ticket
                    late_loads = runtime._new_loads(txn)
                    self._condition.notify_all()  # feeders blocked on a full transaction may go on
                assert checkpoint is not None
                with runtime._failing_permanently(), _cyclic_gc_paused():
                    runtime._send_loads(late_loads)
                    runtime._finish(txn, checkpoint)
                with self._condition:
                    self.transaction_sizes.append(len(txn.combined))
                    self._committed_ticket = ticket
                    self._condition.notify_all()
        except BaseException as exc:
            with self._condition:
                self._failure = exc
                self._condition.notify_all()
