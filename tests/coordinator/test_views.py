"""CREATE / DROP / SHOW [CREATE] MATERIALIZED VIEW[S] through the real coordinator and serving store
(no Spark): the catalog item, the public relation over the view's table, refusals and dependencies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from headrace.catalog.catalog import Catalog
from headrace.coordinator.client import AdapterClient, SessionClient
from headrace.coordinator.coordinator import Coordinator
from headrace.coordinator.responses import CommandComplete, SendingRows
from headrace.coordinator.sources import DataLayout, SourceResources
from headrace.errors import HeadraceError
from headrace.sql.ddl import item_from_create_sql
from headrace.sql.view_serving import view_binding
from headrace.store.serving import ServingStore
from headrace.store.view_errors import relation_rows
from headrace.webhook.ingest import IngestRegistry
from tests.sql.view_model import AGGREGATES_SQL, Event, RuntimeModel, SourceModel, python_documents


class Harness:
    def __init__(self, root: Path) -> None:
        self.layout = DataLayout(root)
        self.executor = ThreadPoolExecutor(max_workers=2)
        self.store = ServingStore(self.layout.store_file)
        self.registry = IngestRegistry()
        self.catalog = Catalog(root, item_from_create_sql)
        self.coordinator = Coordinator(self.catalog, SourceResources(self.layout, self.store, self.registry, self.executor),
                                       self.executor, lambda sources: None)
        self.client: SessionClient | None = None
        self.loop = asyncio.new_event_loop()

    def run(self, sql: str) -> Any:
        return self.loop.run_until_complete(self._run(sql))

    async def _run(self, sql: str) -> Any:
        if self.client is None:
            self.client = await AdapterClient(self.coordinator).new_session("headrace", "headrace", {})
        await self.client.prepare("", sql, [])
        self.client.bind("", "", [])
        return await self.client.execute("", 0, asyncio.Event())

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        response = self.run(sql)
        assert isinstance(response, SendingRows)
        return list(response.rows)

    def close(self) -> None:
        for ingestor_key in list(self.registry._ingestors):  # noqa: SLF001 - test teardown
            self.loop.run_until_complete(self.registry.remove(*ingestor_key))
        self.loop.close()
        self.store.close()
        self.executor.shutdown()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    created = Harness(tmp_path)
    created.run("CREATE SOURCE events FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
    yield created
    created.close()


def store_documents(harness: Harness, view_name: str, documents: dict[str, dict[str, Any]]) -> None:
    """Write finalized documents into the view's table as the serving driver does (JSON as text)."""
    view = harness.catalog.find_view("public", view_name)
    assert view is not None
    binding = view_binding(harness.coordinator.views.plan(view), view.id)
    columns = binding.columns
    table = f'{binding.resource_path[0]}."{binding.resource_path[1]}"'
    with harness.store.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table}")
        for doc in documents.values():
            values = []
            for column in columns:
                value = doc.get(column)
                kind = binding.column_types[column]
                values.append(json.dumps(value) if kind == "JSON" and value is not None else value)
            placeholders = ", ".join("make_timestamptz(?::BIGINT)" if binding.column_types[c] == "TIMESTAMPTZ" else "?"
                                     for c in columns)
            cursor.execute(f"INSERT INTO {table} VALUES ({placeholders})", values)


