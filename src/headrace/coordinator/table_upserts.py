"""INSERT ... ON CONFLICT: the upsert ORMs emit.

    INSERT INTO t ... ON CONFLICT [(pk columns) | ON CONSTRAINT t_pkey] DO NOTHING
    INSERT INTO t ... ON CONFLICT (pk columns) DO UPDATE SET col = EXCLUDED.col [, ...] [WHERE ...]

The conflict target must be the primary key (the only unique constraint a table has; 42P10 otherwise). Rows
are proposed as a plain INSERT computes them (defaults applied); a proposed row whose key exists (in the
store, the unapplied log or this transaction) is skipped (DO NOTHING) or becomes an update of the existing
row (DO UPDATE): its SET expressions and WHERE are evaluated by the serving store over the existing row, with
`EXCLUDED.col` naming the proposed row's columns. As in PostgreSQL, DO UPDATE may not touch one key twice in
a statement (21000), DO NOTHING skips a later duplicate. SET of a primary key column may keep its value (`SET (b, a)
= (SELECT b, a ...)`); changing it is refused (0A000, `check_keys_kept`).
This module plans (pure); coordinator/tables.py applies the result under the table's lock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from headrace.catalog.tables import Table, TableColumn
from headrace.errors import FeatureNotSupported, HeadraceError, SyntaxError_, UndefinedColumn
from headrace.sql import table_statements as grammar

Key = tuple[Any, ...]
Document = dict[str, Any]
EXCLUDED_PREFIX = "hr_excluded_"
ROW_INDEX = "hr_upsert_row"
WHERE_COLUMN = "hr_upsert_where"
INVALID_CONFLICT_TARGET = "42P10"
CARDINALITY_VIOLATION = "21000"


@dataclass(frozen=True)
class Upsert:
    do_update: bool
    assignments: tuple[tuple[TableColumn, exp.Expr], ...] = ()
    where: exp.Expr | None = None


def conflict_clause(ast: exp.Insert, table: Table) -> Upsert | None:
    """The statement's ON CONFLICT clause, checked against the table (None without one)."""
    clause = ast.args.get("conflict")
    if clause is None:
        return None
    if not isinstance(clause, exp.OnConflict) or clause.args.get("duplicate"):
        raise FeatureNotSupported("only ON CONFLICT ... DO NOTHING / DO UPDATE is supported")
    action = str(clause.args.get("action") or "").upper()
    do_update = "UPDATE" in action
    _check_target(clause, table, do_update)
    if not do_update:
        return Upsert(do_update=False)
    assignments = []
    seen: set[str] = set()
    for target, value in grammar.assignments(clause.expressions, "ON CONFLICT DO UPDATE SET"):
        column = table.column(target.name)
        if column is None:
            raise UndefinedColumn(f'column "{target.name}" of relation "{table.name}" does not exist')
        if column.name in seen:
            raise SyntaxError_(f'multiple assignments to same column "{column.name}"')
        seen.add(column.name)
        assignments.append((column, value))
    where = clause.args.get("where")
    return Upsert(do_update=True, assignments=tuple(assignments),
                  where=where.this if isinstance(where, exp.Where) else where)


def check_keys_kept(table: Table, pairs: list[tuple[Document, Document]]) -> None:
    """0A000 when an update of a conflict would change the row's primary key (headrace's upsert updates the row
    in place; a moved key would need the conflict checks of an insert)."""
    for old, new in pairs:
        for name in table.primary_key:
            if old.get(name) != new.get(name):
                raise FeatureNotSupported(f'ON CONFLICT DO UPDATE cannot change the primary key column "{name}"')


def _check_target(clause: exp.OnConflict, table: Table, do_update: bool) -> None:
    keys = clause.args.get("conflict_keys")
    constraint = clause.args.get("constraint")
    if keys:
        names = [(key.this if isinstance(key, exp.Ordered) else key).name for key in keys]
        if not table.primary_key or set(names) != set(table.primary_key) or len(names) != len(set(names)):
            raise HeadraceError("there is no unique or exclusion constraint matching the ON CONFLICT specification",
                                sqlstate=INVALID_CONFLICT_TARGET,
                                hint=f'the conflict target is the primary key: ({", ".join(table.primary_key)})'
                                if table.primary_key else f'table "{table.name}" has no primary key')
    elif constraint is not None:
        name = constraint.name if isinstance(constraint, exp.Expr) else str(constraint)
        if not table.primary_key or name != f"{table.name}_pkey":
            raise HeadraceError(f'constraint "{name}" for table "{table.name}" does not exist', sqlstate="42704")
    elif do_update:
        raise HeadraceError("ON CONFLICT DO UPDATE requires inference specification or constraint name",
                            sqlstate="42601", hint="for example, ON CONFLICT (column_name)")


@dataclass
class Proposals:
    """Proposed rows split by the existing rows: inserts, (existing, proposed) conflicts, in statement order."""

    inserts: list[Document]
    conflicts: list[tuple[Document, Document]]
    order: list[tuple[bool, int]]  # (is_conflict, index into inserts / conflicts)


def split_proposals(table: Table, upsert: Upsert, proposed: list[Document], keys: list[Key],
                    existing: dict[Key, Document | None]) -> Proposals:
    result = Proposals([], [], [])
    seen: set[Key] = set()
    for document, key in zip(proposed, keys):
        if key in seen:
            if upsert.do_update:
                raise HeadraceError("ON CONFLICT DO UPDATE command cannot affect row a second time",
                                    sqlstate=CARDINALITY_VIOLATION,
                                    hint="Ensure that no rows proposed for insertion within the same command have "
                                         "duplicate constrained values.")
            continue
        seen.add(key)
        current = existing.get(key) if not table.has_hidden_key else None
        if current is None:
            result.order.append((False, len(result.inserts)))
            result.inserts.append(document)
        elif upsert.do_update:
            result.order.append((True, len(result.conflicts)))
            result.conflicts.append((current, document))
    return result


def update_select(table: Table, ast: exp.Insert, upsert: Upsert,
                  typed: Any) -> exp.Select:
    """SELECT <set expressions>, <where>, row index FROM t: over a relation of the table's name holding each
    conflict's existing row, its proposed row as hr_excluded_<col>, and its index (tables.py runs it)."""
    target = ast.this.this if isinstance(ast.this, exp.Schema) else ast.this
    assert isinstance(target, exp.Table)
    reference = target.alias or target.name
    projections: list[exp.Expr] = []
    for index, (column, value) in enumerate(upsert.assignments):
        projections.append(exp.alias_(_excluded_to_columns(typed(value, column), reference),
                                      f"hr_set_{index}", quoted=True))
    if upsert.where is not None:
        projections.append(exp.alias_(_excluded_to_columns(upsert.where.copy(), reference), WHERE_COLUMN, quoted=True))
    projections.append(exp.column(ROW_INDEX, table=reference, quoted=True))
    source = exp.Table(this=exp.to_identifier(table.name, quoted=True))
    if target.alias:
        source.set("alias", exp.TableAlias(this=exp.to_identifier(target.alias)))
    return exp.Select(expressions=projections).from_(source)


def _excluded_to_columns(node: exp.Expr, reference: str) -> exp.Expr:
    """EXCLUDED.col -> <table>.hr_excluded_col (one relation holds both rows, so bare names stay unambiguous)."""
    def rename(column: exp.Expr) -> exp.Expr:
        if isinstance(column, exp.Column) and column.table.lower() == "excluded":
            return exp.column(f"{EXCLUDED_PREFIX}{column.name}", table=reference, quoted=True)
        return column

    return node.copy().transform(rename)
