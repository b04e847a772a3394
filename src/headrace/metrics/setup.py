"""Wires the server's parts into the system relations, /metrics and /health/ready (called once by server.py, when
the coordinator, the sinks and the pipeline supervisor exist)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from headrace.catalog.system.objects import DEPENDENCY_COLUMNS, OBJECT_COLUMNS, CatalogObjects
from headrace.http.app import health_of, register_metrics
from headrace.metrics.materialization_status import COLUMNS as MATERIALIZATION_COLUMNS
from headrace.metrics.materialization_status import MaterializationCollector, MaterializationStatus
from headrace.metrics.sessions import SESSION_COLUMNS, SessionCollector, session_rows
from headrace.metrics.store import StoreCollector
from headrace.store.system_tables import SystemRelation


def install(http_app: web.Application, coordinator: Any, adapter: Any, supervisor: Any, store: Any,
            registry: Any) -> MaterializationStatus:
    """Blocking (makes the new relations' tables in the store PostgreSQL): run it in a worker thread."""
    catalog = coordinator.catalog
    system_tables = coordinator.system_tables
    logs = {}

    def log_end(kind: str, item_id: str) -> int | None:
        if kind == "table":
            return coordinator.tables.log_end(item_id)  # type: ignore[no-any-return]
        if not logs or item_id not in logs:
            logs.clear()
            logs.update({ingestor.source.id: ingestor for _, ingestor in registry.items()})
        ingestor = logs.get(item_id)
        return None if ingestor is None else ingestor.log_end_offset  # type: ignore[no-any-return]

    def sink_status(sink: Any) -> Any:
        runner = coordinator.sink_manager.runner(sink)
        return None if runner is None else runner.status

    status = MaterializationStatus(catalog, store, supervisor.status, log_end, sink_status)
    objects = CatalogObjects(catalog, coordinator.indexes.catalog.all)
    passthrough = coordinator.passthrough
    store_pid = passthrough.backend_pid if passthrough is not None else (lambda _connection_id: None)
    system_tables.add("objects", SystemRelation(OBJECT_COLUMNS, objects.object_rows))
    system_tables.add("object_dependencies", SystemRelation(DEPENDENCY_COLUMNS, objects.dependency_rows))
    system_tables.add("materializations", SystemRelation(MATERIALIZATION_COLUMNS, status.relation_rows))
    system_tables.add("sessions", SystemRelation(SESSION_COLUMNS, lambda: session_rows(adapter.sessions, store_pid),
                                                 restricted=("query", "usename")))
    if coordinator.system_mirror is not None:  # the PostgreSQL serving store: the relations are its tables too
        coordinator.system_mirror.create_all()
    register_metrics(http_app, MaterializationCollector(status))
    register_metrics(http_app, SessionCollector(adapter.sessions))
    register_metrics(http_app, StoreCollector(getattr(store, "pool", None),
                                              passthrough.backend_count if passthrough is not None else (lambda: 0)))
    health = health_of(http_app)
    health.pipeline = supervisor.status.pipeline
    health.store_ping = lambda: store.execute("SELECT 1")
    health.materializations = status.rows
    return status