def test_create_show_select_drop(harness: Harness) -> None:
    sql = ("CREATE MATERIALIZED VIEW totals AS SELECT body->>'customer' AS customer, count(*) AS n, "
           "sum((body->>'amount')::int) AS total, sum((body->>'amount')::int) / count(*) AS per, "
           "array_agg(body->>'tag') AS tags FROM events GROUP BY 1 HAVING count(*) > 1")
    assert isinstance(harness.run(sql), CommandComplete)
    assert harness.rows("SHOW MATERIALIZED VIEWS") == [("totals", "materialized view")]
    ((name, create_sql, schema_text),) = harness.rows("SHOW CREATE MATERIALIZED VIEW totals")
    assert (name, create_sql) == ("totals", sql)
    schema = json.loads(schema_text)
    assert schema["reduce"] == {"strategy": "merge"}
    assert schema["properties"]["hr_state"]["properties"]["rows"]["reduce"] == {"strategy": "sum"}
    ((view_id, _, view_name, relation, aggregating, append_only, fields, reduce_schema),) = harness.rows(
        "SELECT * FROM headrace_internal.view_schemas")
    assert (view_name, relation, aggregating, append_only) == ("totals", "source events", True, False)
    assert json.loads(reduce_schema) == schema

    plan = harness.coordinator.views.plan(harness.catalog.find_view("public", "totals"))  # type: ignore[arg-type]
    runtime, source = RuntimeModel(plan), SourceModel()
    batch = [Event("e1", "c1", 7, None, "a"), Event("e2", "c1", 2, None, None), Event("e3", "c2", 5, None, "b")]
    runtime.transact(python_documents_for(plan, source.changes(batch)))
    store_documents(harness, "totals", runtime.store)
    rows = harness.rows("SELECT * FROM totals ORDER BY customer")
    assert rows == [("c1", 2, 9, 4, ["a", None])]  # c2 has one row: HAVING hides it; 9 / 2 = 4 as in PostgreSQL

    assert isinstance(harness.run("DROP MATERIALIZED VIEW totals"), CommandComplete)
    assert harness.rows("SHOW MATERIALIZED VIEWS") == []
    with pytest.raises(HeadraceError) as raised:
        harness.run("SELECT * FROM totals")
    assert raised.value.sqlstate == "42P01"
    assert harness.rows("SELECT count(*) FROM headrace_internal.view_schemas") == [(0,)]


def python_documents_for(plan: Any, rows: list[dict[str, Any]]) -> list[tuple[list[Any], dict[str, Any]]]:
    """Partial documents for the test's view (count, sum, array_agg by customer) in plain Python."""
    from headrace.sql.view_aggregates import Change, fold

    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(json.loads(row["body"])["customer"], []).append(row)
    documents = []
    for customer, members in groups.items():
        key = json.dumps([customer], separators=(",", ":"))
        state: dict[str, Any] = {"rows": sum(r["hr_diff"] for r in members)}
        for aggregate in plan.aggregates:
            extract = {"count_star": lambda b: (), "sum": lambda b: (b["amount"],), "array_agg": lambda b: (b["tag"],)}
            changes = [Change(r["hr_seq"], r["hr_diff"], r["hr_row"], r["hr_at"],
                              extract[aggregate.function](json.loads(r["body"]))) for r in members]
            partial = fold(aggregate, changes)
            if partial is not None:
                state[aggregate.field] = partial
        documents.append(([key], {"hr_key": key, "k0": customer, "hr_state": state}))
    return documents


def test_global_aggregate_shows_its_empty_row(harness: Harness) -> None:
    harness.run("CREATE MATERIALIZED VIEW everything AS SELECT count(*) AS n, max(received_at) AS latest FROM events")
    assert harness.rows("SELECT * FROM everything") == [(0, None)]


def test_projection_view_relation(harness: Harness) -> None:
    harness.run("CREATE MATERIALIZED VIEW big AS SELECT body->>'customer' AS customer, received_at "
                      "FROM events WHERE (body->>'amount')::int > 10")
    store_documents(harness, "big", {"[1]": {"hr_key": "[1]", "o0": "c1", "o1": 1_700_000_000_000_000}})
    ((customer, received_at),) = harness.rows("SELECT customer, received_at FROM big")
    assert customer == "c1" and received_at.timestamp() == 1_700_000_000


def test_refusal_records_nothing(harness: Harness) -> None:
    with pytest.raises(HeadraceError) as raised:
        harness.run("CREATE MATERIALIZED VIEW v AS SELECT body FROM events ORDER BY received_at LIMIT 5")
    assert raised.value.sqlstate == "0A000" and raised.value.hint
    assert harness.catalog.views() == []
    with pytest.raises(HeadraceError) as missing:
        harness.run("CREATE MATERIALIZED VIEW v AS SELECT body FROM nowhere")
    assert missing.value.sqlstate == "42P01"


