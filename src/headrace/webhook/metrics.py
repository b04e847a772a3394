"""Per-source webhook counters: cheap to bump on the request path, read as SQL rows and as
Prometheus text (a custom collector builds the families at scrape time, so the hot path only adds
to plain integers)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

# Ack latency bucket bounds in seconds: from one fsync (~0.1 ms) to a stalled disk.
ACK_LATENCY_BOUNDS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# Why a request was refused, as counted; the HTTP status each reason is answered with.
REJECTION_STATUS = {
    "invalid_body": 400,
    "method_not_allowed": 405,
    "too_large": 413,
    "overloaded": 429,
    "unavailable": 503,
}


class SourceMetrics:
    """Counters of one webhook source. Requests are counted once each; rows (a JSON ARRAY or NDJSON
    request holds several) by what the idempotency index made of them."""

    __slots__ = ("received", "accepted", "rows_new", "rows_duplicate", "rows_replaced", "bytes_received",
                 "rejected", "latency_buckets", "latency_sum_s", "latency_count")

    def __init__(self) -> None:
        self.received = 0
        self.accepted = 0
        self.rows_new = 0
        self.rows_duplicate = 0  # key seen within the window, same body: only received_at moves
        self.rows_replaced = 0  # key seen within the window, another body: the row is replaced
        self.bytes_received = 0
        self.rejected: dict[str, int] = dict.fromkeys(REJECTION_STATUS, 0)
        self.latency_buckets = [0] * (len(ACK_LATENCY_BOUNDS_S) + 1)  # the last one is +Inf
        self.latency_sum_s = 0.0
        self.latency_count = 0

    def observe_ack(self, seconds: float) -> None:
        self.latency_buckets[bisect.bisect_left(ACK_LATENCY_BOUNDS_S, seconds)] += 1
        self.latency_sum_s += seconds
        self.latency_count += 1

    def latency_quantile_s(self, quantile: float) -> float | None:
        """An upper bound from the histogram (the bucket's bound that holds the quantile)."""
        if self.latency_count == 0:
            return None
        rank = quantile * self.latency_count
        seen = 0
        for bound, count in zip((*ACK_LATENCY_BOUNDS_S, float("inf")), self.latency_buckets):
            seen += count
            if seen >= rank:
                return bound
        return float("inf")


SourceName = tuple[str, str, str]  # (database, schema, name)

COUNTER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("database", "VARCHAR"), ("schema", "VARCHAR"), ("source", "VARCHAR"),
    ("received", "BIGINT"), ("accepted", "BIGINT"), ("rejected", "BIGINT"),
    *((f"rejected_{reason}", "BIGINT") for reason in REJECTION_STATUS),
    ("rows_new", "BIGINT"), ("rows_duplicate", "BIGINT"), ("rows_replaced", "BIGINT"),
    ("bytes_received", "BIGINT"), ("ack_count", "BIGINT"), ("ack_latency_sum_ms", "DOUBLE"),
    ("ack_latency_p50_ms", "DOUBLE"), ("ack_latency_p99_ms", "DOUBLE"),
)


def counter_rows(sources: Iterable[tuple[SourceName, SourceMetrics]]) -> Iterator[tuple[Any, ...]]:
    """One row per source, in COUNTER_COLUMNS order."""
    for (database, schema, name), metrics in sources:
        p50, p99 = metrics.latency_quantile_s(0.5), metrics.latency_quantile_s(0.99)
        yield (database, schema, name, metrics.received, metrics.accepted, sum(metrics.rejected.values()),
               *(metrics.rejected[reason] for reason in REJECTION_STATUS),
               metrics.rows_new, metrics.rows_duplicate, metrics.rows_replaced, metrics.bytes_received,
               metrics.latency_count, metrics.latency_sum_s * 1000,
               None if p50 is None else p50 * 1000, None if p99 is None else p99 * 1000)


class WebhookCollector(Collector):
    """Prometheus families built at scrape time from the live sources' counters."""

    def __init__(self, sources: Any) -> None:
        self._sources = sources  # a callable returning [(SourceName, SourceMetrics)]

    def collect(self) -> Iterator[Any]:
        labels = ["database", "schema", "source"]
        families = {
            name: CounterMetricFamily(f"headrace_webhook_{name}", help_text, labels=labels)
            for name, help_text in (
                ("requests_received", "Webhook requests received."),
                ("requests_accepted", "Webhook requests answered 200 (durable)."),
                ("rows_new", "Rows appended under a key not seen within the window (or without a key)."),
                ("rows_duplicate", "Rows whose key was seen within the window with the same body."),
                ("rows_replaced", "Rows whose key was seen within the window with another body."),
                ("received_bytes", "Request body bytes received."),
            )
        }
        rejected = CounterMetricFamily("headrace_webhook_requests_rejected", "Webhook requests refused, by reason.",
                                       labels=[*labels, "reason"])
        latency = HistogramMetricFamily("headrace_webhook_ack_latency_seconds",
                                        "From arrival to the 200, for accepted requests.", labels=labels)
        for key, metrics in self._sources():
            values = list(key)
            families["requests_received"].add_metric(values, metrics.received)
            families["requests_accepted"].add_metric(values, metrics.accepted)
            families["rows_new"].add_metric(values, metrics.rows_new)
            families["rows_duplicate"].add_metric(values, metrics.rows_duplicate)
            families["rows_replaced"].add_metric(values, metrics.rows_replaced)
            families["received_bytes"].add_metric(values, metrics.bytes_received)
            for reason, count in metrics.rejected.items():
                rejected.add_metric([*values, reason], count)
            cumulative = 0
            buckets = []
            for bound, count in zip((*ACK_LATENCY_BOUNDS_S, float("inf")), metrics.latency_buckets):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            latency.add_metric(values, buckets, metrics.latency_sum_s)
        yield from families.values()
        yield rejected
        yield latency
