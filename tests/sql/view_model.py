"""Test model of view maintenance: an idempotent webhook source's changes, the runtime's reduce + finalize
step with the real reducer, and a from-scratch recomputation of the expected view contents."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from headrace.materialize.reduce import reducer_for_schema
from headrace.sql.parser import parse_statement
from headrace.sql.views import InputRelation, ViewPlan, compile_view

IDEMPOTENT_SOURCE = InputRelation(kind="source", item_id="u1", name="events",
                                  columns={"body": "jsonb", "received_at": "timestamptz", "idempotency_key": "text"},
                                  key=("log_offset",), append_only=False)
APPEND_ONLY_SOURCE = InputRelation(kind="source", item_id="u2", name="clicks",
                                   columns={"body": "jsonb", "received_at": "timestamptz"},
                                   key=("log_offset",), append_only=True)


def lookup(schema: str, name: str) -> InputRelation | None:
    return {"events": IDEMPOTENT_SOURCE, "clicks": APPEND_ONLY_SOURCE}.get(name) if schema == "public" else None


def compile_sql(sql: str) -> ViewPlan:
    statement = parse_statement(sql)
    return compile_view(statement, lookup)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Event:
    """One webhook request: idempotency key and body fields."""

    key: str
    customer: str | None
    amount: int | None
    flag: bool | None
    tag: str | None


events_strategy = st.builds(
    Event,
    key=st.sampled_from(["e1", "e2", "e3", "e4", "e5", "e6"]),
    customer=st.sampled_from(["c1", "c2", None]),
    amount=st.one_of(st.none(), st.integers(-50, 50)),
    flag=st.one_of(st.none(), st.booleans()),
    tag=st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
)
# Transactions of events: each inner list is one transaction.
transactions_strategy = st.lists(st.lists(events_strategy, min_size=1, max_size=6), min_size=1, max_size=4)


def body_of(event: Event) -> dict[str, Any]:
    return {"customer": event.customer, "amount": event.amount, "flag": event.flag, "tag": event.tag}


class SourceModel:
    """An idempotent source: the latest request of each key is live; a repeat replaces the old row."""

    def __init__(self, append_only: bool = False) -> None:
        self.append_only = append_only
        self.next_offset = 0
        self.live: dict[str, tuple[int, Event]] = {}  # key -> (log offset, event); append-only: offset as key
        self.arrivals: list[tuple[int, Event]] = []

    def changes(self, batch: Sequence[Event]) -> list[dict[str, Any]]:
        """The change rows of one transaction, in the change-stream contract (jsonb as JSON text)."""
        rows = []
        for event in batch:
            offset = self.next_offset
            self.next_offset += 100
            live_key = str(offset) if self.append_only else event.key
            old = self.live.get(live_key)
            if old is not None:
                rows.append(self._row(old[0], old[1], diff=-1, seq=offset))
            self.live[live_key] = (offset, event)
            rows.append(self._row(offset, event, diff=1, seq=offset))
        return rows

    def _row(self, offset: int, event: Event, diff: int, seq: int) -> dict[str, Any]:
        return {"body": json.dumps(body_of(event)), "received_at": 1_700_000_000_000_000 + offset,
                "idempotency_key": event.key, "log_offset": offset, "hr_diff": diff, "hr_seq": seq,
                "hr_row": f"[{offset}]", "hr_at": offset}

    def live_rows(self) -> list[tuple[int, Event]]:
        return sorted(self.live.values(), key=lambda entry: entry[0])


class RuntimeModel:
    """The runtime's per-transaction step for one view binding: combine in the transaction, fully reduce
    with the stored document, finalize, store or delete."""

    def __init__(self, plan: ViewPlan) -> None:
        self.plan = plan
        self.reducer = reducer_for_schema(plan.reduce_schema)
        self.store: dict[str, dict[str, Any]] = {}

    def transact(self, documents: Iterable[tuple[list[Any], dict[str, Any]]]) -> None:
        combined: dict[str, dict[str, Any]] = {}
        for key, doc in documents:
            identity = json.dumps(key)
            combined[identity] = self.reducer(combined[identity], doc) if identity in combined else doc
        for identity, doc in combined.items():
            key = json.loads(identity)[0]
            # The serving store keeps the stored fields only: a round trip through JSON as columns would.
            loaded = json.loads(json.dumps(self.store[key])) if key in self.store else None
            reduced = self.reducer.full(loaded, doc)
            final = self.plan.finalize(reduced) if reduced is not None else None
            if final is None:
                self.store.pop(key, None)
            else:
                self.store[key] = final


def expected_groups(rows: list[tuple[int, Event]]) -> dict[str | None, dict[str, Any]]:
    """From-scratch recomputation of AGGREGATES_SQL over the live rows (arrival = log offset)."""
    groups: dict[str | None, list[tuple[int, Event]]] = {}
    for offset, event in rows:
        groups.setdefault(event.customer, []).append((offset, event))
    result = {}
    for customer, members in groups.items():
        members.sort(key=lambda m: m[0])
        events = [e for _, e in members]
        amounts = [e.amount for e in events if e.amount is not None]
        flags = [e.flag for e in events if e.flag is not None]
        tags = [e.tag for e in events]
        present_tags = sorted({t for t in tags if t is not None})
        big = [e.amount for e in events if e.amount is not None and e.amount > 10]
        merged: dict[str, Any] = {}
        for e in events:
            if e.tag is not None:
                merged[e.tag] = e.amount
        result[customer] = {
            "n": len(events), "n_amount": len(amounts), "total": sum(amounts) if amounts else None,
            "mean": pg_avg(amounts) if amounts else None,
            "low": min(amounts) if amounts else None, "high": max(amounts) if amounts else None,
            "all_flag": all(flags) if flags else None, "any_flag": any(flags) if flags else None,
            "first_tag": tags[0], "last_tag": tags[-1], "tags": tags, "tag_set": present_tags or None,
            "distinct_tags": len(present_tags), "big_count": len(big), "by_tag": merged or None,
        }
    return result


def pg_avg(integers: list[int]) -> str:
    """avg of integers as PostgreSQL shows it: numeric text (tests/sql/test_view_numeric.py checks numeric_div
    against a real PostgreSQL)."""
    from decimal import Decimal

    from headrace.sql import view_numeric

    return view_numeric.text(view_numeric.numeric_div(Decimal(sum(integers)), 0, Decimal(len(integers))))


AGGREGATES_SQL = """CREATE MATERIALIZED VIEW totals AS
SELECT body->>'customer' AS customer, count(*) AS n, count((body->>'amount')::int) AS n_amount,
       sum((body->>'amount')::int) AS total, avg((body->>'amount')::int) AS mean,
       min((body->>'amount')::int) AS low, max((body->>'amount')::int) AS high,
       bool_and((body->>'flag')::bool) AS all_flag, bool_or((body->>'flag')::bool) AS any_flag,
       first(body->>'tag') AS first_tag, last(body->>'tag') AS last_tag, array_agg(body->>'tag') AS tags,
       set_agg(body->>'tag') AS tag_set, count(DISTINCT body->>'tag') AS distinct_tags,
       count(*) FILTER (WHERE (body->>'amount')::int > 10) AS big_count,
       jsonb_object_agg(body->>'tag', body->'amount') AS by_tag
