-- headrace's own cases over the table compat_t (id int PRIMARY KEY, g text, a int, b bigint, n numeric(12,3),
-- x float8, j jsonb, f bool, gen int); each runs ad hoc and as a materialized view, compared with PostgreSQL
-- (tests/compat/views.py). One SELECT per `-- name:` header.
-- name: t_group_ints
SELECT g, count(*) AS n_rows, count(a) AS n_a, sum(a) AS sum_a, avg(a) AS avg_a, min(a) AS min_a, max(a) AS max_a
FROM compat_t GROUP BY g
-- name: t_group_bigint_numeric
SELECT g, sum(b) AS sum_b, avg(b) AS avg_b, sum(n) AS sum_n, avg(n) AS avg_n, min(n) AS min_n, max(n) AS max_n
FROM compat_t GROUP BY g
-- name: t_integer_division
SELECT id, a / 3 AS a_div_3, a % 3 AS a_mod_3, b / 7 AS b_div_7, n * 2 AS n_times_2 FROM compat_t
-- name: t_casts
SELECT id, a::numeric / 4 AS a_numeric_quarter, a::float8 / 4 AS a_float_quarter, n::int AS n_int,
       x::numeric(10,2) AS x_numeric, a::text AS a_text, (a > 0)::int AS a_positive FROM compat_t
-- name: t_json_operators
SELECT id, j->>'k' AS k, j->'arr' AS arr, (j->>'v')::int AS v, j->'o'->>'p' AS p, j #>> '{o,p}' AS p_path
FROM compat_t
-- name: t_group_json_key
SELECT j->>'k' AS k, count(*) AS c, sum((j->>'v')::int) AS sum_v, avg((j->>'v')::int) AS avg_v
FROM compat_t GROUP BY j->>'k'
-- name: t_nulls
SELECT g, sum(CASE WHEN a IS NULL THEN 1 ELSE 0 END) AS null_a, count(x) AS n_x, sum(x) AS sum_x,
       coalesce(max(n), 0) AS max_n_or_0, bool_and(f) AS all_f, bool_or(f) AS any_f
FROM compat_t GROUP BY g
-- name: t_where_having
SELECT g, count(*) AS c, max(x) AS max_x, min(b) AS min_b FROM compat_t WHERE a % 2 = 0 GROUP BY g HAVING count(*) > 1
-- name: t_bucket_by_division
SELECT a / 10 AS bucket, count(*) AS c, sum(a) AS sum_a FROM compat_t GROUP BY a / 10
