"""One libpq session (psycopg's `pq` layer) that runs a statement with a deadline and returns what a client sees
in PostgreSQL's text format: column names, rows as text, the command tag, or the error's SQLSTATE and message.

The raw libpq layer is used (not psycopg's cursors) so values are compared exactly as the server printed them, with
no client-side type adaptation. A statement past its deadline is cancelled (CancelRequest); a server that does not
end it within a grace period loses the session: it is closed and a new one is opened (the report says so)."""

from __future__ import annotations

import select
import time
from dataclasses import dataclass, field

from psycopg import pq

ExecStatus = pq.ExecStatus
_CANCEL_GRACE_S = 5.0


@dataclass
class Outcome:
    status: str  # ok | error | timeout | lost (the session ended: connection closed by the server, or abandoned)
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[str | None, ...]] = field(default_factory=list)
    tag: str = ""
    sqlstate: str = ""
    message: str = ""
    seconds: float = 0.0


class SessionLost(Exception):
    pass


def _decode(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", errors="replace")


class Session:
    def __init__(self, conninfo: str, setup: tuple[str, ...] = ()) -> None:
        self.conninfo = conninfo
        self.setup = setup  # statements run at each (re)connect, e.g. SET TimeZone
        self.setup_outcomes: list[tuple[str, Outcome]] = []
        self.reconnects = 0
        self._closed = True
        self._conn = self._connect()

    def _connect(self) -> pq.PGconn:
        conn = pq.PGconn.connect(self.conninfo.encode())
        self._closed = False
        if conn.status != pq.ConnStatus.OK:
            message = _decode(conn.error_message)
            conn.finish()
            raise SessionLost(f"cannot connect: {message}")
        self._conn = conn
        self.setup_outcomes = [(sql, self.run(sql, timeout=30.0)) for sql in self.setup]
        return conn

    def reconnect(self) -> None:
        self.close()
        self.reconnects += 1
        self._connect()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._conn.finish()

    def run(self, sql: str, timeout: float, copy_data: bytes | None = None) -> Outcome:
        started = time.monotonic()
        try:
            outcome = self._run(sql, started + timeout, copy_data)
        except SessionLost as lost:
            outcome = Outcome("lost", message=str(lost))
        outcome.seconds = time.monotonic() - started
        if outcome.status in ("lost", "timeout") or self._conn.status == pq.ConnStatus.BAD:
            try:
                self.reconnect()
            except SessionLost as lost:
                outcome.message += f"; reconnect failed: {lost}"
        return outcome

    def _run(self, sql: str, deadline: float, copy_data: bytes | None) -> Outcome:
        conn = self._conn
        if conn.status == pq.ConnStatus.BAD:
            raise SessionLost("connection is closed")
        conn.send_query(sql.encode())
        outcome: Outcome | None = None
        timed_out = False
        while True:
            if not self._wait_ready(deadline):
                if timed_out:
                    raise SessionLost(f"not ended {_CANCEL_GRACE_S:.0f} s after a CancelRequest")
                timed_out = True
                conn.get_cancel().cancel()
                deadline = time.monotonic() + _CANCEL_GRACE_S
                continue
            result = conn.get_result()
            if result is None:
                break
            current = self._outcome_of(result, copy_data)
            # a statement has one result; keep the first error, else the last result
            if outcome is None or outcome.status != "error":
                outcome = current
        if timed_out:
            return Outcome("timeout", message="cancelled after the per-statement timeout")
        return outcome or Outcome("ok", tag="")

    def _wait_ready(self, deadline: float) -> bool:
        """Read input until a result is ready (not busy); False at the deadline."""
        conn = self._conn
        while True:
            conn.consume_input()
            if not conn.is_busy():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            readable, _, _ = select.select([conn.socket], [], [], min(remaining, 1.0))
            if conn.status == pq.ConnStatus.BAD:
                raise SessionLost(_decode(conn.error_message) or "connection closed")

    def _outcome_of(self, result: pq.PGresult, copy_data: bytes | None) -> Outcome:
        conn = self._conn
        status = result.status
        if status == ExecStatus.COPY_IN:
            conn.put_copy_data(copy_data or b"")
            conn.put_copy_end()
            return Outcome("ok", tag="COPY IN")
        if status == ExecStatus.COPY_OUT:
            rows: list[tuple[str | None, ...]] = []
            while True:
                size, data = conn.get_copy_data(0)
                if size < 0:
                    break
                rows.append((bytes(data).decode("utf-8", errors="replace").rstrip("\n"),))
            return Outcome("ok", columns=["(copy)"], rows=rows, tag="COPY OUT")
        if status in (ExecStatus.FATAL_ERROR, ExecStatus.NONFATAL_ERROR, ExecStatus.BAD_RESPONSE):
            return Outcome("error", sqlstate=_decode(result.error_field(pq.DiagnosticField.SQLSTATE)),
                           message=_decode(result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY))
                           or _decode(result.error_message).strip())
        columns = [_decode(result.fname(i)) for i in range(result.nfields)]
        rows = [tuple(None if (value := result.get_value(row, col)) is None else value.decode("utf-8", "replace")
                      for col in range(result.nfields)) for row in range(result.ntuples)]
        return Outcome("ok", columns=columns, rows=rows, tag=_decode(result.command_status))
