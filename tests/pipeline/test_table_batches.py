"""A table's change records as the pipeline sees them: net documents per key (pipeline/table_batches.py)
and the change-stream contract for views (pipeline/table_views.py). No Spark session needed."""

from __future__ import annotations

from headrace.catalog.tables import HIDDEN_VERSION
from headrace.pipeline.table_batches import is_table_entry, net_documents
from headrace.pipeline.table_views import change_rows, table_relation
from headrace.sql.table_statements import table_from_create_sql
from headrace.store.table_log import RowChange

TABLE = table_from_create_sql("u7", "CREATE TABLE t (id int PRIMARY KEY, doc jsonb, at timestamptz)")


def row(id_: int, version: int, doc: object = None) -> dict[str, object]:
    return {"id": id_, "doc": doc, "at": 1_000_000, HIDDEN_VERSION: version}


def test_net_documents_keep_the_last_change_per_key() -> None:
    records = [[RowChange("i", (1,), row(1, 10), None), RowChange("i", (2,), row(2, 11), None)],
               [RowChange("u", (1,), row(1, 12, {"a": 1}), row(1, 10)), RowChange("d", (2,), None, row(2, 11))]]
    documents = {tuple(key): doc for _, key, doc in net_documents(TABLE, records)}
    assert documents == {(1,): row(1, 12, {"a": 1}), (2,): {"id": 2, "_meta": {"op": "d"}}}
    assert is_table_entry("  create table x (a int)") and not is_table_entry("CREATE SOURCE s FROM WEBHOOK")


def test_change_rows_follow_the_views_contract() -> None:
    records = [[RowChange("i", (1,), row(1, 10), None)],
               [RowChange("u", (1,), row(1, 12, {"a": [1]}), row(1, 10)), RowChange("d", (1,), None, row(1, 12))]]
    rows = change_rows(TABLE, records).to_pylist()
    assert [(r["hr_diff"], r["hr_seq"], r["hr_row"], r["hr_at"]) for r in rows] == [
        (1, 1, "[1]", 10), (-1, 2, "[1]", 10), (1, 2, "[1]", 12), (-1, 3, "[1]", 12)]
    assert rows[2]["doc"] == '{"a":[1]}' and rows[2]["at"] == 1_000_000
    relation = table_relation(TABLE)
    assert relation.key == ("id",) and relation.columns == {"id": "int4", "doc": "jsonb", "at": "timestamptz"}
    assert not relation.append_only