def test_names_dependencies_and_restart(harness: Harness, tmp_path: Path) -> None:
    harness.run("CREATE MATERIALIZED VIEW paid AS SELECT body->>'customer' AS customer, (body->>'amount')::int AS amount "
                      "FROM events WHERE body->>'status' = 'paid'")
    # a view over a view: one more binding of the root source's transaction (pipeline/view_chain)
    harness.run("CREATE MATERIALIZED VIEW over_paid AS SELECT customer, sum(amount) AS total FROM paid GROUP BY 1")
    with pytest.raises(HeadraceError) as refused_input:
        harness.coordinator.views.refuse_drop_of_input("public", "paid")
    assert refused_input.value.sqlstate == "2BP01" and "over_paid" in (refused_input.value.detail or "")
    harness.run("DROP MATERIALIZED VIEW over_paid")
    harness.run("CREATE MATERIALIZED VIEW per_customer AS SELECT body->>'customer' AS customer, "
                "sum((body->>'amount')::int) AS total FROM events GROUP BY 1")
    for duplicate in ("CREATE MATERIALIZED VIEW paid AS SELECT body FROM events",
                      "CREATE MATERIALIZED VIEW events AS SELECT body FROM events"):
        with pytest.raises(HeadraceError) as raised:
            harness.run(duplicate)
        assert raised.value.sqlstate == "42P07"
    response = harness.run("CREATE MATERIALIZED VIEW IF NOT EXISTS paid AS SELECT body FROM events")
    assert isinstance(response, CommandComplete) and response.notices

    assert [v.name for v in harness.coordinator.views.in_dependency_order()] == ["paid", "per_customer"]
    with pytest.raises(HeadraceError) as refused:
        harness.coordinator.views.refuse_drop_of_input("public", "events")
    assert refused.value.sqlstate == "2BP01" and "per_customer" in (refused.value.detail or "")

    reopened = Catalog(tmp_path, item_from_create_sql)
    assert [v.name for v in reopened.views()] == ["paid", "per_customer"]
    assert [s.name for s in reopened.sources()] == ["events"]

    harness.run("DROP MATERIALIZED VIEW paid, per_customer CASCADE")
    assert harness.catalog.views() == []
    response = harness.run("DROP MATERIALIZED VIEW IF EXISTS paid")
    assert isinstance(response, CommandComplete) and response.notices


def commit_view_errors(harness: Harness, entries: list[list[Any]]) -> None:
    """Apply a checkpoint's error states as the serving driver's commit does (store/view_errors.py)."""
    from headrace.store.view_errors import ERRORS_FIELD, commit_ended, commit_starting, record_view_errors

    with harness.store.cursor() as cursor:
        cursor.begin()
        assert record_view_errors(cursor, {ERRORS_FIELD: entries})
        commit_starting(harness)
        cursor.commit()
        commit_ended(harness)


def test_a_view_holding_an_error_fails_its_reads_and_its_readers_until_cleared(harness: Harness) -> None:
    harness.run("CREATE MATERIALIZED VIEW amounts AS SELECT body->>'id' AS id, (body->>'n')::int AS n FROM events")
    harness.run("CREATE MATERIALIZED VIEW per_id AS SELECT id, count(*) AS c FROM amounts GROUP BY id")
    view = harness.catalog.find_view("public", "amounts")
    assert view is not None
    assert harness.rows("SELECT * FROM amounts") == []  # nothing cached stale from before: no error yet
    commit_view_errors(harness, [[view.id, "[7]", "22P02", 'invalid input syntax for type integer: "x"']])
    for sql in ("SELECT * FROM amounts", "SELECT count(*) FROM per_id"):  # the view and a view reading it
        with pytest.raises(HeadraceError) as caught:
            harness.rows(sql)
        assert (caught.value.sqlstate, caught.value.message) == ("22P02", 'invalid input syntax for type integer: "x"')
        assert caught.value.detail == 'materialized view "amounts" cannot compute input row [7]'
    # a name inside a string literal reads nothing
    assert harness.rows("SELECT count(*) FROM events WHERE body->>'view' = 'amounts'") == [(0,)]
    # headrace_internal.view_errors (store/system_tables.py) reads these rows
    (listed,) = relation_rows()
    assert listed[:5] == ("public", "amounts", "[7]", "22P02", 'invalid input syntax for type integer: "x"')
    commit_view_errors(harness, [[view.id, "[7]", None, None]])  # the row deleted or fixed
    assert harness.rows("SELECT * FROM amounts") == []
    assert relation_rows() == []
    commit_view_errors(harness, [[view.id, "[8]", "22012", "division by zero"]])
    harness.run("DROP MATERIALIZED VIEW amounts CASCADE")  # its errors go with it
    assert harness.store.execute("SELECT count(*) FROM headrace_internal.view_error_rows") == [(0,)]
