"""The store PostgreSQL as headrace uses it: sessions' statements run there (store/backend.py), their errors, and
the serving store's connection pool (store/postgres_serving.py ConnectionPool): headrace_store_* on /metrics."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class StoreStats:
    """Counters bumped by store/backend.py (process-wide)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.statements = 0
        self.errors: dict[str, int] = {}  # by SQLSTATE class (its first two characters: at most ~40 values)

    def statement(self) -> None:
        with self._lock:
            self.statements += 1

    def error(self, sqlstate: str | None) -> None:
        sqlstate_class = (sqlstate or "XX")[:2]
        with self._lock:
            self.errors[sqlstate_class] = self.errors.get(sqlstate_class, 0) + 1


STORE = StoreStats()


class StoreCollector(Collector):
    """`pool`: the serving store's ConnectionPool (None on DuckDB); `backends()`: sessions' backend connections."""

    def __init__(self, pool: Any, backends: Callable[[], int], stats: StoreStats = STORE) -> None:
        self._pool = pool
        self._backends = backends
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        yield CounterMetricFamily("headrace_store_statements", "Statements sessions ran on the store PostgreSQL.",
                                  value=self._stats.statements)
        errors = CounterMetricFamily("headrace_store_errors", "Those that failed, by SQLSTATE class (08: the "
                                     "connection; 57: cancelled or shut down; 42: the statement).",
                                     labels=["sqlstate_class"])
        for sqlstate_class, count in sorted(self._stats.errors.items()):
            errors.add_metric([sqlstate_class], count)
        yield errors
        yield GaugeMetricFamily("headrace_store_session_backends", "Sessions' connections to the store PostgreSQL.",
                                value=self._backends())
        if self._pool is not None:
            pool = GaugeMetricFamily("headrace_store_pool_connections", "The serving store's own connections "
                                     "(commits of SUBSCRIBE reads, system relations, bookkeeping), by state.",
                                     labels=["state"])
            pool.add_metric(["idle"], self._pool.idle_count)
            pool.add_metric(["in_use"], self._pool.in_use)
            yield pool
            yield CounterMetricFamily("headrace_store_pool_opened", "Connections the serving store's pool opened.",
                                      value=self._pool.opened)
