"""One error family for both front ends.

Every error a user can cause carries a SQLSTATE (for pgwire) and an HTTP status (for the webhook and
SQL HTTP endpoints), mapped here in one place so pgwire and HTTP never disagree.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Notice:
    """A message to the client that is not an error (pgwire NoticeResponse): PostgreSQL's WARNING 25001 for a BEGIN
    inside a block, a notice the store PostgreSQL raised, ... A plain string among a response's notices is a NOTICE
    with 00000."""

    message: str
    sqlstate: str = "00000"
    severity: str = "NOTICE"
    detail: str | None = None
    hint: str | None = None


def as_notice(notice: str | Notice) -> Notice:
    return notice if isinstance(notice, Notice) else Notice(notice)


class HeadraceError(Exception):
    """An error a user caused: reported to them, never a crash."""

    sqlstate: str = "XX000"
    http_status: int = 500
    severity: str = "ERROR"

    def __init__(self, message: str, *, detail: str | None = None, hint: str | None = None,
                 position: int | None = None, sqlstate: str | None = None,
                 http_status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.hint = hint
        self.position = position  # 1-based character position in the query text, as PostgreSQL reports it
        if sqlstate is not None:
            self.sqlstate = sqlstate
        if http_status is not None:
            self.http_status = http_status


class SyntaxError_(HeadraceError):
    sqlstate = "42601"
    http_status = 400


class UndefinedObject(HeadraceError):
    """Unknown source, table or view (42P01)."""

    sqlstate = "42P01"
    http_status = 404


class UndefinedColumn(HeadraceError):
    sqlstate = "42703"
    http_status = 400


class DuplicateObject(HeadraceError):
    sqlstate = "42P07"
    http_status = 409


class FeatureNotSupported(HeadraceError):
    sqlstate = "0A000"
    http_status = 400


class DataError(HeadraceError):
    sqlstate = "22000"
    http_status = 400


class InvalidParameterValue(HeadraceError):
    sqlstate = "22023"
    http_status = 400


class ProtocolViolation(HeadraceError):
    sqlstate = "08P01"
    http_status = 400


class UndefinedPreparedStatement(HeadraceError):
    sqlstate = "26000"
    http_status = 400


class UndefinedCursor(HeadraceError):
    sqlstate = "34000"
    http_status = 400


class QueryCanceled(HeadraceError):
    sqlstate = "57014"
    http_status = 499


class ServiceUnavailable(HeadraceError):
    """Starting, shutting down, or a durable write failed: the caller should retry later."""

    sqlstate = "57P03"
    http_status = 503

    def __init__(self, message: str, *, retry_after_s: int = 1, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.retry_after_s = retry_after_s


class InternalError(HeadraceError):
    sqlstate = "XX000"
    http_status = 500


class DiskFull(HeadraceError):
    """PostgreSQL's disk_full: retried by the client once space is back; nothing half-done was kept."""

    sqlstate = "53100"
    http_status = 503


_SQLSTATE_OF_ERRNO = {errno.ENOSPC: "53100", errno.EDQUOT: "53100", errno.EIO: "58030", errno.EMFILE: "53000",
                      errno.ENFILE: "53000", errno.ENOMEM: "53200"}


def error_for_os_error(error: OSError) -> HeadraceError | None:
    """The SQLSTATE PostgreSQL reports for the same I/O fault (53100 disk_full, 58030 io_error, 53000
    insufficient_resources, 53200 out_of_memory), or None for an OSError that is not one of those."""
    sqlstate = _SQLSTATE_OF_ERRNO.get(error.errno or 0)
    if sqlstate is None:
        return None
    reason = os.strerror(error.errno or 0)
    where = f' "{error.filename}"' if error.filename else ""
    hint = "Check free disk space." if sqlstate == "53100" else None
    cls = DiskFull if sqlstate == "53100" else HeadraceError
    return cls(f"could not write file{where}: {reason}", sqlstate=sqlstate, hint=hint, http_status=503)


@contextmanager
def io_faults_as_errors() -> Iterator[None]:
    """Around a statement's execution, for every front end: an OSError that is an I/O fault leaves as its
    PostgreSQL error (error_for_os_error); any other exception passes unchanged."""
    try:
        yield
    except OSError as error:
        mapped = error_for_os_error(error)
        if mapped is None:
            raise
        raise mapped from error
