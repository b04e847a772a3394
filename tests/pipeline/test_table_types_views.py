"""Tables' exact types (numeric, date, timestamp, uuid, interval) on the way to views and back from the serving
store: the change-stream contract (pipeline/table_views.py) and the store's reads for writes
(store/table_reads.py) against a real DuckDB file. No Spark session needed."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal
from pathlib import Path

import pyarrow as pa

from headrace.catalog.tables import HIDDEN_VERSION
from headrace.pipeline.table_views import change_rows, table_relation
from headrace.sql.table_statements import table_from_create_sql
from headrace.store.serving import ServingStore, qualified_name
from headrace.store.table_log import RowChange, to_document
from headrace.store.table_reads import public_relation_sql, rows_for_keys, select_current, table_binding

TABLE = table_from_create_sql("u9", "CREATE TABLE t (id uuid PRIMARY KEY, amount numeric(12,2), day date, "
                                    "at timestamp, span interval)")
ID = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"


def document(amount: str = "1.50", version: int = 1) -> dict[str, object]:
    return {"id": ID, "amount": to_document("numeric", amount, None, 12, 2),
            "day": to_document("date", "2024-02-29"), "at": to_document("timestamp", "2024-02-29 10:00:00.25"),
            "span": to_document("interval", "1 day 01:00"), HIDDEN_VERSION: version}


def test_view_contract_carries_exact_types_in_document_form() -> None:
    rows = change_rows(TABLE, [[RowChange("i", (ID,), document(), None)]])
    assert rows.schema.field("day").type == pa.int64() and rows.schema.field("id").type == pa.string()
    row = rows.to_pylist()[0]
    assert row["day"] == (datetime.date(2024, 2, 29) - datetime.date(1970, 1, 1)).days
    assert row["amount"] == 1.5  # views carry numeric as double (docs/tables.md)
    assert table_relation(TABLE).columns == {"id": "uuid", "amount": "numeric", "day": "date", "at": "timestamp",
                                             "span": "interval"}


def test_store_holds_exact_types_natively_and_reads_them_back(tmp_path: Path) -> None:
    store = ServingStore(tmp_path / "store.duckdb")
    try:
        store.apply(table_binding(TABLE))
        with store.cursor() as cursor:
            cursor.execute(public_relation_sql(TABLE))
            stored = qualified_name(table_binding(TABLE).resource_path)
            cursor.execute(f"INSERT INTO {stored} VALUES (?, ?, ?, ?, ?, ?)",
                           [ID, Decimal("1.50"), datetime.date(2024, 2, 29),
                            datetime.datetime(2024, 2, 29, 10, 0, 0, 250000), datetime.timedelta(days=1, hours=1), 1])
            types = [str(t) for t in cursor.sql("SELECT * FROM t").types]
        assert types == ["UUID", "DECIMAL(12,2)", "DATE", "TIMESTAMP", "INTERVAL"]
        assert rows_for_keys(store, TABLE, [(ID,)]) == {(ID,): document()}
        other = str(uuid.uuid4())
        assert set(rows_for_keys(store, TABLE, [(ID,), (other,)])) == {(ID,)}
        # the overlay (unapplied writes) laid over the stored rows, typed as the store's columns
        overlay = {(other,): {**document("2.25", 2), "id": other}}
        found = select_current(store, TABLE, overlay, "SELECT t.*, amount * 2 FROM t ORDER BY amount", [], 1)
        assert [(doc["id"], doc["amount"], extra) for doc, extra in found] == [
            (ID, "1.50", (Decimal("3.00"),)), (other, "2.25", (Decimal("4.50"),))]
    finally:
        store.close()
