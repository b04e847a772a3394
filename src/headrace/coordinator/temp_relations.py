"""A session's temporary relations on the store PostgreSQL shadow headrace's relations of the same name.

`CREATE TEMP TABLE float8_tbl (...)` runs on the session's backend (coordinator/passthrough.py); PostgreSQL then
resolves an unqualified `float8_tbl` to the temporary table (pg_temp comes first in the search path), so the
session's later statements naming it (INSERT, SELECT, DROP ...) must be PostgreSQL's too, not writes to or reads of
headrace's table of that name.

The names are PostgreSQL's own answer (pg_class in the backend's temporary schema), read only for a backend that
may hold temporary relations (a statement it ran mentioned TEMP / TEMPORARY / pg_temp), and read again after any
statement that may have created or dropped one (DDL, COMMIT / ROLLBACK, DISCARD): no cost for sessions that never
create one."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlglot import exp

from headrace.errors import HeadraceError
from headrace.sql.table_statements import is_write, truncate_as_delete, write_target

_TEMPORARY_WORDS = re.compile(r"\btemp(orary)?\b|\bpg_temp", re.IGNORECASE)
_NAMES_SQL = "SELECT relname FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema()"


@dataclass(slots=True)
class TemporaryRelations:
    """What headrace knows of one backend's temporary relations."""

    possible: bool = False  # a statement of this backend mentioned temporary relations
    names: frozenset[str] | None = None  # None: to be read (again) before use

    def note(self, sql: str, changed_relations: bool) -> None:
        """After a statement ran on the backend: `changed_relations` for DDL or the end of a transaction."""
        if _TEMPORARY_WORDS.search(sql) is not None:
            self.possible = True
            self.names = None
        elif changed_relations and self.possible:
            self.names = None

    async def current(self, connection: object) -> frozenset[str]:
        if not self.possible:
            return frozenset()
        if self.names is None:
            try:
                result = await connection.execute(_NAMES_SQL)  # type: ignore[attr-defined]
            except HeadraceError:  # an aborted transaction block: nothing new can have been created in it
                return frozenset()
            self.names = frozenset(row[0].decode() for row in result.rows if row[0] is not None)
        return self.names


def shadowed_names(ast: exp.Expr, temporary: frozenset[str]) -> frozenset[str]:
    """The unqualified relation names of `ast` that resolve to one of the `temporary` relations (its CTEs left
    out); names are compared as PostgreSQL does: unquoted ones folded to lower case."""
    if not temporary:
        return frozenset()
    ctes = {cte.alias_or_name.lower() for cte in ast.find_all(exp.CTE)}
    found = set()
    for table in ast.find_all(exp.Table):
        if not table.name or table.db or table.name.lower() in ctes:
            continue
        identifier = table.this
        quoted = isinstance(identifier, exp.Identifier) and identifier.args.get("quoted")
        name = table.name if quoted else table.name.lower()
        if name in temporary:
            found.add(name)
    return frozenset(found)


__all__ = ["TemporaryRelations", "shadowed_names"]


def refuse_mixed_with_temporary(ast: exp.Expr, shadowed: frozenset[str], headrace_reads: Iterable[tuple[str | None, str]],
                                serving_on_postgres: bool, relation_named: Callable[[str, str], bool]) -> None:
    """0A000 for a statement naming the session's temporary relations (`shadowed`) that cannot run on the store
    whole: with the DuckDB serving store, one that also reads headrace's relations (not in the store); with either,
    a write to one of headrace's tables (its writes go through headrace's log) reading a temporary relation."""
    if not serving_on_postgres and any(schema is not None or name.lower() not in shadowed
                                       for schema, name in headrace_reads):
        raise HeadraceError(  # headrace's relations are not in the store: not one statement
            f'relation "{sorted(shadowed)[0]}" is a temporary relation of the store PostgreSQL and cannot be used '
            "together with headrace's sources, tables and views yet", sqlstate="0A000",
            hint="query it on its own (docs/store.md)")
    if not is_write(ast):
        return
    try:
        target = write_target(ast)
    except HeadraceError:
        return
    written = shadowed_names(truncate_as_delete(ast) if isinstance(ast, exp.TruncateTable) else ast.this,
                             shadowed)  # the target, if it is a temporary one (unqualified)
    if not written and relation_named(target.schema or "public", target.name):
        # a write to headrace's table that reads the session's temporary relation: not one statement yet
        raise HeadraceError(
            f'relation "{sorted(shadowed)[0]}" is a temporary relation of the store PostgreSQL and cannot be '
            "used together with headrace's tables in a write yet", sqlstate="0A000",
            hint="read it into the table with a separate statement, or qualify the name with its schema")
