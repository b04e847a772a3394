-- headrace's own cases over the webhook source compat_src (bodies {"id", "g", "seq", "n" (numeric text), "o": {"p"},
-- sometimes "a" (int) and "f" (bool)}, IDEMPOTENT on id); each runs ad hoc and as a materialized view, compared with
-- PostgreSQL over a table of the same bodies (tests/compat/views.py). One SELECT per `-- name:` header.
-- name: s_group_ints
SELECT body->>'g' AS g, count(*) AS c, sum((body->>'a')::int) AS sum_a, avg((body->>'a')::int) AS avg_a,
       min((body->>'a')::int) AS min_a, max((body->>'a')::int) AS max_a
FROM compat_src GROUP BY body->>'g'
-- name: s_projection
SELECT body->>'id' AS id, (body->>'a')::int / 3 AS a_div_3, (body->>'n')::numeric * 2 AS n_times_2,
       body->'o'->>'p' AS p FROM compat_src
-- name: s_group_numeric
SELECT body->>'g' AS g, sum((body->>'n')::numeric) AS sum_n, avg((body->>'n')::numeric) AS avg_n,
       count(body->>'a') AS n_a FROM compat_src GROUP BY body->>'g'
-- name: s_bucket_by_division
SELECT (body->>'a')::int / 10 AS bucket, count(*) AS c FROM compat_src GROUP BY (body->>'a')::int / 10
-- name: s_nulls
SELECT body->>'g' AS g, bool_or((body->>'f')::bool) AS any_f, bool_and((body->>'f')::bool) AS all_f,
       sum(CASE WHEN body->>'a' IS NULL THEN 1 ELSE 0 END) AS missing_a FROM compat_src GROUP BY body->>'g'