FROM {source} GROUP BY body->>'customer'"""
AGGREGATE_OUTPUTS = ("n", "n_amount", "total", "mean", "low", "high", "all_flag", "any_flag", "first_tag", "last_tag",
                     "tags", "tag_set", "distinct_tags", "big_count", "by_tag")


def view_contents(plan: ViewPlan, store: dict[str, dict[str, Any]]) -> dict[str | None, dict[str, Any]]:
    """The public rows of AGGREGATES_SQL's view from the stored documents (outputs are plain a{j} here)."""
    contents = {}
    for doc in store.values():
        row = {}
        for output in plan.outputs:
            row[output.name] = doc[output.expression.name]
        contents[row.pop("customer")] = row
    return contents


def assert_same(actual: dict[Any, dict[str, Any]], expected: dict[Any, dict[str, Any]]) -> None:
    assert set(actual) == set(expected)
    for group, row in expected.items():
        for name, value in row.items():
            got = actual[group][name]
            if isinstance(value, float):
                assert got is not None and abs(got - value) < 1e-9, (group, name, got, value)
            else:
                assert got == value, (group, name, got, value)


# What each aggregate of AGGREGATES_SQL reads from an event (its evaluated arguments), and its FILTER.
ARGUMENTS: dict[str, Any] = {
    "n": lambda e: (), "n_amount": lambda e: (e.amount,), "total": lambda e: (e.amount,), "mean": lambda e: (e.amount,),
    "low": lambda e: (e.amount,), "high": lambda e: (e.amount,), "all_flag": lambda e: (e.flag,),
    "any_flag": lambda e: (e.flag,), "first_tag": lambda e: (e.tag,), "last_tag": lambda e: (e.tag,),
    "tags": lambda e: (e.tag,), "tag_set": lambda e: (e.tag,), "distinct_tags": lambda e: (e.tag,),
    "big_count": lambda e: (), "by_tag": lambda e: (e.tag, e.amount),
}
FILTERS: dict[str, Any] = {"big_count": lambda e: e.amount is not None and e.amount > 10}


def python_documents(plan: ViewPlan, rows: list[dict[str, Any]]) -> list[tuple[list[Any], dict[str, Any]]]:
    """What pipeline/views.py computes on Spark, computed in Python with view_aggregates.fold: the
    reference for the state math, independent of the Spark translation."""
    from headrace.sql.view_aggregates import Change, fold
    from headrace.sql.views import KEY_FIELD, STATE_FIELD

    by_group: dict[str | None, list[tuple[dict[str, Any], Event]]] = {}
    for row in rows:
        body = json.loads(row["body"])
        event = Event(row["idempotency_key"], body["customer"], body["amount"], body["flag"], body["tag"])
        by_group.setdefault(event.customer, []).append((row, event))
    field_of = {output.name: output.expression.name for output in plan.outputs}
    documents = []
    for customer, members in by_group.items():
        key = json.dumps([customer], separators=(",", ":"))
        state: dict[str, Any] = {"rows": sum(row["hr_diff"] for row, _ in members)}
        for name, arguments in ARGUMENTS.items():
            aggregate = next(a for a in plan.aggregates if a.field == field_of[name])
            keep = FILTERS.get(name, lambda e: True)
            changes = [Change(row["hr_seq"], row["hr_diff"], row["hr_row"], row["hr_at"], arguments(event))
                       for row, event in members if keep(event)]
            partial = fold(aggregate, changes)
            if partial is not None:
                state[aggregate.field] = partial
        documents.append(([key], {KEY_FIELD: key, "k0": customer, STATE_FIELD: state}))
    return documents
