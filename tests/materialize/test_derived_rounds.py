"""A derived binding (a view over a view) whose derivation yields nothing for a transaction: the runtime sends no
further round (a Flush right after the last Flush is out of order: lifecycle.py), and the chain keeps committing.

Against the real serving driver: upstream binding 1 keeps the last value per group; binding 2 derives from it and
keeps only even values, so a transaction whose upstream changes are all odd derives no document at all (the issue 20
stall: "Flush must follow Acknowledge or Load or LoadColumns, but follows Flush")."""

from __future__ import annotations

from typing import Any

from headrace.materialize.protocol import Binding, MaterializationSpec
from headrace.materialize.reduce import combine_lww
from headrace.materialize.runtime import DerivedBinding

from .conftest import DriverServer

UPSTREAM = Binding(resource_path=("headrace_internal", "view_d1"), key=("g",), values=("v",),
                   column_types={"g": "VARCHAR", "v": "BIGINT"})
DOWNSTREAM = Binding(resource_path=("headrace_internal", "view_d2"), key=("g",), values=("v",),
                     column_types={"g": "VARCHAR", "v": "BIGINT"})
SOURCE = Binding(resource_path=("headrace_internal", "source_d0"), key=("log_offset",), values=("v",),
                 column_types={"log_offset": "BIGINT", "v": "BIGINT"})


def even_values(changes: list[tuple[dict[str, Any] | None, dict[str, Any] | None]],
                _checkpoint: dict[str, Any]) -> list[tuple[list[Any], dict[str, Any]]]:
    """The downstream view's WHERE v % 2 = 0: a group whose new value is odd is deleted (if it was stored)."""
    documents = []
    for old, new in changes:
        if new is not None and new["v"] % 2 == 0:
            documents.append(([new["g"]], {"g": new["g"], "v": new["v"]}))
        elif old is not None and old["v"] % 2 == 0:
            documents.append(([old["g"]], {"g": old["g"], "_meta": {"op": "d"}}))
    return documents


def rows(server: DriverServer, table: str) -> dict[str, int]:
    cursor = server.store.cursor()
    try:
        return dict(cursor.execute(f'SELECT g, v FROM headrace_internal."{table}"').fetchall())
    finally:
        cursor.close()


def test_a_transaction_whose_derived_changes_are_all_filtered_out_commits(driver_server: DriverServer) -> None:
    spec = MaterializationSpec(name="source_d0", bindings=(SOURCE, UPSTREAM, DOWNSTREAM))
    runtime = driver_server.runtime(spec, reducers=[combine_lww] * 3,
                                    derived=[DerivedBinding(upstream=1, binding=2, derive=even_values)])
    runtime.open()
    expected_upstream: dict[str, int] = {}
    offset = 0
    for batch in range(40):
        # Every third transaction changes only odd values: the downstream derivation is empty for it.
        values = [batch * 2 + 1] * 3 if batch % 3 == 0 else [batch * 2, batch * 2 + 1, batch * 2 + 2]
        documents: list[tuple[int, list[Any], dict[str, Any]]] = []
        for index, value in enumerate(values):
            offset += 1
            group = f"g{(batch + index) % 4}"
            documents.append((0, [offset], {"log_offset": offset, "v": value}))
            documents.append((1, [group], {"g": group, "v": value}))
            expected_upstream[group] = value
        runtime.transact(documents, {"batch": batch}, wait_for_commit=batch % 2 == 0)
    runtime.finish_commit()
    assert runtime.committed_transactions == 40
    assert rows(driver_server, "view_d1") == expected_upstream
    assert rows(driver_server, "view_d2") == {g: v for g, v in expected_upstream.items() if v % 2 == 0}
    runtime.close()
