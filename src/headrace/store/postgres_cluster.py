"""Running a PostgreSQL 15 cluster of one's own: finding the binaries, initdb, pg_ctl start/stop, and whether the
postmaster lives. Shared by the embedded store server (store/postgres_server.py) and the throwaway clusters of the
tests (tests/real_servers/postgres.py), so both start PostgreSQL the same way.

PostgreSQL refuses to run as root: when this process is root, every command runs as the unprivileged `postgres`
account (Debian's postgresql-15 package creates it) through `runuser`, the cluster's directory is given to that
account, and its parents are made traversable (search permission only) for it. As any other user the cluster runs
as that user.

`pg_ctl start` detaches the postmaster into a session of its own (setsid), so it is nobody's child here: a kill -9
of the process that started it leaves it running. Whether it lives is read from its pid file and /proc."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

DEBIAN_BINDIR = Path("/usr/lib/postgresql/15/bin")
SERVER_ACCOUNT_WHEN_ROOT = "postgres"
REQUIRED_MAJOR_VERSION = 15


class PostgresNotInstalled(Exception):
    pass


class ClusterCommandFailed(Exception):
    pass


def find_bindir() -> Path:
    """Debian's PostgreSQL 15, else `pg_config --bindir`, else the directory of `postgres` on PATH; a version other
    than 15 is refused (PostgreSQL 15 is what headrace's answers are checked against)."""
    candidates = [DEBIAN_BINDIR]
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if found.returncode == 0 and found.stdout.strip():
            candidates.append(Path(found.stdout.strip()))
    on_path = shutil.which("postgres")
    if on_path is not None:
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in ("postgres", "initdb", "pg_ctl")) \
                and _major_version(bindir) == REQUIRED_MAJOR_VERSION:
            return bindir
    raise PostgresNotInstalled(
        "PostgreSQL 15 server binaries (postgres, initdb, pg_ctl) not found in /usr/lib/postgresql/15/bin, "
        "`pg_config --bindir` or PATH: `make up` installs them (Debian's postgresql-15 package), or pass "
        "--store postgresql://... to use an existing PostgreSQL")


def _major_version(bindir: Path) -> int | None:
    found = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=False)
    # "postgres (PostgreSQL) 15.8 (Debian 15.8-0+deb12u1)"
    words = found.stdout.split()
    if found.returncode != 0 or len(words) < 3:
        return None
    major = words[2].split(".")[0]
    return int(major) if major.isdigit() else None


def server_account() -> str | None:
    """The account the cluster runs as: `postgres` when this process is root, None (this process's own) otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_ACCOUNT_WHEN_ROOT)
    except KeyError:
        raise PostgresNotInstalled(
            "headrace runs as root and PostgreSQL refuses to: it runs the store as the unprivileged `postgres` "
            "account, which does not exist (Debian's postgresql-15 package creates it; `make up` installs it)") from None
    return SERVER_ACCOUNT_WHEN_ROOT


def as_account(account: str | None, argv: Sequence[str]) -> list[str]:
    return ["runuser", "-u", account, "--", *argv] if account is not None else list(argv)


def make_reachable(directory: Path, account: str | None) -> list[Path]:
    """Give `account` search (x) permission on every parent of `directory` it could not pass, so it reaches the
    cluster under it; nothing is made readable. Returns the directories changed. Nothing to do when the cluster
    runs as this process's own account."""
    if account is None:
        return []
    changed: list[Path] = []
    for parent in directory.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(parent, stat.S_IMODE(mode) | stat.S_IXOTH)
            changed.append(parent)
    return changed


def give_to_account(path: Path, account: str | None, mode: int = 0o700) -> None:
    """Create `path` (a directory) owned by `account` with `mode`; an existing one is given to it too."""
    path.mkdir(parents=True, exist_ok=True)
    if account is not None:
        shutil.chown(path, account, account)
    os.chmod(path, mode)


