"""Runtime with per-binding finalizers and full reduction (SchemaReducer.full), against the real serving
driver: a view binding's documents are reduced with the stored one, finalized, and deleted when finalize
returns None; a source binding rides in the same transaction with last-write-wins."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings

from headrace.materialize.protocol import Binding, MaterializationSpec
from headrace.materialize.reduce import combine_lww, reducer_for_schema
from headrace.sql.view_serving import view_binding
from tests.sql.view_model import (
    AGGREGATES_SQL,
    Event,
    SourceModel,
    assert_same,
    compile_sql,
    expected_groups,
    python_documents,
    transactions_strategy,
)

from .conftest import DriverServer

SOURCE_BINDING = Binding(resource_path=("headrace_internal", "source_f1"), key=("log_offset",),
                         values=("body",), column_types={"log_offset": "BIGINT", "body": "JSON"})


def stored_view(server: DriverServer, table: str) -> dict[Any, dict[str, Any]]:
    cursor = server.store.cursor()
    try:
        cursor.execute(f'SELECT * FROM headrace_internal."{table}"')
        names = [d[0] for d in cursor.description]
        return {row[0]: dict(zip(names, row)) for row in cursor.fetchall()}
    finally:
        cursor.close()


def public_rows(plan: Any, stored: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """Stored columns -> the view's output names (AGGREGATES_SQL outputs are plain k0 / a{j})."""
    contents = {}
    for row in stored.values():
        out = {}
        for output in plan.outputs:
            value = row[output.expression.name]
            out[output.name] = json.loads(value) if isinstance(value, str) and output.pg_type.endswith(("[]", "jsonb")) \
                else value
        contents[out.pop("customer")] = out
    return contents


class Harness:
    def __init__(self, server: DriverServer) -> None:
        self.plan = compile_sql(AGGREGATES_SQL.format(source="events"))
        self.binding = view_binding(self.plan, "f2")
        self.spec = MaterializationSpec(name="source_f1", bindings=(SOURCE_BINDING, self.binding))
        self.server = server
        self.runtime = server.runtime(self.spec, reducers=[combine_lww, reducer_for_schema(self.plan.reduce_schema)],
                                      finalizers=[None, self.plan.finalize])
        self.runtime.open()
        self.batches = 0

    def transact(self, rows: list[dict[str, Any]]) -> None:
        documents: list[tuple[int, list[Any], dict[str, Any]]] = []
        for row in rows:
            if row["hr_diff"] > 0:
                documents.append((0, [row["log_offset"]], {"log_offset": row["log_offset"], "body": row["body"]}))
            else:
                documents.append((0, [row["log_offset"]], {"log_offset": row["log_offset"], "_meta": {"op": "d"}}))
        documents += [(1, key, doc) for key, doc in python_documents(self.plan, rows)]
        self.batches += 1
        self.runtime.transact(documents, {"batch": self.batches})

    def close(self) -> None:
        self.runtime.close()


def test_groups_are_deleted_when_their_last_row_is_retracted(driver_server: DriverServer) -> None:
    harness = Harness(driver_server)
    source = SourceModel()
    harness.transact(source.changes([Event("e1", "c1", 5, True, "a"), Event("e2", "c2", 7, None, "b")]))
    assert set(stored_view(driver_server, "view_f2")) == {'["c1"]', '["c2"]'}
    # e2 moves from c2 to c1: c2 has no row left, so its group is deleted (finalize returned None)
    harness.transact(source.changes([Event("e2", "c1", 9, False, "c")]))
    assert set(stored_view(driver_server, "view_f2")) == {'["c1"]'}
    assert_same(public_rows(harness.plan, stored_view(driver_server, "view_f2")), expected_groups(source.live_rows()))
    # the source binding in the same transactions: live rows only
    cursor = driver_server.store.cursor()
    offsets = [r[0] for r in cursor.execute("SELECT log_offset FROM headrace_internal.source_f1 ORDER BY 1").fetchall()]
    cursor.close()
    assert offsets == [offset for offset, _ in source.live_rows()]
    harness.close()


def test_a_new_key_finalized_to_nothing_is_not_stored(driver_server: DriverServer) -> None:
    harness = Harness(driver_server)
    source = SourceModel()
    # within one transaction e1 arrives and is replaced into another group: c1's partial nets to rows = 0
    harness.transact(source.changes([Event("e1", "c1", 5, True, "a"), Event("e1", "c2", 6, True, "a")]))
    assert set(stored_view(driver_server, "view_f2")) == {'["c2"]'}
    harness.close()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(transactions=transactions_strategy)
def test_stored_view_equals_recomputation_after_every_transaction(driver_server: DriverServer,
                                                                  transactions: list[list[Event]]) -> None:
    harness = Harness(driver_server)
    source = SourceModel()
    for batch in transactions:
        harness.transact(source.changes(batch))
        assert_same(public_rows(harness.plan, stored_view(driver_server, "view_f2")),
                    expected_groups(source.live_rows()))
    harness.close()
    # the next example starts from empty tables
    cursor = driver_server.store.cursor()
    cursor.execute('DELETE FROM headrace_internal."view_f2"')
    cursor.execute("DELETE FROM headrace_internal.source_f1")
    cursor.close()
