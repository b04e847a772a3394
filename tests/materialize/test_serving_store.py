"""ServingStore: schemas, the checkpoints table, and idempotent table creation per binding."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import pytest

from headrace.errors import FeatureNotSupported, InternalError
from headrace.materialize.protocol import Binding
from headrace.store.serving import ServingStore

from .conftest import WEBHOOK_COLUMNS, webhook_binding


def test_a_new_database_has_schemas_and_the_checkpoints_table(tmp_path: Path) -> None:
    store = ServingStore(tmp_path / "s.duckdb")
    cursor = store.cursor()
    schemas = {r[0] for r in cursor.execute("SELECT schema_name FROM information_schema.schemata").fetchall()}
    assert {"public", "headrace_internal"} <= schemas
    cursor.execute("INSERT INTO headrace_internal.checkpoints VALUES ('m', 0, 10, 1, NULL, NULL)")
    with pytest.raises(duckdb.ConstraintException):
        cursor.execute("INSERT INTO headrace_internal.checkpoints VALUES ('m', 0, 10, 2, NULL, NULL)")
    cursor.close()
    store.close()
    reopened = ServingStore(tmp_path / "s.duckdb")  # creating again is harmless and keeps the rows
    assert reopened.cursor().execute("SELECT fence FROM headrace_internal.checkpoints").fetchall() == [(1,)]
    reopened.close()


def test_cursors_resolve_unqualified_names_in_public(serving_store: ServingStore) -> None:
    serving_store.apply(Binding(("greetings",), ("id",), ("text",), {"id": "BIGINT", "text": "VARCHAR"}))
    cursor = serving_store.cursor()
    cursor.execute("INSERT INTO public.greetings VALUES (1, 'hi')")
    assert cursor.execute("SELECT text FROM greetings").fetchall() == [("hi",)]


def test_apply_creates_a_keyed_table_once(serving_store: ServingStore) -> None:
    binding = webhook_binding()
    serving_store.apply(binding)
    serving_store.apply(binding)  # idempotent
    cursor = serving_store.cursor()
    columns = cursor.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'headrace_internal' AND table_name = 'source_u1' ORDER BY ordinal_position").fetchall()
    assert columns == [("idempotency_key", "VARCHAR"), ("body", "JSON"),
                       ("received_at", "TIMESTAMP WITH TIME ZONE")]
    cursor.execute("INSERT INTO headrace_internal.source_u1 VALUES ('a', '{}', now())")
    with pytest.raises(duckdb.ConstraintException):
        cursor.execute("INSERT INTO headrace_internal.source_u1 VALUES ('a', '[]', now())")


def test_delta_updates_tables_have_no_primary_key(serving_store: ServingStore) -> None:
    serving_store.apply(webhook_binding("deltas", delta_updates=True))
    cursor = serving_store.cursor()
    cursor.execute("INSERT INTO headrace_internal.deltas VALUES ('a', '1', now()), ('a', '2', now())")
    assert cursor.execute("SELECT count(*) FROM headrace_internal.deltas").fetchone() == (2,)


def test_apply_migrates_added_and_dropped_value_columns(serving_store: ServingStore) -> None:
    assert serving_store.apply(webhook_binding()) == ["created table \"headrace_internal\".\"source_u1\" and its changelog"]
    assert serving_store.apply(webhook_binding()) == []  # the same spec again: nothing to do
    cursor = serving_store.cursor()
    cursor.execute("INSERT INTO headrace_internal.source_u1 VALUES ('a', '{}', now())")
    wider = Binding(("headrace_internal", "source_u1"), ("idempotency_key",), ("body", "received_at", "n"),
                    {**WEBHOOK_COLUMNS, "n": "BIGINT"})
    assert serving_store.apply(wider) == [
        "added column 'n' BIGINT to \"headrace_internal\".\"source_u1\"",
        "added column 'n' to headrace_internal.\"changes_headrace_internal.source_u1\""]
    assert serving_store.apply(wider) == []
    assert cursor.execute("SELECT idempotency_key, n FROM headrace_internal.source_u1").fetchall() == [("a", None)]
    narrower = Binding(("headrace_internal", "source_u1"), ("idempotency_key",), ("body",),
                       {"idempotency_key": "VARCHAR", "body": "JSON"})
    assert serving_store.apply(narrower) == []  # value columns are nullable already: they simply stay
    columns = serving_store.columns(("headrace_internal", "source_u1"))
    assert columns is not None and list(columns) == ["idempotency_key", "body", "received_at", "n"]


def test_apply_refuses_a_changed_key_or_type(serving_store: ServingStore) -> None:
    serving_store.apply(webhook_binding())
    rekeyed = Binding(("headrace_internal", "source_u1"), ("body",), ("idempotency_key",),
                      {"idempotency_key": "VARCHAR", "body": "JSON"})
    with pytest.raises(InternalError, match=r"has primary key \['idempotency_key'\], the binding needs \['body'\]"):
        serving_store.apply(rekeyed)
    retyped = Binding(("headrace_internal", "source_u1"), ("idempotency_key",), ("body",),
                      {"idempotency_key": "VARCHAR", "body": "BIGINT"})
    with pytest.raises(InternalError, match="column 'body' of type JSON, the binding expects BIGINT"):
        serving_store.apply(retyped)
    with pytest.raises(FeatureNotSupported, match="'hr_diff' is reserved for the changelog"):
        serving_store.apply(Binding(("t",), ("k",), ("hr_diff",), {"k": "VARCHAR", "hr_diff": "BIGINT"}))


def test_apply_refuses_unknown_types_and_untyped_columns(serving_store: ServingStore) -> None:
    with pytest.raises(FeatureNotSupported, match="column type HUGEINT"):
        serving_store.apply(Binding(("t",), ("k",), (), {"k": "HUGEINT"}))
    with pytest.raises(InternalError, match="no type for columns"):
        serving_store.apply(Binding(("t",), ("k",), ("v",), {"k": "VARCHAR"}))


def test_drop_removes_the_table(serving_store: ServingStore) -> None:
    serving_store.apply(webhook_binding())
    serving_store.drop(("headrace_internal", "source_u1"))
    serving_store.drop(("headrace_internal", "source_u1"))  # absent: fine
    with pytest.raises(duckdb.CatalogException):
        serving_store.cursor().execute("SELECT * FROM headrace_internal.source_u1")


def test_cursors_work_from_many_threads(serving_store: ServingStore) -> None:
    serving_store.apply(Binding(("counts",), ("id",), (), {"id": "BIGINT"}))
    errors: list[BaseException] = []

    def insert(base: int) -> None:
        try:
            cursor = serving_store.cursor()
            for i in range(50):
                cursor.execute("INSERT INTO counts VALUES (?)", [base + i])
            cursor.close()
        except BaseException as exc:  # collected: an assertion in a thread would be lost
            errors.append(exc)

    threads = [threading.Thread(target=insert, args=(n * 1000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert serving_store.cursor().execute("SELECT count(*) FROM counts").fetchone() == (200,)
