from __future__ import annotations

from pathlib import Path

from headrace.catalog.catalog import Catalog
from headrace.sql.ddl import item_from_create_sql


def test_catalog_survives_reopen_and_never_reuses_ids(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path, item_from_create_sql)
    first = item_from_create_sql(catalog.allocate_id(), "CREATE SOURCE a FROM WEBHOOK BODY FORMAT JSON")
    second = item_from_create_sql(catalog.allocate_id(), "CREATE SOURCE b FROM WEBHOOK BODY FORMAT JSON IDEMPOTENT (body->>'id')")
    catalog.add(first)
    catalog.add(second)
    catalog.remove(first.id)

    reopened = Catalog(tmp_path, item_from_create_sql)
    assert [s.name for s in reopened.sources()] == ["b"]
    assert reopened.find("public", "b").idempotent_expr == "body->>'id'"  # kept as the user wrote it  # type: ignore[union-attr]
    assert reopened.allocate_id() == "u3"  # a dropped source's id is never handed out again
    assert not (tmp_path / "catalog.tmp").exists()
