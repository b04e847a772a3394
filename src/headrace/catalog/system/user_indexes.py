"""CREATE INDEX indexes in pg_class / pg_attribute / pg_index / pg_indexes, so psql's \\d lists them.

Their OIDs are in a range of their own (above every relation OID, catalog/system relation_oid), stable
across restarts since index ids are never reused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headrace.catalog.system import rows
from headrace.catalog.system.rows import TypeFacts, UserRelation

FIRST_INDEX_OID = 500_000_000


def index_oid(index_id: str) -> int:
    return FIRST_INDEX_OID + int(index_id[1:])


def index_definition(index: Any) -> str:
    return f"CREATE INDEX {index.name} ON {index.on_schema}.{index.on_name} USING btree ({', '.join(index.columns)})"


def add_index_rows(pg_rows: dict[str, list[rows.Row]], relations: Sequence[UserRelation], indexes: Sequence[Any],
                   facts: TypeFacts, definitions: list[dict[str, Any]]) -> None:
    """Add the rows of every index whose relation is among `relations` (and mark that relation indexed)."""
    by_name = {(relation.schema, relation.name): relation for relation in relations}
    indexed: set[int] = set()
    for index in indexes:
        relation = by_name.get((index.on_schema, index.on_name))
        columns = {column.name: column for column in relation.columns} if relation is not None else {}
        if relation is None or any(name not in columns for name in index.columns):
            continue
        oid = index_oid(index.id)
        indexed.add(relation.oid)
        pg_rows["pg_class"].append(rows._class_row(oid, index.name, "i", len(index.columns), am=rows.BTREE_AM_OID,
                                                   has_index=False, has_rules=False))
        pg_rows["pg_attribute"] += [rows._attribute_row(oid, number, columns[name], facts)
                                    for number, name in enumerate(index.columns, start=1)]
        numbers = [[c.name for c in relation.columns].index(name) + 1 for name in index.columns]
        pg_rows["pg_index"].append({
            "indexrelid": oid, "indrelid": relation.oid, "indnatts": len(numbers), "indnkeyatts": len(numbers),
            "indisunique": False, "indnullsnotdistinct": False, "indisprimary": False, "indisexclusion": False,
            "indimmediate": True, "indisclustered": False, "indisvalid": True, "indcheckxmin": False,
            "indisready": True, "indislive": True, "indisreplident": False, "indkey": numbers,
            "indcollation": [rows.DEFAULT_COLLATION_OID] * len(numbers),
            "indclass": [rows.TEXT_BTREE_OPCLASS_OID] * len(numbers), "indoption": [0] * len(numbers),
        })
        pg_rows["pg_indexes"].append({"schemaname": index.schema, "tablename": index.on_name,
                                      "indexname": index.name, "indexdef": index_definition(index)})
        definitions.append({"oid": oid, "definition": index_definition(index)})
    for row in pg_rows["pg_class"]:
        if row["oid"] in indexed:
            row["relhasindex"] = True
