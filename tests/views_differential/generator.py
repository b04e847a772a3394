"""A seeded generator of tables, views and writes for the differential test against PostgreSQL 15.

Every type a view supports appears as a column; expressions are built bottom-up by result type, from the
scalar functions, casts and operators the view compiler accepts; values stay small so that no expression
overflows (a failing expression is the errors-as-data test's subject, not this one's).

numeric comes as numeric(12,2), numeric(6) (scale 0: values are rounded) and unconstrained numeric `u`, written
at various scales (`2.50`, `2.5`, `1e-7`). headrace's table holds an unconstrained numeric as numeric(38,10)
(docs/tables.md: the written scale is not kept, so `SELECT u FROM t` shows 2.5000000000), so PostgreSQL's table
declares `u numeric(38,10)`: the test checks what views compute from what the table holds; the table's own loss of
the written scale is the table's limit (docs/views.md "Types")."""

from __future__ import annotations

import random
from decimal import Decimal
from collections.abc import Callable
from dataclasses import dataclass, field

COLUMNS = {"a": "int", "b": "bigint", "f": "float8", "n": "numeric(12,2)", "u": "numeric", "q": "numeric(6)",
           "s": "text", "p": "bool", "d": "date", "ts": "timestamptz", "j": "jsonb",
           "big": "float8"}  # only aggregated: large values passing through a group's float sum (issue 22)
TEXTS = ["a", "b", "B", "ab", "", "a%b", "xyz", "Ab c"]


@dataclass
class Generated:
    table: str
    create_table: str
    oracle_create_table: str  # the same table on PostgreSQL: `u` as headrace's table holds it, numeric(38,10)
    views: dict[str, str] = field(default_factory=dict)  # name -> SELECT


class Generator:
    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.next_id = 1
        self.live: set[int] = set()

    # ------------------------------------------------------------------------------------------- values

    def value(self, column: str) -> str:
        r = self.random
        if r.random() < 0.15:
            return "NULL"
        kind = COLUMNS[column]
        if kind in ("int", "bigint"):
            return str(r.randint(-50, 50))
        if column == "big":
            return repr(r.choice([r.randint(-40, 40) / 4, 2.675, 0.1, 1e15, 1.2e19, 1e17 + r.randint(0, 9) * 16]))
        if kind == "float8":
            return repr(r.choice([r.randint(-40, 40) / 4, r.randint(-1000, 1000) / 8, 2.5, -0.5, 0.0]))
        if column == "u":
            return r.choice(["2.50", "2.5", "1e-7", "-0.000", "100",
                             str(Decimal(r.randint(-10**7, 10**7)).scaleb(-r.randint(0, 7)))])
        if kind.startswith("numeric"):
            return f"{r.randint(-200000, 200000) / 100:.2f}" if r.random() < 0.7 else r.choice(["2.5", "-2.5", "0.5", "1e-3"])
        if kind == "text":
            return "'" + r.choice(TEXTS) + "'"
        if kind == "bool":
            return r.choice(["true", "false"])
        if kind == "date":
            return f"'{r.randint(1995, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}'"
        if kind == "timestamptz":
            micros = r.choice(["", ".5", ".123456", ".000001"])
            return (f"'{r.randint(2000, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} "
                    f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}{micros}"
                    f"{r.choice(['+00', '+02', '-05:30'])}'")
        members = []
        if r.random() < 0.8:
            members.append(f'"k": "{r.choice(TEXTS[:4])}"')
        if r.random() < 0.8:
            members.append(f'"v": {r.randint(-9, 9)}')
        return "'{" + ", ".join(members) + "}'"

    def row(self) -> str:
        self.live.add(self.next_id)
        self.next_id += 1
        return f"({self.next_id - 1}, {', '.join(self.value(c) for c in COLUMNS)})"

    def writes(self) -> list[str]:
        """One batch: a few inserts, updates and deletes."""
        r = self.random
        statements = ["INSERT INTO {t} VALUES " + f" {', '.join(self.row() for _ in range(r.randint(1, 6)))}"]
        for _ in range(r.randint(0, 3)):
            if self.live:
                target = r.choice(sorted(self.live))
                columns = r.sample(list(COLUMNS), r.randint(1, 3))
                sets = ", ".join(f"{c} = {self.value(c)}" for c in columns)
                statements.append("UPDATE {t} SET " + f" {sets} WHERE id = {target}")
        for _ in range(r.randint(0, 2)):
            if len(self.live) > 2:
                target = r.choice(sorted(self.live))
                self.live.discard(target)
                statements.append("DELETE FROM {t} WHERE " + f" id = {target}")
        return statements

    # -------------------------------------------------------------------------------------- expressions

    def expression(self, kind: str, depth: int = 2) -> str:
        builders = EXPRESSIONS[kind]
        leaves = [b for b, nested in builders if not nested]
        choices = [b for b, _ in builders] if depth > 0 else leaves
        return self.random.choice(choices)(self, depth - 1)

    def literal(self, kind: str) -> str:
        r = self.random
        return {"int": lambda: str(r.randint(-10, 10)), "float": lambda: repr(r.randint(-20, 20) / 4),
                "numeric": lambda: f"{r.randint(-500, 500) / 10}",
                "text": lambda: "'" + r.choice(TEXTS) + "'"}[kind]()

    def view(self, table: str) -> str:
        r = self.random
        where = f" WHERE {self.expression('bool')}" if r.random() < 0.5 else ""
        if r.random() < 0.35:
            outputs = ", ".join(f"{self.expression(r.choice(list(EXPRESSIONS)))} AS c{i}" for i in range(r.randint(1, 4)))
            return f"SELECT id, {outputs} FROM {table}{where}"
        keys = [self.expression(r.choice(["int", "text", "bool", "date", "numeric"]), 1) for _ in range(r.randint(0, 2))]
        aggregates = []
        for i in range(r.randint(1, 4)):
            function, kind = r.choice(AGGREGATES)
            argument = "*" if kind == "*" else self.expression(kind, 1)
            if kind == "float" and r.random() < 0.4:
                argument = "big"
            if function == "array_agg" and r.random() < 0.4:
                argument = f"DISTINCT {argument}"
            aggregates.append(f"{function}({argument}) AS a{i}")
        select = [f"{key} AS k{i}" for i, key in enumerate(keys)] + aggregates
        group_by = f" GROUP BY {', '.join(str(i + 1) for i in range(len(keys)))}" if keys else ""
        return f"SELECT {', '.join(select)} FROM {table}{where}{group_by}"

    def case(self, table: str, views: int) -> Generated:
        columns = ", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())
        oracle_columns = columns.replace("u numeric,", "u numeric(38,10),")
        generated = Generated(table, f"CREATE TABLE {table} (id int PRIMARY KEY, {columns})",
                              f"CREATE TABLE {table} (id int PRIMARY KEY, {oracle_columns})")
        for i in range(views):
            generated.views[f"{table}_v{i}"] = self.view(table)
        return generated


