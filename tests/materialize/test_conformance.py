"""The driver conformance kit (`headrace driver-test`): every built-in driver passes it against a real target
(PostgreSQL and Redis servers from tests/real_servers, Parquet into a temporary directory, HTTP into the kit's
idempotent receiver), the JSON Lines example passes as an external `command:` driver, deliberately broken drivers
(tests/materialize/broken_driver.py) fail the scenario their bug breaks, a driver claiming more than it gives fails
too, and the CLI prints the table and exits 0 / 1 / 2."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.materialize.conformance import ConformanceReport, UsageError, resolve_target, run_conformance
from headrace.materialize.conformance.report import FAIL, PASS, SKIP

from ..real_servers.postgres import PostgresCluster
from ..real_servers.redis import RedisServer, redis_server  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "drivers" / "jsonl" / "driver.py"
BROKEN = Path(__file__).resolve().parent / "broken_driver.py"


def results(report: ConformanceReport) -> dict[str, str]:
    """Scenario number -> PASS / FAIL / SKIP."""
    return {result.scenario.split()[0]: result.result for result in report.results}


def run(spec: str, config: dict[str, object] | None = None, scenarios: list[str] | None = None,
        **claims: object) -> ConformanceReport:
    target = resolve_target(spec, config, **claims)  # type: ignore[arg-type]
    try:
        return run_conformance(target, scenarios)
    finally:
        target.close()


def explain(report: ConformanceReport) -> str:
    return report.render()


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with PostgresCluster(tmp_path_factory.mktemp("postgres")) as cluster:
        yield cluster.create_database("kit")


# ---------------------------------------------------------------------------------------------- built-ins pass


def test_parquet_passes_every_scenario() -> None:
    report = run("parquet")
    assert results(report) == {n: PASS for n in ("1", "2", "3", "4", "5", "6a", "6b")}, explain(report)
    assert report.exit_code == 0
    restarts = next(r for r in report.results if r.scenario.startswith("3"))
    assert "exactly once" in restarts.guarantee and "8 crashes" in restarts.detail


def test_postgres_passes_every_scenario(postgres_url: str) -> None:
    report = run("postgres", {"url": postgres_url})
    assert results(report) == {n: PASS for n in ("1", "2", "3", "4", "5", "6a", "6b")}, explain(report)
    restarts = next(r for r in report.results if r.scenario.startswith("3"))
    assert "after StartedCommit: committed" in restarts.detail  # remote-authoritative: the driver's checkpoint


def test_redis_passes_at_least_once(redis_server: RedisServer) -> None:  # noqa: F811
    report = run("redis", {"url": redis_server.url(redis_server.fresh_db())})
    assert results(report) == {"1": PASS, "2": PASS, "3": PASS, "4": PASS, "5": PASS, "6a": PASS, "6b": SKIP}, \
        explain(report)
    restarts = next(r for r in report.results if r.scenario.startswith("3"))
    assert restarts.guarantee.startswith("at least once") and "last-write-wins" in restarts.guarantee
    assert report.exit_code == 0


def test_redis_claimed_exactly_once_fails_restarts(redis_server: RedisServer) -> None:  # noqa: F811
    """The oracle can fail: Redis writes before the runtime's log commits, so a replay lands a transaction twice,
    which the summed count shows once the driver is (wrongly) held to exactly once."""
    report = run("redis", {"url": redis_server.url(redis_server.fresh_db())}, ["restarts"], guarantee="exactly-once")
    assert results(report) == {"3": FAIL}, explain(report)
    assert "StartCommit" in report.results[0].detail and "count" in report.results[0].detail  # or StartedCommit


def test_http_passes_into_the_kits_receiver() -> None:
    report = run("http")
    assert results(report) == {"1": PASS, "2": SKIP, "3": SKIP, "4": SKIP, "5": PASS, "6a": PASS, "6b": SKIP}, \
        explain(report)
    assert report.exit_code == 0
    assert any("receiver" in note for note in report.notes)


def test_jsonl_example_passes_as_an_external_command() -> None:
    report = run(f"command:{sys.executable} {EXAMPLE}")
    assert results(report) == {"1": PASS, "2": PASS, "3": PASS, "4": SKIP, "5": PASS, "6a": PASS, "6b": PASS}, \
        explain(report)
    assert "does not fence" in next(r for r in report.results if r.scenario.startswith("4")).detail


# ---------------------------------------------------------------------------------------------- broken drivers fail


def test_a_driver_applying_at_commit_fails_restarts(tmp_path: Path) -> None:
    report = run(f"command:{sys.executable} {BROKEN} apply-at-commit", {"path": str(tmp_path)},
                 ["transactions", "restarts"])
    assert results(report) == {"2": PASS, "3": FAIL}, explain(report)
    assert "after StartedCommit" in report.results[1].detail  # the replay of a transaction that already landed


def test_a_driver_ignoring_its_fence_fails_the_zombie_scenario(tmp_path: Path) -> None:
    report = run(f"command:{sys.executable} {BROKEN} ignore-fence", {"path": str(tmp_path)}, ["zombie"])
    assert results(report) == {"4": FAIL}, explain(report)
    assert "runtime A committed after runtime B opened" in report.results[0].detail
    assert "its writes are visible" in report.results[0].detail


def test_usage_errors() -> None:
    with pytest.raises(UsageError, match="needs a server"):
        resolve_target("postgres")
    with pytest.raises(UsageError, match="unknown driver"):
        resolve_target("mysql")
    with pytest.raises(UsageError, match="host:port"):
        resolve_target("address:")


# ---------------------------------------------------------------------------------------------- the CLI


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", "driver-test", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_cli_parquet_exits_0_and_prints_the_table() -> None:
    done = cli("parquet")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| 3 restarts at every phase boundary | PASS" in done.stdout
    assert "7 passed, 0 failed, 0 skipped" in done.stdout


def test_cli_broken_driver_exits_1_with_json(tmp_path: Path) -> None:
    done = cli(f"command:{sys.executable} {BROKEN} ignore-fence", "--config", json.dumps({"path": str(tmp_path)}),
               "--scenario", "zombie", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["exit_code"] == 1 and report["results"][0]["result"] == FAIL


def test_cli_usage_errors_exit_2() -> None:
    missing = cli("postgres")
    assert missing.returncode == 2 and "--config" in missing.stderr
    assert cli("parquet", "--config", "{not json").returncode == 2
    assert cli("parquet", "--scenario", "nonsense").returncode == 2


@pytest.mark.parametrize(("driver", "config"), [
    ("postgres", {"url": "postgresql://kit@127.0.0.1:1/kit"}),  # nothing listens on port 1
])
def test_cli_a_driver_that_cannot_connect_fails_every_scenario(driver: str, config: dict[str, object]) -> None:
    for scenario in ("spec", "schema-changed-key"):  # alone: no other scenario's failure to lean on
        done = cli(driver, "--config", json.dumps(config), "--scenario", scenario, "--json")
        assert done.returncode == 1, done.stdout + done.stderr
        (result,) = json.loads(done.stdout)["results"]
        assert result["result"] == FAIL and "connect" in result["detail"], result
