"""What sinks may do on the server's host: the allow-lists of `headrace up --allow-command` and
`--allow-directory`.

Creating a sink that runs a process (EXTERNAL (COMMAND ...)) or writes files (PARQUET) needs a superuser AND the
server's allow-list; with none given (the default) both are off. Checked when the sink is created and again where
the host is touched (the EXTERNAL driver before it spawns, the PARQUET driver before it reads or writes), so a
catalog written by an older version, or edited, cannot bypass the lists.

- A command is allowed when it equals an allowed command line exactly (after stripping surrounding blanks). No
  prefix matching: the command runs through the shell, where anything after an allowed prefix (`; rm -rf ~`)
  would run too.
- A directory is allowed when, with symlinks and `..` resolved (os.path.realpath), it is an allowed directory or
  lies under one, and lies neither in the server's data directory nor is one of its parents: a sink must not
  write over the log, the store or secrets.json.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from headrace.errors import HeadraceError

InsufficientPrivilege = "42501"


@dataclass(frozen=True, slots=True)
class HostAccess:
    commands: tuple[str, ...] = ()
    directories: tuple[str, ...] = ()  # as given; resolved at each check (a symlink may change meanwhile)
    data_dir: str | None = None  # never writable through a sink

    @classmethod
    def from_options(cls, commands: list[str] | tuple[str, ...] | None, directories: list[str] | tuple[str, ...] | None,
                     data_dir: Path | str | None) -> HostAccess:
        return cls(tuple(command.strip() for command in commands or () if command.strip()),
                   tuple(str(Path(directory).expanduser()) for directory in directories or ()),
                   None if data_dir is None else str(data_dir))

    def check_command(self, command: str) -> None:
        """42501 unless the command line is allowed (exactly)."""
        if command.strip() not in self.commands:
            raise HeadraceError("permission denied to run command for an EXTERNAL driver",
                                sqlstate=InsufficientPrivilege,
                                detail=f"The command {command.strip()!r} is not in the server's allow-list.",
                                hint="Start the server with --allow-command '<the exact command line>'.")

    def confine_directory(self, path: str | Path) -> Path:
        """The path resolved (symlinks, `..`), if it is inside an allowed directory and outside the data
        directory; 42501 otherwise. A relative path is refused (22023): it would depend on the server's cwd."""
        text = str(path)
        if not os.path.isabs(text):
            raise HeadraceError(f"PARQUET sink: PATH {text!r} is not an absolute path", sqlstate="22023")
        resolved = os.path.realpath(text)
        if self.data_dir is not None:
            data_dir = os.path.realpath(self.data_dir)
            if _within(resolved, data_dir) or _within(data_dir, resolved):
                raise HeadraceError(f"permission denied for directory {text!r}", sqlstate=InsufficientPrivilege,
                                    detail="A sink may not write into (or above) the server's data directory.")
        if not any(_within(resolved, os.path.realpath(allowed)) for allowed in self.directories):
            raise HeadraceError(f"permission denied for directory {text!r}", sqlstate=InsufficientPrivilege,
                                detail=f"{resolved!r} (symlinks and '..' resolved) is in no directory of the "
                                       "server's allow-list.",
                                hint="Start the server with --allow-directory DIR.")
        return Path(resolved)


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)
