"""A read inside a transaction block that has written to the tables it reads (the PostgreSQL serving store).

The block's writes stay in the session until COMMIT (coordinator/tables.py: they reach the store through the table's
log and the pipeline), so the store's relation of a written table lacks them. PostgreSQL shows a transaction its
own writes; so does headrace: the statement runs on the store with each reference to such a table replaced by the
table's current contents as this transaction sees them, the store's rows with the overlay laid over them (the
acknowledged writes the store has not applied yet, then the block's own changes, as a write's own reads are
computed: coordinator/table_writes_postgres.py), with the table's declared column types and names. The overlay
travels as literals (the client's parameters keep their numbers), so the statement's description is the one
PostgreSQL gave for the original text.

What still cannot see the block's writes is refused (25000) as before: a materialized view over a written table (the
pipeline computes its rows at COMMIT), a table without a primary key (its rows' keys are hidden in headrace's
storage, which the session's role does not read), and a statement that is no query (CREATE VIEW ... AS SELECT would keep the
literals in its definition; EXPLAIN, COPY)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import sqlglot
from sqlglot import exp

from headrace.catalog.tables import Table
from headrace.errors import HeadraceError
from headrace.store import table_reads_postgres as on_postgres
from headrace.store import table_relation_postgres as public_relation
from headrace.store.serving import quote_ident

Key = tuple[Any, ...]
Document = dict[str, Any]
DIALECT = "postgres"
_ARRAY_PARAMETER = re.compile(r"\$(\d+)::text\[\]")


def refusal(name: str, kind: str = "table") -> HeadraceError:
    return HeadraceError(f'cannot read {kind} "{name}" in a transaction block that has written to it',
                         sqlstate="25000", detail="writes inside BEGIN ... COMMIT reach the store at COMMIT",
                         hint="read before the first write, or COMMIT first")


def references(ast: exp.Expr, table: Table) -> list[exp.Table]:
    """The statement's references to `table` (unqualified or in its schema; an unquoted name folds to lower
    case as PostgreSQL folds it)."""
    found = []
    for node in ast.find_all(exp.Table):
        identifier = node.this
        if not isinstance(identifier, exp.Identifier):
            continue
        name = identifier.name if identifier.quoted else identifier.name.lower()
        if name == table.name and node.db.lower() in ("", table.schema):
            found.append(node)
    return found


def _text_array(values: Sequence[str | None]) -> str:
    """A text[] literal PostgreSQL reads the same whatever standard_conforming_strings says (E'' strings)."""
    if not values:
        return "'{}'::text[]"
    items = ("NULL" if value is None else "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
             for value in values)
    return f"ARRAY[{', '.join(items)}]::text[]"


def _literal(sql: str, parameters: Sequence[Sequence[str | None]]) -> str:
    return _ARRAY_PARAMETER.sub(lambda match: _text_array(parameters[int(match.group(1)) - 1]), sql)


def contents_query(table: Table, overlay: Mapping[Key, Document | None]) -> str:
    """The table's current contents under `overlay`, declared columns, as one SQL text with no parameters. Read
    from the table's public relation (the session's role may read it; the storage is headrace's), a PostgreSQL
    table with the declared columns and key (store/table_relation_postgres.py); its key is the overlay's."""
    columns = table.column_names()
    declared = ", ".join(f"s.{quote_ident(c)}" for c in columns)
    sql = f"SELECT {declared} FROM {public_relation.public_name(table)} s"
    if not overlay:
        return sql
    key_columns = list(table.store_key)
    keys_sql, parameters = on_postgres.rows_relation(table, key_columns, list(overlay), 1)
    keys = on_postgres.declared_columns(table, _literal(keys_sql, parameters), False, key_columns)
    join = " AND ".join(f"s.{quote_ident(c)} = k.{quote_ident(c)}" for c in key_columns)
    sql += f" WHERE NOT EXISTS (SELECT FROM ({keys}) AS k WHERE {join})"
    live = [row for row in overlay.values() if row is not None]
    if live:
        rows_sql, parameters = on_postgres.rows_relation(table, columns, [[row.get(c) for c in columns]
                                                                          for row in live], 1)
        sql += f" UNION ALL {on_postgres.declared_columns(table, _literal(rows_sql, parameters), False)}"
    return sql


def with_own_writes(ast: exp.Expr, overlays: Sequence[tuple[Table, Mapping[Key, Document | None]]]) -> str:
    """The statement's text with each reference to a table of `overlays` replaced by its current contents.
    Refuses (25000) what cannot be answered so (see the module docstring)."""
    if not isinstance(ast, exp.Query):
        raise refusal(overlays[0][0].name)
    shadowing = {cte.alias_or_name.lower() for cte in ast.find_all(exp.CTE)}
    rewritten = ast.copy()
    for table, overlay in overlays:
        if not public_relation.is_mirrored(table):  # its rows' keys are hidden: only the storage has them
            raise refusal(table.name)
        if table.name in shadowing:  # a CTE of the table's name: which references mean the table is the CTE's
            raise refusal(table.name)
        contents = sqlglot.parse_one(contents_query(table, overlay), dialect=DIALECT)
        for node in references(rewritten, table):
            alias = node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(table.name, quoted=True))
            node.replace(exp.Subquery(this=contents.copy(), alias=alias.copy()))
    return rewritten.sql(dialect=DIALECT)
