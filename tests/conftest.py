"""Settings for the whole suite."""

import os

from hypothesis import HealthCheck, settings

# The machine is shared (Spark JVMs, servers, helpers' runs): a property test's input generation may be slow for a
# moment without anything being wrong with the strategy, and timing is never what these tests check.
# Derandomized: a property test tries the same examples in every run, so `make test` fails only for a change, never
# for a lucky draw; HEADRACE_HYPOTHESIS=explore draws new examples each run (to look for new failures).
settings.register_profile("headrace", suppress_health_check=[HealthCheck.too_slow], deadline=None, derandomize=True)
settings.register_profile("explore", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile(os.environ.get("HEADRACE_HYPOTHESIS", "headrace"))

# Every JVM the suite starts (each test server's Spark pipeline and its launcher, the pipeline tests' SparkSession,
# javac and java of the JDBC tests) runs with the client compiler only and the serial collector: a JVM that lives
# seconds to minutes is mostly start-up, and these halve its CPU (measured on this 2-core machine: a SparkSession and
# a few small jobs, 14.6-16.5 s of JVM CPU against 28.9-30.4 s with the defaults; wall 31-42 s against 56-83 s).
# What Spark computes is the same, only how fast; `headrace up` leaves the JVM's defaults to users.
# HEADRACE_TEST_JVM_OPTIONS="" runs the tests with the JVM's defaults.
TEST_JVM_OPTIONS = os.environ.get("HEADRACE_TEST_JVM_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
if TEST_JVM_OPTIONS and TEST_JVM_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join(filter(None, (os.environ.get("JAVA_TOOL_OPTIONS"), TEST_JVM_OPTIONS)))

# With TEST_WORKERS (pytest-xdist, --dist=loadfile) a worker takes the next file as it becomes free, in collection
# order: the longest files go first (longest-processing-time first), so the run does not end with one worker on a
# five-minute kill -9 file while the other idles. Seconds measured in a CI run with 2 workers; the order of the
# other files is unchanged.
SLOW_FILES_SECONDS = {
    "tests/scaleout/test_exactly_once.py": 330, "tests/e2e/test_sink_faults.py": 305,
    "tests/e2e/test_tables.py": 270, "tests/compat/test_ratchet.py": 200, "tests/e2e/test_webhook_quarantine.py": 185,
    "tests/e2e/test_view_errors.py": 165, "tests/e2e/test_walking_skeleton.py": 140, "tests/e2e/test_views.py": 130,
    "tests/e2e/test_privileges.py": 150, "tests/e2e/test_view_faults.py": 110, "tests/fuzz/test_fuzz.py": 100,
    "tests/views_differential/test_generated_views.py": 80, "tests/e2e/test_disk_full.py": 70,
    "tests/views_differential/test_view_expressions.py": 75, "tests/e2e/test_webhook_faults.py": 80,
    "tests/pipeline/test_views.py": 60, "tests/e2e/test_sinks.py": 75, "tests/e2e/test_tables_postgres_compat.py": 45,
    "tests/scaleout/test_spark_master.py": 60, "tests/pipeline/test_batch_loop.py": 150,
    "tests/e2e/test_observability_failure.py": 240, "tests/console/test_console_browser.py": 170,
    "tests/e2e/test_observability.py": 150,
}


def pytest_collection_modifyitems(items: list) -> None:  # type: ignore[type-arg]
    def weight(item: object) -> int:
        path = str(getattr(item, "path", ""))
        return -next((seconds for name, seconds in SLOW_FILES_SECONDS.items() if path.endswith(name)), 0)
    items.sort(key=weight)  # stable: within a file and among the others, collection order
