"""`python -m tests.compat`: the differential run behind `make compat` (docs/compat.md)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.compat.corpus import CACHE, FILES, installed_version, regress_dir
from tests.compat.regress import DEFAULT_TIMEOUT_S, run_file, setup
from tests.compat.report import table, totals, write_report
from tests.compat.servers import running_servers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat", description=__doc__)
    parser.add_argument("--files", default=",".join(FILES), help="comma-separated regression files (default: the 33)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-statement timeout, seconds")
    parser.add_argument("--report", type=Path, default=CACHE / "report.json")
    parser.add_argument("--no-views", action="store_true", help="skip headrace's own view cases")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.files.split(",") if name.strip()]
    started = time.monotonic()
    regress = regress_dir()
    with tempfile.TemporaryDirectory(prefix="compat-", dir=CACHE) as workdir:
        with running_servers(Path(workdir)) as servers:
            problems = setup(servers, regress)
            print(f"set-up: {len(problems)} statements of test_setup.sql headrace could not run as is", flush=True)
            scores = []
            for name in names:
                scores.append(run_file(name, servers, regress, args.timeout))
                s = scores[-1]
                print(f"  {name}: {s.counts['same']}/{s.pg_ok} ({s.seconds:.0f} s)", flush=True)
            view_results: list[dict[str, object]] = []
            if not args.no_views:
                from tests.compat.views import run_view_cases
                view_results = run_view_cases(servers)
    print(table(scores))
    if view_results:
        from tests.compat.views import view_table
        print(view_table(view_results))
    write_report(args.report, scores, problems, {"postgresql": installed_version(), "seconds": round(
        time.monotonic() - started), "timeout_s": args.timeout, "views": view_results})
    print(f"report: {args.report} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
