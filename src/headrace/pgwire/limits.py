"""Resource limits of the pgwire port, with PostgreSQL's settings as the reference.

* `max_message_bytes` (--max-message-bytes, 64 MiB): the longest message an authenticated client may send.
  PostgreSQL allows 1 GB; a connection buffers a whole message before it is decoded, so the cap bounds a
  connection's input memory: 100 connections x 64 MiB is the worst case. 64 MiB still carries any statement
  (statements are capped at 1 MiB, sql/limits.py), a bytea or jsonb parameter of tens of MB, and a COPY chunk
  (COPY sends many). Before authentication the caps are PostgreSQL's (10,000 bytes for the startup packet and
  other messages, 65,535 for a password or SASL response): messages/frontend.py.
* `max_connections` (--max-connections, 100 as PostgreSQL): connections at once, authenticated or not; one more
  is answered, once its startup packet arrived, FATAL 53300 "sorry, too many clients already".
* `auth_timeout_s` (--auth-timeout, 60 s as PostgreSQL's authentication_timeout): a connection that has not
  completed authentication by then is closed (FATAL 57014 "canceling authentication due to timeout" if it
  had sent its startup packet), so idle sockets cannot pile up before authentication.
* `idle_session_timeout_s` (--idle-session-timeout, 0 = off as PostgreSQL): an authenticated connection idle
  outside a transaction block that long is closed with FATAL 57P05.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.errors import HeadraceError

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
DEFAULT_MAX_CONNECTIONS = 100
DEFAULT_AUTH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PgLimits:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S
    idle_session_timeout_s: float = 0.0  # 0: never


def too_many_clients() -> HeadraceError:
    return HeadraceError("sorry, too many clients already", sqlstate="53300")


def authentication_timeout() -> HeadraceError:
    # PostgreSQL's FATAL (ProcessInterrupts, ERRCODE_QUERY_CANCELED). PostgreSQL only logs it: during authentication
    # it sends nothing to the client; here the transport's write cannot block, so the client is told why.
    return HeadraceError("canceling authentication due to timeout", sqlstate="57014")


def idle_session_timeout() -> HeadraceError:
    return HeadraceError("terminating connection due to idle-session timeout", sqlstate="57P05")


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (each client holds a descriptor; the soft limit is
    often 1,024): returns the (soft, hard) limits now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # some systems cap it below an infinite hard limit: keep what we have
    return soft, hard
