"""pipeline/views.py on a real local SparkSession: partial documents from Spark, reduced by the real reducer
and finalized, equal a from-scratch recomputation of the view after every transaction."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings

from headrace.pipeline.views import source_changes, view_documents
from tests.sql.view_model import (
    AGGREGATES_SQL,
    Event,
    RuntimeModel,
    SourceModel,
    assert_same,
    compile_sql,
    expected_groups,
    python_documents,
    transactions_strategy,
    view_contents,
)

CHANGE_SCHEMA = ("body string, received_at long, idempotency_key string, log_offset long, hr_diff int, hr_seq long, "
                 "hr_row string, hr_at long")


def frame(spark: Any, rows: list[dict[str, Any]]) -> Any:
    columns = [c.split()[0] for c in CHANGE_SCHEMA.split(", ")]
    return spark.createDataFrame([tuple(row[c] for c in columns) for row in rows], CHANGE_SCHEMA)


def canonical(documents: list[tuple[list[Any], dict[str, Any]]]) -> dict[str, Any]:
    return {json.dumps(key): doc for key, doc in documents}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(transactions=transactions_strategy)
def test_spark_partials_equal_the_state_math_and_recomputation(spark: Any, transactions: list[list[Event]]) -> None:
    plan = compile_sql(AGGREGATES_SQL.format(source="events"))
    source, runtime = SourceModel(), RuntimeModel(plan)
    for batch in transactions:
        rows = source.changes(batch)
        documents = view_documents(plan, frame(spark, rows))
        assert canonical(documents) == canonical(python_documents(plan, rows))
        runtime.transact(documents)
        assert_same(view_contents(plan, runtime.store), expected_groups(source.live_rows()))


def test_append_only_view_on_spark(spark: Any) -> None:
    plan = compile_sql(AGGREGATES_SQL.format(source="clicks"))
    source, runtime = SourceModel(append_only=True), RuntimeModel(plan)
    batches = [[Event("x", "c1", 5, True, "a"), Event("x", "c1", 20, False, None), Event("y", None, None, None, "b")],
               [Event("z", "c1", -3, True, "b"), Event("z", "c2", 11, None, "c")]]
    for batch in batches:
        runtime.transact(view_documents(plan, frame(spark, source.changes(batch))))
        assert_same(view_contents(plan, runtime.store), expected_groups(source.live_rows()))


def test_projection_view_follows_replacements_and_filter(spark: Any) -> None:
    plan = compile_sql("CREATE MATERIALIZED VIEW big AS SELECT body->>'customer' AS customer, "
                       "(body->>'amount')::int / 7 AS sevenths, body->'tag' AS tag, received_at "
                       "FROM events WHERE (body->>'amount')::int > 10")
    source, runtime = SourceModel(), RuntimeModel(plan)
    batches = [[Event("e1", "c1", 50, None, "a"), Event("e2", "c2", 5, None, None)],
               [Event("e1", "c1", 3, None, "a"), Event("e2", "c2", 70, None, "b"), Event("e3", None, -71, None, "c")],
               [Event("e3", "c3", 15, None, None), Event("e3", "c3", 16, None, "z")]]
    for batch in batches:
        runtime.transact(view_documents(plan, frame(spark, source.changes(batch))))
        expected = {(e.customer, int(e.amount / 7), e.tag, 1_700_000_000_000_000 + offset)
                    for offset, e in source.live_rows() if e.amount is not None and e.amount > 10}
        actual = {tuple(doc[f"o{i}"] for i in range(4)) for doc in runtime.store.values()}
        assert actual == expected


def test_scalar_translation_matches_postgresql(spark: Any) -> None:
    plan = compile_sql(
        "CREATE MATERIALIZED VIEW v AS SELECT (body->>'n')::int / 2 AS half, -(body->>'n')::int / 2 AS neg_half, "
        "(body->>'n')::int % 3 AS rem, body->'o'->>'k' AS nested, body->'o' AS obj, body->'s' AS s_json, "
        "body->>'s' AS s_text, (body->>'missing') IS NULL AS missing, coalesce(body->>'missing', 'd') AS dflt, "
        "CASE WHEN (body->>'n')::int > 5 THEN 'big' ELSE 'small' END AS size, upper(body->>'s') || '!' AS shout, "
        "date_trunc('hour', received_at) AS hour, body->>'s' LIKE 'h%' AS like_h, length(body->>'s') AS len, "
        "(body->>'f')::float8 * 2 AS twice, body->'a'->>1 AS second, (body->>'b')::bool AS flag, "
        "body->>'s' IN ('hello', 'x') AS listed, round((body->>'f')::numeric, 1) AS rounded FROM events")
    body = {"n": 7, "o": {"k": "v", "z": [1, 2]}, "s": "hello", "f": 1.25, "a": ["x", "y"], "b": "true"}
    rows = [{"body": json.dumps(body), "received_at": 1_700_000_123_456_789, "idempotency_key": "k", "log_offset": 0,
             "hr_diff": 1, "hr_seq": 0, "hr_row": "[0]", "hr_at": 0}]
    (_, doc), = view_documents(plan, frame(spark, rows))
    values = {o.name: doc[f"o{i}"] for i, o in enumerate(plan.outputs)}
    assert values == {
        "half": 3, "neg_half": -3, "rem": 1, "nested": "v", "obj": {"k": "v", "z": [1, 2]}, "s_json": "hello",
        "s_text": "hello", "missing": True, "dflt": "d", "size": "big", "shout": "HELLO!",
        "hour": 1_699_999_200_000_000, "like_h": True, "len": 5, "twice": 2.5, "second": "y", "flag": True,
        "listed": True, "rounded": 1.3,
    }


def test_source_changes_turn_a_replacement_into_retraction_and_insert(spark: Any) -> None:
    batch = spark.createDataFrame([(200, "k1", '{"v": 2}')], "log_offset long, idempotency_key string, body string")
    replaced = spark.createDataFrame([(100, "k1", '{"v": 1}', 200)],
                                     "log_offset long, idempotency_key string, body string, replaced_by long")
    rows = sorted(source_changes(batch, replaced).collect(), key=lambda r: (r.hr_seq, r.hr_diff))
    assert [(r.hr_diff, r.hr_seq, r.hr_row, r.hr_at, r.body) for r in rows] == [
        (-1, 200, "[100]", 100, '{"v": 1}'), (1, 200, "[200]", 200, '{"v": 2}')]


ARROW_GROUPED_SQL = """CREATE MATERIALIZED VIEW sums AS
SELECT body->>'customer' AS customer, count(*) AS n, count((body->>'amount')::int) AS n_amount,
       sum((body->>'amount')::int) AS total, avg((body->>'amount')::int) AS mean,
       bool_and((body->>'flag')::bool) AS all_flag, bool_or((body->>'flag')::bool) AS any_flag,
       count(*) FILTER (WHERE (body->>'amount')::int > 10) AS big_count{extremes}
FROM {source} GROUP BY body->>'customer'"""


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(transactions=transactions_strategy)
def test_arrow_grouped_partials_equal_spark_groupby(spark: Any,
                                                                        transactions: list[list[Event]]) -> None:
    """Views whose states are sums/extremes are grouped by pyarrow (pipeline/view_partials.py), not Spark's
    groupBy: both paths give the same partial documents, with retractions (the groupBy path is checked against
    the Python state math above)."""
    from headrace.pipeline.view_partials import arrow_groupable
    from headrace.pipeline.views import SparkExpressions, _aggregate_documents, prepare_changes

    for append_only, extremes, name in ((False, "", "events"),
                                        (True, ", min((body->>'amount')::int) AS low, "
                                               "max((body->>'amount')::int) AS high", "clicks")):
        plan = compile_sql(ARROW_GROUPED_SQL.format(source=name, extremes=extremes))
        assert arrow_groupable(plan)
        source = SourceModel(append_only=append_only)
        for batch in transactions:
            rows = source.changes(batch)
            changes = frame(spark, rows)
            documents = view_documents(plan, changes)
            by_spark = _aggregate_documents(plan, prepare_changes(plan, changes), SparkExpressions(plan.input.columns))
            assert canonical(documents) == canonical(by_spark)
