"""`python -m tests.compat`: the differential run behind `make compat` (docs/compat.md)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.compat import baseline
from tests.compat.corpus import CACHE, FILES, installed_version, regress_dir
from tests.compat.regress import DEFAULT_TIMEOUT_S, FileScore, run_file, setup
from tests.compat.report import table, totals, write_report
from tests.compat.servers import DEFAULT_SETTINGS, SESSION_SETTINGS, running_servers
from tests.compat.views import ViewCases, run_view_cases, view_score, view_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat", description=__doc__)
    parser.add_argument("--files", default=",".join(FILES), help="comma-separated regression files (default: the 33)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-statement timeout, seconds")
    parser.add_argument("--report", type=Path, default=CACHE / "report.json")
    parser.add_argument("--no-views", action="store_true", help="skip headrace's own view cases")
    parser.add_argument("--settings", choices=("regress", "default"), default="regress",
                        help="session settings: pg_regress's (DateStyle 'Postgres, MDY', PST8PDT, ...) or the servers' "
                             "defaults with TimeZone UTC (to tell how much of a score is DateStyle)")
    parser.add_argument("--update-baseline", action="store_true",
                        help="record this run's scores in tests/compat/baseline.json (the ratchet's floor)")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.files.split(",") if name.strip()]
    started = time.monotonic()
    regress = regress_dir()
    CACHE.mkdir(exist_ok=True)  # the regression files may come from the machine's cache
    with tempfile.TemporaryDirectory(prefix="compat-", dir=CACHE) as workdir:
        settings = SESSION_SETTINGS if args.settings == "regress" else DEFAULT_SETTINGS
        with running_servers(Path(workdir), settings) as servers:
            view_cases = None
            if not args.no_views:
                view_cases = ViewCases(servers)
                view_cases.prepare()
            problems = setup(servers, regress) if names else []
            if names:
                print(f"set-up: {len(problems)} statements of test_setup.sql headrace could not run as is", flush=True)
            scores: list[FileScore] = []
            for name in names:
                scores.append(run_file(name, servers, regress, args.timeout))
                s = scores[-1]
                print(f"  {name}: {s.counts['same']}/{s.pg_ok} ({s.seconds:.0f} s)", flush=True)
            view_results: list[dict[str, object]] = []
            if view_cases is not None:
                view_results = run_view_cases(view_cases)
            process = servers.headrace.process
            if process is not None and process.poll() is not None:
                print(f"headrace exited during the run ({process.returncode}); its log ends:\n"
                      f"{servers.headrace.output()[-3000:]}")
    print(table(scores))
    view_same, view_checks = 0, 0
    if view_results:
        print(view_table(view_results))
        view_same, view_checks = view_score(view_results)
    below = _below_baseline(scores, view_same, view_checks)
    print("\n".join(["below tests/compat/baseline.json:", *below]) if below else "no score below the baseline")
    if args.update_baseline and args.settings == "regress":
        baseline.record(scores, view_same, view_checks)
        print(f"baseline recorded: {baseline.BASELINE}")
    write_report(args.report, scores, problems, {"postgresql": installed_version(), "seconds": round(
        time.monotonic() - started), "timeout_s": args.timeout, "views": view_results})
    print(f"report: {args.report} ({time.monotonic() - started:.0f} s)")
    return 0


def _below_baseline(scores: list[FileScore], view_same: int, view_checks: int) -> list[str]:
    recorded = baseline.load() if baseline.BASELINE.exists() else {}
    found = [baseline.regressions(s.name, s.counts["same"], s.pg_ok, recorded) for s in scores if s.name in recorded]
    if view_checks and baseline.VIEWS in recorded:
        found.append(baseline.regressions(baseline.VIEWS, view_same, view_checks, recorded))
    return [line for line in found if line]


if __name__ == "__main__":
    sys.exit(main())
