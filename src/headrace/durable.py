"""Replacing a small state file so that a crash leaves either the old or the new contents, never a torn mix."""

from __future__ import annotations

import os
from pathlib import Path


def replace_file_durably(path: Path, data: bytes, *, mode: int = 0o644, temporary: Path | None = None) -> None:
    """Write `data` to a temporary file, fsync it, rename it over `path` and fsync the directory (so the
    rename itself survives a power loss). `mode` is applied even when a stale temporary file had wider
    permissions."""
    temporary = temporary or path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(descriptor, mode)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
