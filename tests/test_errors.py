"""I/O faults get PostgreSQL's SQLSTATEs, not XX000 (issue 20): what a full disk or a failing device does to a
statement is something the client can act on (retry once space is back)."""

from __future__ import annotations

import errno

from headrace.errors import DiskFull, error_for_os_error


def test_disk_full_is_53100_with_the_file_and_a_hint() -> None:
    error = error_for_os_error(OSError(errno.ENOSPC, "No space left on device", "/data/catalog.json.tmp"))
    assert isinstance(error, DiskFull)
    assert (error.sqlstate, error.http_status, error.hint) == ("53100", 503, "Check free disk space.")
    assert error.message == 'could not write file "/data/catalog.json.tmp": No space left on device'


def test_other_io_faults_map_as_postgresql_does() -> None:
    assert error_for_os_error(OSError(errno.EDQUOT, "quota")).sqlstate == "53100"  # type: ignore[union-attr]
    assert error_for_os_error(OSError(errno.EIO, "io")).sqlstate == "58030"  # type: ignore[union-attr]
    assert error_for_os_error(OSError(errno.EMFILE, "files")).sqlstate == "53000"  # type: ignore[union-attr]


def test_an_oserror_that_is_not_an_io_fault_is_left_alone() -> None:
    assert error_for_os_error(OSError(errno.ENOENT, "missing")) is None
    assert error_for_os_error(OSError("no errno")) is None