Builder = Callable[[Generator, int], str]


def _e(kind: str) -> Builder:
    return lambda g, depth: g.expression(kind, depth)


EXPRESSIONS: dict[str, list[tuple[Builder, bool]]] = {
    "int": [
        (lambda g, d: "a", False), (lambda g, d: "b", False), (lambda g, d: g.literal("int"), False),
        (lambda g, d: "(j->>'v')::int", False), (lambda g, d: "length(s)", False),
        (lambda g, d: f"({_e('int')(g, d)} + {_e('int')(g, d)})", True),
        (lambda g, d: f"({_e('int')(g, d)} - {_e('int')(g, d)})", True),
        (lambda g, d: f"({_e('int')(g, d)} * {g.random.randint(-3, 3)})", True),
        (lambda g, d: f"({_e('int')(g, d)} / {g.random.choice([2, 3, -4, 7])})", True),
        (lambda g, d: f"({_e('int')(g, d)} % {g.random.choice([2, 3, -4])})", True),
        (lambda g, d: f"abs({_e('int')(g, d)})", True),
        (lambda g, d: f"{_e('float')(g, d)}::int", True), (lambda g, d: f"({_e('numeric')(g, d)})::bigint", True),
        (lambda g, d: f"coalesce({_e('int')(g, d)}, {g.literal('int')})", True),
        (lambda g, d: f"CASE WHEN {_e('bool')(g, d)} THEN {_e('int')(g, d)} ELSE {_e('int')(g, d)} END", True),
        (lambda g, d: f"greatest({_e('int')(g, d)}, {_e('int')(g, d)})", True),
        (lambda g, d: f"nullif({_e('int')(g, d)}, {g.literal('int')})", True),
    ],
    "float": [
        (lambda g, d: "f", False), (lambda g, d: f"{g.literal('float')}::float8", False),
        (lambda g, d: f"({_e('float')(g, d)} + {_e('float')(g, d)})", True),
        (lambda g, d: f"({_e('float')(g, d)} * {g.random.choice([2, -1, 0.5])})", True),
        (lambda g, d: f"({_e('float')(g, d)} / 4)", True),
        (lambda g, d: f"round({_e('float')(g, d)})", True), (lambda g, d: f"floor({_e('float')(g, d)})", True),
        (lambda g, d: f"ceil({_e('float')(g, d)})", True), (lambda g, d: f"abs({_e('float')(g, d)})", True),
        (lambda g, d: f"{_e('int')(g, d)}::float8", True),
    ],
    "numeric": [
        (lambda g, d: "n", False), (lambda g, d: "u", False), (lambda g, d: "q", False),
        (lambda g, d: g.literal("numeric"), False),
        (lambda g, d: f"({_e('numeric')(g, d)} + {_e('numeric')(g, d)})", True),
        (lambda g, d: f"({_e('numeric')(g, d)} * {g.random.choice([2, -3, '0.5'])})", True),
        (lambda g, d: f"abs({_e('numeric')(g, d)})", True),  # numeric / is refused (view_numeric: its scale)
        (lambda g, d: f"({_e('numeric')(g, d)})::numeric(14,{g.random.randint(0, 3)})", True),
        (lambda g, d: f"round({_e('numeric')(g, d)})", True),
        (lambda g, d: f"round({_e('numeric')(g, d)}, {g.random.randint(0, 2)})", True),
        (lambda g, d: f"floor({_e('numeric')(g, d)})", True), (lambda g, d: f"ceil({_e('numeric')(g, d)})", True),
        (lambda g, d: f"{_e('int')(g, d)}::numeric", True),
    ],
    "text": [
        (lambda g, d: "s", False), (lambda g, d: "j->>'k'", False), (lambda g, d: g.literal("text"), False),
        (lambda g, d: "d::text", False), (lambda g, d: "ts::text", False),
        (lambda g, d: f"lower({_e('text')(g, d)})", True), (lambda g, d: f"upper({_e('text')(g, d)})", True),
        (lambda g, d: f"({_e('text')(g, d)} || {_e(g.random.choice(['text', 'int']))(g, d)})", True),
        (lambda g, d: f"substr({_e('text')(g, d)}, {g.random.randint(-2, 3)}, {g.random.randint(0, 3)})", True),
        (lambda g, d: f"substr({_e('text')(g, d)}, {g.random.randint(-2, 3)})", True),
        (lambda g, d: f"left({_e('text')(g, d)}, {g.random.randint(-2, 2)})", True),
        (lambda g, d: f"right({_e('text')(g, d)}, {g.random.randint(-2, 2)})", True),
        (lambda g, d: f"replace({_e('text')(g, d)}, 'a', 'Z')", True),
        (lambda g, d: f"coalesce({_e('text')(g, d)}, 'none')", True),
        (lambda g, d: f"floor({_e('numeric')(g, d)})::text", True),
        (lambda g, d: f"round({_e('numeric')(g, d)}, 1)::text", True),
        (lambda g, d: f"{_e('int')(g, d)}::text", True),
        (lambda g, d: f"CASE WHEN {_e('bool')(g, d)} THEN {_e('text')(g, d)} END", True),
    ],
    "bool": [
        (lambda g, d: "p", False), (lambda g, d: "s IS NULL", False), (lambda g, d: "a IS NOT NULL", False),
        (lambda g, d: "f IS NOT NULL", False),
        (lambda g, d: f"({_e('int')(g, d)} {g.random.choice(['<', '<=', '=', '<>', '>', '>='])} {_e('int')(g, d)})", True),
        (lambda g, d: f"({_e('float')(g, d)} > {g.literal('float')})", True),
        (lambda g, d: f"({_e('numeric')(g, d)} <= {g.literal('numeric')})", True),
        (lambda g, d: f"({_e('text')(g, d)} {g.random.choice(['=', '<', '>='])} {g.literal('text')})", True),
        (lambda g, d: f"({_e('text')(g, d)} LIKE 'a%')", True),
        (lambda g, d: f"(d {g.random.choice(['<', '>=', '='])} '{g.random.randint(1995, 2030)}-06-15')", False),
        (lambda g, d: f"(d BETWEEN '2000-01-01' AND '{g.random.randint(2001, 2030)}-01-01')", False),
        (lambda g, d: f"(ts > '{g.random.randint(2000, 2030)}-01-01 00:00:00+00')", False),
        (lambda g, d: f"({_e('int')(g, d)} BETWEEN -5 AND 20)", True),
        (lambda g, d: f"({_e('int')(g, d)} IN (1, 2, 3, -7))", True),
        (lambda g, d: f"({_e('bool')(g, d)} AND {_e('bool')(g, d)})", True),
        (lambda g, d: f"({_e('bool')(g, d)} OR {_e('bool')(g, d)})", True),
        (lambda g, d: f"NOT {_e('bool')(g, d)}", True),
        (lambda g, d: f"({_e(g.random.choice(['int', 'text', 'float', 'numeric']))(g, d)} IS NOT NULL)", True),
        (lambda g, d: f"({_e('bool')(g, d)} IS NOT TRUE)", True),
    ],
    "date": [(lambda g, d: "d", False)],
    "timestamptz": [(lambda g, d: "ts", False), (lambda g, d: "date_trunc('hour', ts)", False)],
}

AGGREGATES = [("count", "*"), ("count", "text"), ("sum", "int"), ("sum", "float"), ("sum", "numeric"),
              ("avg", "int"), ("avg", "float"), ("avg", "numeric"), ("min", "int"), ("max", "int"), ("min", "text"),
              ("max", "text"), ("min", "float"), ("max", "numeric"), ("min", "date"), ("max", "timestamptz"),
              ("bool_and", "bool"), ("bool_or", "bool"), ("array_agg", "numeric"), ("array_agg", "numeric"),
              ("array_agg", "int"), ("array_agg", "text"), ("min", "numeric"), ("max", "numeric")]
