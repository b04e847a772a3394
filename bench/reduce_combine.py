"""Combine throughput of a compiled reducer: documents/s for a 6-aggregate view document.

Times are CPU time of this process (steadier than wall time on a shared machine).

The document is what an aggregating view stores per group: count and sum (sum x2), min (minimize), max
(maximize), a {value: count} map with sum leaves (min/max that survive retractions), and a lastWriteWins
column. Each case reduces N documents over G groups as the runtime does: combine each document into its group's
running document (partial reductions), then reduce each combined document into a stored one (full reductions).

    .venv/bin/python bench/reduce_combine.py [--docs 200000] [--groups 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from headrace.materialize.reduce import reducer_for_schema

SUM = {"type": "integer", "reduce": {"strategy": "sum"}}
VIEW_SCHEMA = {
    "type": "object", "reduce": {"strategy": "merge"},
    "properties": {
        "g": {"type": "string"},
        "count": SUM, "total": SUM,
        "lo": {"reduce": {"strategy": "minimize"}}, "hi": {"reduce": {"strategy": "maximize"}},
        "values": {"type": "object", "reduce": {"strategy": "merge"}, "additionalProperties": SUM},
        "last": {"reduce": {"strategy": "lastWriteWins"}},
    },
}


def documents(count: int, groups: int, seed: int = 7) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        group = f"g{rng.randrange(groups)}"
        value = rng.randrange(1000)
        out.append((group, {"g": group, "count": 1, "total": value, "lo": value, "hi": value,
                            "values": {str(value): 1}, "last": i}))
    return out


def run(docs: list[tuple[str, dict[str, Any]]], repeat: int) -> None:
    reducer = reducer_for_schema(VIEW_SCHEMA)
    best_combine = best_full = float("inf")
    for _ in range(repeat):
        combined: dict[str, dict[str, Any]] = {}
        started = time.process_time()
        for group, doc in docs:
            current = combined.get(group)
            combined[group] = doc if current is None else reducer(current, doc)
        middle = time.process_time()
        stored = {group: reducer.full(doc, doc) for group, doc in combined.items()}  # into an existing document
        ended = time.process_time()
        best_combine = min(best_combine, middle - started)
        best_full = min(best_full, ended - middle)
        assert len(stored) == len(combined)
    partial = len(docs) - len(combined)
    print(f"docs={len(docs)} groups={len(combined)}")
    print(f"combine (partial): {partial / best_combine:,.0f} reductions/s ({best_combine * 1e6 / partial:.2f} us each)")
    print(f"reduce into stored (full): {len(combined) / best_full:,.0f} reductions/s")
    print(f"end to end: {len(docs) / (best_combine + best_full):,.0f} docs/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    run(documents(args.docs, args.groups), args.repeat)


if __name__ == "__main__":
    main()
