"""Results of the conformance kit: one `ScenarioResult` per scenario, a table for people, JSON for programs.

A result is PASS (the guarantee it names held), FAIL (with the reason: what was expected and what the driver did)
or SKIP (with why: the driver does not claim it, or the kit has no way to observe it, e.g. no reader of an external
target; never a PASS in disguise). Exit codes: 0 when every scenario that ran passed, 1 when any failed, 2 for a
usage error (decided by the CLI before any scenario runs)."""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass, field

PASS = "PASS"
FAIL = "FAIL"
SKIP = "SKIP"

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


@dataclass
class ScenarioResult:
    scenario: str
    result: str  # PASS / FAIL / SKIP
    guarantee: str  # what was checked, e.g. "exactly once across 8 restarts"
    detail: str = ""  # the reason of a FAIL or SKIP; what was observed for a PASS
    seconds: float = 0.0


@dataclass
class ConformanceReport:
    driver: str
    pattern: str
    claims: str
    results: list[ScenarioResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if any(r.result == FAIL for r in self.results) else EXIT_PASSED

    def counts(self) -> dict[str, int]:
        return {kind: sum(1 for r in self.results if r.result == kind) for kind in (PASS, FAIL, SKIP)}

    def to_json(self) -> str:
        return json.dumps({"driver": self.driver, "pattern": self.pattern, "claims": self.claims,
                           "notes": self.notes, "results": [asdict(r) for r in self.results],
                           "counts": self.counts(), "exit_code": self.exit_code}, indent=2)

    def render(self, width: int = 140) -> str:
        """A plain-text table: scenario | result | guarantee checked | detail (wrapped)."""
        headers = ("scenario", "result", "guarantee checked", "detail")
        widths = [max(len(headers[0]), *(len(r.scenario) for r in self.results)), 6,
                  min(30, max(len(headers[2]), *(len(r.guarantee) for r in self.results)))]
        widths.append(max(20, width - sum(widths) - 3 * len(widths) - 1))

        def row(cells: tuple[str, ...]) -> list[str]:
            wrapped = [textwrap.wrap(cell, w) or [""] for cell, w in zip(cells, widths)]
            height = max(len(lines) for lines in wrapped)
            return ["| " + " | ".join((lines[i] if i < len(lines) else "").ljust(w)
                                      for lines, w in zip(wrapped, widths)) + " |" for i in range(height)]

        rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
        lines = [f"driver: {self.driver}", f"pattern: {self.pattern}", f"claims: {self.claims}"]
        lines += [f"note: {note}" for note in self.notes]
        lines += [rule, *row(headers), rule.replace("-", "=")]
        for result in self.results:
            lines += row((result.scenario, result.result, result.guarantee, result.detail))
            lines.append(rule)
        counts = self.counts()
        lines.append(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped")
        return "\n".join(lines)

