"""A cumulative histogram kept as plain numbers (cheap to observe, thread-safe enough under the GIL for counters
read at scrape time), convertible to a Prometheus family and to JSON (the pipeline process's report)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

# From a fast commit (~1 ms) to a stalled one.
SECONDS_BOUNDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    __slots__ = ("bounds", "counts", "total", "count")

    def __init__(self, bounds: Sequence[float] = SECONDS_BOUNDS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, as HistogramMetricFamily.add_metric takes them."""
        cumulative = 0
        pairs = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            cumulative += count
            pairs.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
        return pairs

    def to_json(self) -> dict[str, Any]:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.total, "count": self.count}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Histogram:
        histogram = cls(tuple(data.get("bounds") or SECONDS_BOUNDS))
        counts = list(data.get("counts") or [])
        if len(counts) == len(histogram.counts):
            histogram.counts = [int(count) for count in counts]
        histogram.total = float(data.get("sum") or 0.0)
        histogram.count = int(data.get("count") or 0)
        return histogram
