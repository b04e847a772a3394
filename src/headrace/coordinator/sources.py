"""The resources behind each source: its log directory and ingest endpoint, its serving-store table
and view, and its pipeline checkpoint. `ensure` is idempotent so start-up can repair anything a
crash left half-made; `remove` undoes it all."""

from __future__ import annotations

import asyncio
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from headrace.catalog.items import WebhookSource
from headrace.materialize.sources import source_binding
from headrace.store import source_relation_postgres
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ServingStore
from headrace.webhook.ingest import IngestRegistry


class DataLayout:
    """Where each piece of durable state lives under the data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir

    @property
    def store_file(self) -> Path:
        return self.root / "store.duckdb"

    def source_log(self, source: WebhookSource) -> Path:
        return self.root / "logs" / source.id

    def pipeline_checkpoint(self, materialization: str) -> Path:
        return self.root / "pipeline" / "checkpoints" / materialization


class SourceResources:
    def __init__(self, layout: DataLayout, store: ServingStore | PostgresServingStore, registry: IngestRegistry,
                 executor: ThreadPoolExecutor) -> None:
        self.layout = layout
        self.store = store
        # Where headrace answers the queries it keeps (its catalog emulation, system relations, session functions):
        # the serving store itself when it is DuckDB; with the PostgreSQL one, a DuckDB in memory holding no rows.
        self.query_store = store if isinstance(store, ServingStore) else ServingStore(Path(":memory:"), threads=1)
        self.registry = registry
        self.executor = executor

    async def ensure(self, source: WebhookSource) -> None:
        await asyncio.get_running_loop().run_in_executor(self.executor, self._ensure_table, source)
        if self.registry.lookup(source.database, source.schema, source.name) is None:
            self.registry.add(source, self.layout.source_log(source))

    def update(self, source: WebhookSource) -> None:
        """ALTER SOURCE changed the item in place (its WINDOW): the endpoint takes it at once."""
        self.registry.update(source)

    def _ensure_table(self, source: WebhookSource) -> None:
        """The table's columns come from webhook/rows.py:source_columns (through the binding)."""
        binding = source_binding(source)
        self.store.apply(binding)
        schema, table = binding.resource_path
        if isinstance(self.store, PostgresServingStore):  # a real table its storage inherits
            source_relation_postgres.ensure(self.store, source, (schema, table))
            return
        columns = ", ".join(f'"{column}"' for column in source.column_names())
        self.store.execute(f'CREATE OR REPLACE VIEW public."{source.name}" AS SELECT {columns} FROM "{schema}"."{table}"')

    async def remove(self, source: WebhookSource) -> None:
        await self.registry.remove(source.database, source.schema, source.name)
        await asyncio.get_running_loop().run_in_executor(self.executor, self._remove_files, source)

    def _remove_files(self, source: WebhookSource) -> None:
        binding = source_binding(source)
        if isinstance(self.store, PostgresServingStore):
            source_relation_postgres.remove(self.store, source, binding.resource_path)  # type: ignore[arg-type]
        else:
            self.store.execute(f'DROP VIEW IF EXISTS public."{source.name}"')
        self.store.drop(binding.resource_path)
        shutil.rmtree(self.layout.source_log(source), ignore_errors=True)
        shutil.rmtree(self.layout.pipeline_checkpoint(source.materialization), ignore_errors=True)
