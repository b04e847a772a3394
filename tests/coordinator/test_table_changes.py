"""The change computation of INSERT / UPDATE / DELETE (coordinator/table_changes.py) and the table log
record codec (store/table_log.py), without a server."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.catalog.tables import Table, TableColumn
from headrace.coordinator import table_changes as changes
from headrace.errors import HeadraceError
from headrace.store.table_log import (
    DELETE,
    INSERT,
    UPDATE,
    RowChange,
    ValueError_,
    decode_changes,
    encode_changes,
    to_document,
)

TABLE = Table(id="u1", name="t", create_sql="CREATE TABLE t (a int PRIMARY KEY, b text NOT NULL, c int)",
              columns=(TableColumn("a", "int4", True), TableColumn("b", "text", True), TableColumn("c", "int4")),
              primary_key=("a",))


def row(a: int, b: str = "x", c: int | None = None) -> dict[str, Any]:
    return {"a": a, "b": b, "c": c}


def apply(state: dict[tuple[Any, ...], dict[str, Any]], record: list[RowChange]) -> None:
    for change in record:
        if change.op == DELETE:
            assert state.pop(change.key) == change.old
        elif change.op == INSERT:
            assert change.key not in state
            state[change.key] = change.new  # type: ignore[assignment]
        else:
            assert state[change.key] == change.old
            state[change.key] = change.new  # type: ignore[assignment]


def test_insert_duplicate_key_against_existing_and_within_statement() -> None:
    pending = changes.PendingTable(TABLE)
    assert changes.insert(pending, [row(1), row(2)], {}) == 2
    with pytest.raises(HeadraceError) as error:
        changes.insert(changes.PendingTable(TABLE), [row(1)], {(1,): row(1)})
    assert error.value.sqlstate == "23505" and "Key (a)=(1) already exists." == error.value.detail
    fresh = changes.PendingTable(TABLE)
    with pytest.raises(HeadraceError) as error:
        changes.insert(fresh, [row(3), row(3, "y")], {})
    assert error.value.sqlstate == "23505"
    assert not fresh, "a failing statement changes nothing"


def test_not_null_and_deleted_key_can_be_reinserted() -> None:
    with pytest.raises(HeadraceError) as error:
        changes.insert(changes.PendingTable(TABLE), [{"a": 1, "b": None, "c": None}], {})
    assert error.value.sqlstate == "23502" and 'column "b"' in error.value.message
    pending = changes.PendingTable(TABLE)
    changes.delete(pending, [row(1, "old")])
    changes.insert(pending, [row(1, "new")], {(1,): None})
    assert pending.changes() == [RowChange(UPDATE, (1,), row(1, "new"), row(1, "old"))]


def test_update_moving_keys_swaps_and_conflicts() -> None:
    pending = changes.PendingTable(TABLE)
    # a = a + 1 over 1 and 2: 2 is vacated by the same statement, so no duplicate
    changes.update(pending, [(row(1), row(2)), (row(2, "y"), row(3, "y"))], {(2,): row(2, "y"), (3,): None})
    state = {(1,): row(1), (2,): row(2, "y")}
    apply(state, pending.changes())
    assert state == {(2,): row(2), (3,): row(3, "y")}
    with pytest.raises(HeadraceError) as error:
        changes.update(changes.PendingTable(TABLE), [(row(1), row(5))], {(5,): row(5)})
    assert error.value.sqlstate == "23505"


def test_insert_then_delete_in_one_transaction_is_no_change() -> None:
    pending = changes.PendingTable(TABLE)
    changes.insert(pending, [row(7)], {})
    changes.delete(pending, [row(7)])
    assert pending.changes() == []


def test_conflicts_first_committer_wins() -> None:
    pending = changes.PendingTable(TABLE)
    changes.update(pending, [(row(1), row(1, "mine"))], {})
    assert changes.conflicts(pending, {(1,): row(1)}) == []
    assert changes.conflicts(pending, {(1,): row(1, "theirs")}) == [(1,)]
    assert changes.serialization_failure(TABLE).sqlstate == "40001"


operations = st.lists(st.tuples(st.sampled_from(["insert", "update", "delete"]), st.integers(0, 5),
                                st.integers(0, 5), st.text(max_size=3)), max_size=25)


@settings(max_examples=100, deadline=None)
@given(initial=st.dictionaries(st.integers(0, 5), st.text(max_size=3), max_size=5), ops=operations)
def test_net_changes_replay_to_the_same_state(initial: dict[int, str], ops: list[tuple[str, int, int, str]]) -> None:
    """Whatever a transaction does, its net record turns the committed state into the transaction's state."""
    committed = {(a,): row(a, b) for a, b in initial.items()}
    model = dict(committed)
    pending = changes.PendingTable(TABLE)
    for op, a, target, text in ops:
        try:
            if op == "insert":
                changes.insert(pending, [row(a, text)], {(a,): model.get((a,))})
                model[(a,)] = row(a, text)
            elif op == "update" and (a,) in model:
                old = model[(a,)]
                new = row(target, text)
                changes.update(pending, [(old, new)], {(target,): model.get((target,))})
                del model[(a,)]
                model[(target,)] = new
            elif op == "delete" and (a,) in model:
                changes.delete(pending, [model[(a,)]])
                del model[(a,)]
        except HeadraceError as error:
            assert error.sqlstate == "23505"
    state = dict(committed)
    apply(state, decode_changes(encode_changes(pending.changes())))
    assert state == model


@given(st.lists(st.tuples(st.sampled_from([INSERT, UPDATE, DELETE]),
                          st.tuples(st.integers(-(2**63), 2**63 - 1), st.text()),
                          st.none() | st.dictionaries(st.text(), st.none() | st.integers(-(2**63), 2**63 - 1)
                                                      | st.text() | st.booleans()),
                          st.none() | st.dictionaries(st.text(), st.integers(-(2**63), 2**63 - 1)))))
def test_record_codec_roundtrip(raw: list[Any]) -> None:
    record = [RowChange(op, key, new, old) for op, key, new, old in raw]
    assert decode_changes(encode_changes(record)) == record


def test_values_convert_as_postgres_assigns_them() -> None:
    assert to_document("int4", "42") == 42
    assert to_document("int2", 2.5) == 3
    assert to_document("timestamptz", "1970-01-01 00:00:01+00") == 1_000_000
    assert to_document("bytea", b"\x01") == "AQ=="
    assert to_document("jsonb", '{"a": [1]}') == {"a": [1]}
    assert to_document("bool", "yes") is True
    for pg_type, value, sqlstate in [("int4", "x", "22P02"), ("int2", 40000, "22003"), ("bool", "maybe", "22P02"),
                                     ("jsonb", "{", "22P02"), ("timestamptz", "never", "22P02")]:
        with pytest.raises(ValueError_) as error:
            to_document(pg_type, value)
        assert error.value.sqlstate == sqlstate
    with pytest.raises(ValueError_) as error:
        to_document("varchar", "abcd", 3)
    assert error.value.sqlstate == "22001"
