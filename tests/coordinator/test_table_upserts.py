"""INSERT ... ON CONFLICT planning (coordinator/table_upserts.py): the conflict target, the SET list, and how
proposed rows split into inserts and conflicts. Pure; the e2e tests run upserts against a server."""

from __future__ import annotations

import pytest
from sqlglot import exp

from headrace.coordinator.table_upserts import check_keys_kept, conflict_clause, split_proposals, update_select
from headrace.errors import HeadraceError
from headrace.sql.parser import parse_statement
from headrace.sql.table_statements import table_from_create_sql

TABLE = table_from_create_sql("u1", "CREATE TABLE t (id int PRIMARY KEY, n int, name text)")
NO_KEY = table_from_create_sql("u2", "CREATE TABLE h (x int)")


def insert(sql: str) -> exp.Insert:
    ast = parse_statement(sql)
    assert isinstance(ast, exp.Insert)
    return ast


@pytest.mark.parametrize("sql, sqlstate", [
    ("INSERT INTO t VALUES (1) ON CONFLICT (name) DO NOTHING", "42P10"),
    ("INSERT INTO t VALUES (1) ON CONFLICT (id, name) DO NOTHING", "42P10"),
    ("INSERT INTO t VALUES (1) ON CONFLICT DO UPDATE SET n = 1", "42601"),
    ("INSERT INTO t VALUES (1) ON CONFLICT ON CONSTRAINT other DO NOTHING", "42704"),
    ("INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET nope = 2", "42703"),
    ("INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET n = 1, n = 2", "42601"),
])
def test_refused_conflict_clauses(sql: str, sqlstate: str) -> None:
    with pytest.raises(HeadraceError) as error:
        conflict_clause(insert(sql), TABLE)
    assert error.value.sqlstate == sqlstate


def test_a_table_without_a_primary_key_has_no_conflict_target() -> None:
    with pytest.raises(HeadraceError) as error:
        conflict_clause(insert("INSERT INTO h VALUES (1) ON CONFLICT (x) DO NOTHING"), NO_KEY)
    assert error.value.sqlstate == "42P10"
    upsert = conflict_clause(insert("INSERT INTO h VALUES (1) ON CONFLICT DO NOTHING"), NO_KEY)
    assert upsert is not None and not upsert.do_update


def test_do_update_reads_set_list_and_where() -> None:
    upsert = conflict_clause(insert("INSERT INTO t AS u VALUES (1, 2) ON CONFLICT ON CONSTRAINT t_pkey DO UPDATE "
                                    "SET n = u.n + EXCLUDED.n WHERE u.n < 10"), TABLE)
    assert upsert is not None and upsert.do_update and upsert.where is not None
    assert [column.name for column, _ in upsert.assignments] == ["n"]
    select = update_select(TABLE, insert("INSERT INTO t AS u VALUES (1, 2) ON CONFLICT (id) DO UPDATE "
                                         "SET n = u.n + EXCLUDED.n WHERE u.n < 10"), upsert, lambda node, _: node)
    sql = select.sql(dialect="postgres")
    assert '"u"."hr_excluded_n"' in sql and "EXCLUDED" not in sql.upper().replace("HR_EXCLUDED", "")


def test_proposals_split_into_inserts_and_conflicts_in_statement_order() -> None:
    upsert = conflict_clause(insert("INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET n = 1"), TABLE)
    assert upsert is not None
    rows = [{"id": 1, "n": 5}, {"id": 2, "n": 6}]
    existing = {(1,): {"id": 1, "n": 0}, (2,): None}
    split = split_proposals(TABLE, upsert, rows, [(1,), (2,)], existing)
    assert split.conflicts == [({"id": 1, "n": 0}, {"id": 1, "n": 5})]
    assert split.inserts == [{"id": 2, "n": 6}]
    assert split.order == [(True, 0), (False, 0)]


def test_one_key_twice_do_update_refused_do_nothing_skips() -> None:
    rows = [{"id": 1}, {"id": 1}]
    update = conflict_clause(insert("INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET n = 1"), TABLE)
    assert update is not None
    with pytest.raises(HeadraceError) as error:
        split_proposals(TABLE, update, rows, [(1,), (1,)], {})
    assert error.value.sqlstate == "21000"
    nothing = conflict_clause(insert("INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING"), TABLE)
    assert nothing is not None
    split = split_proposals(TABLE, nothing, rows, [(1,), (1,)], {})
    assert split.inserts == [{"id": 1}] and not split.conflicts


def test_a_key_may_be_set_to_its_own_value_only() -> None:
    upsert = conflict_clause(insert("INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET (n, id) = (2, 1)"), TABLE)
    assert upsert is not None and [column.name for column, _ in upsert.assignments] == ["n", "id"]
    check_keys_kept(TABLE, [({"id": 1, "n": 0}, {"id": 1, "n": 2})])
    with pytest.raises(HeadraceError) as error:
        check_keys_kept(TABLE, [({"id": 1, "n": 0}, {"id": 2, "n": 0})])
    assert error.value.sqlstate == "0A000"