def give_private_directory_in_shared_place(path: Path, account: str | None) -> None:
    """Like `give_to_account`, for a directory in a place others may write (/tmp): one that exists already must be
    a real directory (not a symlink) owned by `account` or by this process's user, else it is refused, so nobody
    can steer root's chown to a path of their choosing."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        info = os.lstat(path)
        owners = {os.geteuid(), pwd.getpwnam(account).pw_uid if account is not None else os.geteuid()}
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid not in owners:
            raise ClusterCommandFailed(f"{path} exists and is not headrace's: remove it, or use a shorter --data-dir")
    if account is not None:
        os.lchown(path, pwd.getpwnam(account).pw_uid, pwd.getpwnam(account).pw_gid)
    os.chmod(path, 0o700)  # a real directory, checked above


def initdb(bindir: Path, datadir: Path, *, superuser: str, account: str | None, sync: bool = True) -> None:
    """A new cluster in `datadir` (its parent must belong to `account`): UTF8, C.UTF-8 collation, the bootstrap
    superuser named `superuser`, trust authentication (the caller writes the pg_hba.conf it wants)."""
    argv = [str(bindir / "initdb"), "-D", str(datadir), "-A", "trust", "-U", superuser, "-E", "UTF8",
            "--locale=C.UTF-8"]
    ran = subprocess.run(as_account(account, [*argv, *([] if sync else ["--no-sync"])]), capture_output=True,
                         text=True, check=False)
    if ran.returncode != 0:
        raise ClusterCommandFailed(f"initdb failed: {ran.stderr.strip() or ran.stdout.strip()}")


def write_as_account(path: Path, text: str, account: str | None) -> None:
    path.write_text(text)
    os.chmod(path, 0o600)
    if account is not None:
        shutil.chown(path, account, account)


def server_options(settings: Mapping[str, str]) -> str:
    """pg_ctl's -o: `-c name=value` each, quoted for the shell pg_ctl starts the postmaster with."""
    return " ".join(f"-c {shlex.quote(f'{name}={value}')}" for name, value in settings.items())


def pg_ctl_start(bindir: Path, datadir: Path, *, account: str | None, log_file: Path,
                 settings: Mapping[str, str], timeout_s: int = 60) -> subprocess.CompletedProcess[str]:
    """`pg_ctl start -w`: returns once the server accepts connections (or pg_ctl gave up: see returncode)."""
    argv = [str(bindir / "pg_ctl"), "-D", str(datadir), "-w", "-t", str(timeout_s), "-l", str(log_file),
            "-o", server_options(settings), "start"]
    return subprocess.run(as_account(account, argv), capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)


def pg_ctl_stop(bindir: Path, datadir: Path, *, account: str | None, mode: str = "fast",
                timeout_s: int = 30) -> bool:
    """`pg_ctl stop -m <mode>`; True once the server is down (or was not running)."""
    argv = [str(bindir / "pg_ctl"), "-D", str(datadir), "-m", mode, "-w", "-t", str(timeout_s), "stop"]
    ran = subprocess.run(as_account(account, argv), capture_output=True, text=True, check=False,
                         stdin=subprocess.DEVNULL)
    return ran.returncode == 0 or postmaster_pid(datadir) is None


def postmaster_pid(datadir: Path) -> int | None:
    """The pid of the postmaster running on `datadir`, or None: no pid file, or its process is gone (a zombie
    counts as gone: the init process may be slow to reap an orphan)."""
    try:
        first_line = (datadir / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    except (FileNotFoundError, PermissionError):
        return None
    if not first_line.isdigit():
        return None
    pid = int(first_line)
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state = status.rsplit(")", 1)[1].split()[0]  # the field after "(comm)"; comm may hold spaces
    # A recycled pid belongs to another program: the postmaster's comm is "postgres".
    return pid if state != "Z" and command.startswith("postgres") else None


def log_tail(log_file: Path, characters: int = 2000) -> str:
    try:
        return log_file.read_text(errors="replace")[-characters:]
    except FileNotFoundError:
        return ""
