"""PostgreSQL 15's own regression SQL, fetched from Debian's source package (set-up only, never committed).

`regress_dir()` returns `<cache>/postgresql-<version>/regress` with the `sql/`, `data/` and `expected/` folders of
`src/test/regress`, fetched once per machine: `<cache>` is `<checkout>/.compat-cache` if an earlier run fetched them there,
else the machine's cache (`$HEADRACE_COMPAT_CACHE`, by default `~/.cache/headrace/compat`), so a fresh clone (CI's) does
not fetch and extract them again (~18 s; the files depend on the installed version only). The source package of the installed `postgresql-15` (same version as the
server the harness compares against) is downloaded with `apt-get source --download-only` through a temporary sources
list of our own (`deb-src` for the Debian mirror the machine's own list names; the machine's list has only `deb`), and
only the regression folders are extracted from its `.orig.tar.bz2`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
CACHE = CHECKOUT / ".compat-cache"  # the checkout's: reports, and the regression files of older runs
MACHINE_CACHE = Path(os.environ.get("HEADRACE_COMPAT_CACHE") or
                     Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "headrace" / "compat")
PACKAGE = "postgresql-15"
_MIRROR = "http://deb.debian.org/debian"
_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
_EXTRACTED = ("sql", "data", "expected", "parallel_schedule")

# The 33 regression files measured (issue 16), in pg_regress's schedule order so that a file finds what earlier ones
# left; test_setup.sql runs before all of them (`regress.setup`).
FILES: tuple[str, ...] = (
    "boolean", "char", "varchar", "text", "int2", "int4", "int8", "float4", "float8", "numeric", "strings",
    "date", "time", "timetz", "timestamp", "timestamptz", "interval", "json", "jsonb", "arrays", "case",
    "select", "select_distinct", "limit", "insert", "update", "delete", "union", "join", "subselect",
    "aggregates", "window", "with",
)


def installed_version() -> str:
    """The installed postgresql-15 package's Debian version, e.g. `15.18-0+deb12u1`."""
    result = subprocess.run(["dpkg-query", "-W", "-f=${Version}", PACKAGE], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def _apt_options(workdir: Path) -> list[str]:
    return ["-o", f"Dir::Etc::SourceList={workdir / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/dev/null",
            "-o", f"Dir::State::Lists={workdir / 'lists'}", "-o", "APT::Sandbox::User=root"]


def _download_source(version: str, workdir: Path) -> Path:
    """Download the source package `PACKAGE=version` into `workdir`; return its .orig tarball."""
    (workdir / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    suites = ["bookworm", "bookworm-updates"]  # pool/main; the security suite's pool is not on this mirror
    (workdir / "sources.list").write_text("".join(
        f"deb-src [signed-by={_KEYRING}] {_MIRROR} {suite} main\n" for suite in suites))
    options = _apt_options(workdir)
    subprocess.run(["apt-get", *options, "-qq", "update"], check=True, capture_output=True)
    subprocess.run(["apt-get", *options, "-qq", "source", "--download-only", f"{PACKAGE}={version}"],
                   check=True, capture_output=True, cwd=workdir)
    upstream = version.split("-")[0]
    tarballs = sorted(workdir.glob(f"{PACKAGE}_{upstream}.orig.tar.*"))
    if not tarballs:
        raise RuntimeError(f"apt-get source left no .orig tarball in {workdir}")
    return tarballs[0]


def _extract_regress(tarball: Path, target: Path) -> None:
    pattern = re.compile(r"^[^/]+/src/test/regress/(" + "|".join(map(re.escape, _EXTRACTED)) + r")(/|$)")
    partial = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=target.parent))
    with tarfile.open(tarball) as archive:
        for member in archive:
            match = pattern.match(member.name)
            if match is None or not (member.isfile() or member.isdir()):
                continue
            member.name = member.name[match.start(1):]
            archive.extract(member, partial, filter="data")
    try:
        partial.rename(target)
    except OSError:  # another run extracted the same files first: keep theirs
        shutil.rmtree(partial, ignore_errors=True)
        if not (target / "sql").is_dir():
            raise


def regress_dir(cache: Path | None = None) -> Path:
    """The extracted `src/test/regress` of the installed PostgreSQL 15 (fetched on first use into `cache`, by default
    the machine's cache unless the checkout's has them already)."""
    version = installed_version()
    if cache is None:
        in_checkout = CACHE / f"postgresql-{version}" / "regress"
        cache = CACHE if (in_checkout / "sql").is_dir() else MACHINE_CACHE
    target = cache / f"postgresql-{version}" / "regress"
    if not (target / "sql").is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        download = Path(tempfile.mkdtemp(prefix="download-", dir=cache))  # its own: another run may fetch at once
        try:
            _extract_regress(_download_source(version, download), target)
        finally:
            shutil.rmtree(download, ignore_errors=True)
    missing = [name for name in FILES if not (target / "sql" / f"{name}.sql").exists()]
    if missing:
        raise RuntimeError(f"regression files missing from {target}: {missing}")
    return target
