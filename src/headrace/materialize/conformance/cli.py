"""`headrace driver-test`: parse the driver spec and config, run the kit, print the table (or JSON), exit 0/1/2."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from headrace.cli_progress import scenario_bar
from headrace.materialize.conformance import SCENARIOS, run_conformance
from headrace.materialize.conformance.report import EXIT_USAGE, ScenarioResult
from headrace.materialize.conformance.targets import UsageError, resolve_target


def driver_test_main(args: argparse.Namespace) -> int:
    # Drivers log a warning for every failure the kit provokes on purpose (crashes, fencing): keep the table clean.
    logging.basicConfig(level=logging.CRITICAL)
    config = None
    if args.config is not None:
        try:
            config = json.loads(args.config)
        except ValueError as exc:
            print(f"headrace driver-test: --config is not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
    fencing = None if args.fencing is None else args.fencing == "yes"
    try:
        target = resolve_target(args.driver, config, guarantee=args.guarantee, fencing=fencing)
    except UsageError as exc:
        print(f"headrace driver-test: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # e.g. an external driver that does not start: nothing could be tested
        print(f"headrace driver-test: cannot start {args.driver}: {exc}", file=sys.stderr)
        return EXIT_USAGE

    with scenario_bar(len(args.scenarios or SCENARIOS)) as finished:  # a progress bar on a terminal
        def progress(result: ScenarioResult) -> None:
            if not args.json:
                finished(f"  {result.result:4}  {result.scenario} ({result.seconds:.1f} s)")

        try:
            report = run_conformance(target, args.scenarios, progress=progress)
        except UsageError as exc:
            print(f"headrace driver-test: {exc}", file=sys.stderr)
            return EXIT_USAGE
        finally:
            target.close()
    print(report.to_json() if args.json else report.render())
    return report.exit_code
