"""`python -m tests.compat`: the differential run behind `make compat` (docs/compat.md)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.compat import baseline
from tests.compat.corpus import CACHE, FILES, installed_version, regress_dir
from tests.compat.regress import DEFAULT_TIMEOUT_S, FileScore, run_file, setup
from tests.compat.report import table, totals, write_report
from tests.compat.servers import DEFAULT_SETTINGS, SESSION_SETTINGS, Servers, running_servers
from tests.compat.views import ViewCases, run_view_cases, view_score, view_table
from tests.views_differential.generated import GeneratedRun, run_on_new_servers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat", description=__doc__)
    parser.add_argument("--files", default=",".join(FILES), help="comma-separated regression files (default: the 33)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-statement timeout, seconds")
    parser.add_argument("--report", type=Path, default=CACHE / "report.json")
    parser.add_argument("--no-views", action="store_true", help="skip headrace's own view cases")
    parser.add_argument("--generated-views", type=int, default=220, metavar="N",
                        help="issue 22's generated view test: N random views (tables of 22) checked against "
                             "PostgreSQL after each write batch, on servers of their own after the rest (0: skip)")
    parser.add_argument("--generated-seed", type=int, default=22, help="the generated views' seed")
    parser.add_argument("--settings", choices=("regress", "default"), default="regress",
                        help="session settings: pg_regress's (DateStyle 'Postgres, MDY', PST8PDT, ...) or the servers' "
                             "defaults with TimeZone UTC (to tell how much of a score is DateStyle)")
    parser.add_argument("--update-baseline", action="store_true",
                        help="record this run's scores in tests/compat/baseline.json (the ratchet's floor)")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.files.split(",") if name.strip()]
    started = time.monotonic()
    regress = regress_dir() if names else CACHE  # no corpus needed (nor fetched) without files
    CACHE.mkdir(exist_ok=True)  # the regression files may come from the machine's cache
    scores: list[FileScore] = []
    problems: list[dict[str, object]] = []
    view_results: list[dict[str, object]] = []
    generated: GeneratedRun | None = None
    with tempfile.TemporaryDirectory(prefix="compat-", dir=CACHE) as workdir:
        settings = SESSION_SETTINGS if args.settings == "regress" else DEFAULT_SETTINGS
        compared = names or not args.no_views
        with (running_servers(Path(workdir), settings) if compared else _nothing()) as servers:
            view_cases = None
            if servers is not None and not args.no_views:
                view_cases = ViewCases(servers)
                view_cases.prepare()
            problems = setup(servers, regress) if servers is not None and names else []
            if names:
                print(f"set-up: {len(problems)} statements of test_setup.sql headrace could not run as is", flush=True)
            for name in names if servers is not None else ():
                scores.append(run_file(name, servers, regress, args.timeout))
                s = scores[-1]
                print(f"  {name}: {s.counts['same']}/{s.pg_ok} ({s.seconds:.0f} s)", flush=True)
            if view_cases is not None:
                view_results = run_view_cases(view_cases)
            process = servers.headrace.process if servers is not None else None
            if servers is not None and process is not None and process.poll() is not None:
                print(f"headrace exited during the run ({process.returncode}); its log ends:\n"
                      f"{servers.headrace.output()[-3000:]}")
        if args.generated_views > 0:  # servers of its own, once the others have stopped (a 2-core machine)
            print(f"generated views: {args.generated_views}, seed {args.generated_seed}", flush=True)
            generated = run_on_new_servers(Path(workdir) / "generated", args.generated_seed, args.generated_views)
    if names:
        print(table(scores))
    view_same, view_checks = 0, 0
    if view_results:
        print(view_table(view_results))
        view_same, view_checks = view_score(view_results)
    below = _below_baseline(scores, view_same, view_checks)
    print("\n".join(["below tests/compat/baseline.json:", *below]) if below else "no score below the baseline")
    if generated is not None:
        for reason in generated.refused:
            print("generated view refused:", reason)
        for difference in generated.disagreements:
            print("generated view disagrees:", difference)
        print(generated.summary())
    if args.update_baseline and args.settings == "regress" and names:
        baseline.record(scores, view_same, view_checks)
        print(f"baseline recorded: {baseline.BASELINE}")
    write_report(args.report, scores, problems, {"postgresql": installed_version(), "seconds": round(
        time.monotonic() - started), "timeout_s": args.timeout, "views": view_results,
        "generated_views": generated.report() if generated is not None else None})
    print(f"report: {args.report} ({time.monotonic() - started:.0f} s)")
    return 1 if generated is not None and generated.disagreements else 0  # issue 22: 0 disagreements


@contextmanager
def _nothing() -> Iterator[Servers | None]:
    yield None


def _below_baseline(scores: list[FileScore], view_same: int, view_checks: int) -> list[str]:
    recorded = baseline.load() if baseline.BASELINE.exists() else {}
    found = [baseline.regressions(s.name, s.counts["same"], s.pg_ok, recorded) for s in scores if s.name in recorded]
    if view_checks and baseline.VIEWS in recorded:
        found.append(baseline.regressions(baseline.VIEWS, view_same, view_checks, recorded))
    return [line for line in found if line]


if __name__ == "__main__":
    sys.exit(main())
