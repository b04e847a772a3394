"""The fast path: point lookups answered from an index's in-memory arrangement, without DuckDB.

A DuckDB point query costs ~0.4-0.65 ms from Python (it plans every call), which caps pgwire throughput
far below PostgreSQL's. Materialize answers such queries with a "fast path peek" on an index; so does this.

Eligible: `SELECT <projections> FROM <relation> [AS a] WHERE <conjuncts>` over one relation with an index
whose every column is compared for equality (`col = $n | literal | CAST(... AS text/int)`, either side),
other conjuncts of that same form checked on the rows found, projections `*`, plain columns and
`json_col ->> 'key'`. Anything else, and any value the fast path cannot reproduce exactly as DuckDB would
(a `->>` giving a float or an object), runs in DuckDB as before: the fast path answers or declines, it
never guesses. The RowDescription is the DuckDB plan's own (planned once per statement shape).

With the PostgreSQL serving store the same lookups are answered from the same arrangements: the statement is
described by PostgreSQL (its RowDescription and parameter types), and a lookup the fast path declines, or one
inside a transaction block (where PostgreSQL's snapshot rules apply), is run by PostgreSQL instead
(`Coordinator.run_on_store`). Only columns whose values print exactly as PostgreSQL prints them are projected
(STORE_EXACT_TYPES).

Simple-protocol clients send a new text per lookup (`... WHERE k = 42`), so a SELECT's literals are
normalized away (`normalize_literals`): the first text of a shape is planned as usual, later ones with
other literal values reuse its analysis with their own values, and skip parsing and DuckDB altogether.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from sqlglot import exp

from headrace.coordinator.responses import Column, ExecuteResponse, SendingRows, StatementDescription
from headrace.coordinator.session import Portal, PreparedStatement
from headrace.pgwire import types as pg
from headrace.sql.parser import parse_statement
from headrace.sql.select import plan_select
from headrace.store.query import session_parameters

if TYPE_CHECKING:
    from headrace.coordinator.coordinator import Coordinator
    from headrace.coordinator.indexes import IndexDdl
    from headrace.coordinator.session import Session
    from headrace.store.arrangements import Arrangement

Row = tuple[Any, ...]

INT_TYPES = frozenset({pg.INT2, pg.INT4, pg.INT8})
TEXT_TYPES = frozenset({pg.TEXT, pg.VARCHAR})
KEY_TYPES = INT_TYPES | TEXT_TYPES | {pg.BOOL}
JSON_TYPES = frozenset({pg.JSON, pg.JSONB})
# Values the arrangement holds (decoded from PostgreSQL's text) that headrace's encoders print byte for byte as
# PostgreSQL does, whatever the session's settings: the columns a lookup on the PostgreSQL store may project.
STORE_EXACT_TYPES = INT_TYPES | TEXT_TYPES | {pg.BOOL, pg.NUMERIC}
FROM_KEY = "from_" if "from_" in exp.Select.arg_types else "from"
# Select arguments a point lookup may have; any other one set (GROUP BY, LIMIT, DISTINCT, ...) is not.
_ALLOWED_SELECT_ARGS = frozenset({"expressions", FROM_KEY, "where", "kind"})
_CACHE_CAPACITY = 1024
_PARAMETERS_CHECKED = 64  # a lookup's $n beyond this is no point lookup worth answering from an index


class Declined(Exception):
    """The fast path cannot reproduce DuckDB's answer for these values exactly: DuckDB answers."""


# ---- literal normalization -------------------------------------------------------------------------

# A string literal, or a number not part of a name, a $n parameter or a cast's type (int4).
_LITERAL = re.compile(r"'(?:[^']|'')*'|(?<![\w$.])\d+(?:\.\d+)?(?![\w.])")
# Texts whose literals the regular expression cannot find safely: quoted identifiers, comments, E'' and
# dollar quoting, backslashes. Their statements are cached by exact text only.
_UNSAFE = re.compile(r"[\"\\]|--|/\*|\$\$|[eEbBxXuU]&?'")


def normalize_literals(sql: str) -> tuple[str, tuple[str, ...]] | None:
    """(the text with every literal replaced by '?', the literals as written), or None when unsafe."""
    if _UNSAFE.search(sql):
        return None
    literals = tuple(_LITERAL.findall(sql))
    return _LITERAL.sub("?", sql), literals


def literal_value(written: str) -> str | int | None:
    """A literal as written: a string's text, an integer, or None for other numbers."""
    if written.startswith("'"):
        return written[1:-1].replace("''", "'")
    return int(written) if written.isdigit() else None


# ---- values ------------------------------------------------------------------------------------------

_INTEGER_TEXT = re.compile(r"\s*[+-]?\d+\s*")


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise Declined
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
        return int(value)
    raise Declined


_INT_RANGE = {pg.INT2: 1 << 15, pg.INT4: 1 << 31, pg.INT8: 1 << 63}


def _int_of(type_oid: int) -> Callable[[Any], int]:
    """A compared value as the column's integer: text out of the type's range is the database's 22003 to report."""
    bound = _INT_RANGE[type_oid]

    def convert(value: Any) -> int:
        number = _as_int(value)
        if isinstance(value, str) and not -bound <= number < bound:
            raise Declined
        return number
    return convert


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise Declined


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise Declined


def conversion_to(type_oid: int) -> Callable[[Any], Any]:
    """How a compared value becomes the column's Python value (raising Declined when unsure)."""
    if type_oid in INT_TYPES:
        return _int_of(type_oid)
    if type_oid in TEXT_TYPES:
        return lambda value: value if isinstance(value, str) else _refuse()
    if type_oid == pg.BOOL:
        return _as_bool
    raise Declined


def _refuse() -> Any:
    raise Declined


@dataclass(frozen=True, slots=True)
class ValueSource:
    """Where a compared value comes from: parameter $n, literal slot n of the normalized text, or a
    constant; then an optional cast and the conversion to the column's type."""

    kind: str  # "param" | "slot" | "const"
    index: int = 0
    constant: Any = None
    casts: tuple[Callable[[Any], Any], ...] = ()

    def value(self, params: Sequence[Any], literals: Sequence[Any]) -> Any:
        if self.kind == "param":
            value = params[self.index]
        elif self.kind == "slot":
            value = literals[self.index]
        else:
            value = self.constant
        if value is None:
            return None
        for cast in self.casts:
            value = cast(value)
        return value


@dataclass(frozen=True, slots=True)
class FastPlan:
    index_id: str
    generation: int  # the index catalog's generation when analysed
    key: tuple[ValueSource, ...]  # one per index column, in index order
    residual: tuple[tuple[int, ValueSource], ...]  # (row position, value) equalities checked on found rows
    projections: tuple[tuple[str, int, str | None], ...]  # ("column", pos, None) | ("json_text", pos, key)


@dataclass(slots=True)
class FastStatement(PreparedStatement):
    """A prepared SELECT an index can answer. `literals`: this text's literal values (simple protocol);
    `exact`: the plan is this very text's (else it is its shape's first text, with other literals)."""

    fast: FastPlan | None = None
    literals: tuple[Any, ...] = ()
    exact: bool = True
    shape_sql: str | None = None  # the first text of this shape: it names the same relations (read-your-writes)


# ---- projection ----------------------------------------------------------------------------------------

def json_text(document: Any, key: str) -> Any:
    """`document ->> 'key'` as DuckDB computes it, for the values it is sure of."""
    if document is None:
        return None
    try:
        parsed = json.loads(document) if isinstance(document, str) else document
    except ValueError:
        raise Declined from None
    if not isinstance(parsed, dict):
        raise Declined
    value = parsed.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise Declined  # floats, objects, arrays: DuckDB's own formatting


def project(plan: FastPlan, row: Row) -> Row:
    out = []
    for kind, position, key in plan.projections:
        value = row[position]
        out.append(value if kind == "column" else json_text(value, key))  # type: ignore[arg-type]
    return tuple(out)


# ---- analysis -------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class IndexedRelation:
    """What analysis needs of an index: its id, its relation's columns, its key columns' positions."""

    index_id: str
    columns: tuple[Column, ...]
    key_positions: tuple[int, ...]


def _column_position(column: exp.Column, columns: Sequence[Column], alias: str, name: str) -> int | None:
    table = column.table
    if table and table not in (alias, name):
        return None
    identifier = column.this
    if not isinstance(identifier, exp.Identifier):
        return None
    wanted = identifier.this if identifier.quoted else identifier.this.lower()
    matches = [i for i, c in enumerate(columns) if c.name == wanted]
    return matches[0] if len(matches) == 1 else None


class _Analysis:
    def __init__(self, columns: Sequence[Column], alias: str, name: str, literal_slot: Callable[[exp.Literal], int | None],
                 param_types: Sequence[int]) -> None:
        self.columns, self.alias, self.name = columns, alias, name
        self.literal_slot = literal_slot
        self.param_types = param_types

    def value_source(self, node: exp.Expr, column_oid: int) -> ValueSource | None:
        casts: list[Callable[[Any], Any]] = []
        while isinstance(node, exp.Cast):
            to = node.to
            if to.this in (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR) and not to.expressions:
                casts.insert(0, _as_text)
            elif to.this in (exp.DataType.Type.INT, exp.DataType.Type.BIGINT, exp.DataType.Type.SMALLINT):
                casts.insert(0, _as_int)
            else:
                return None
            node = node.this
        try:
            casts.append(conversion_to(column_oid))
        except Declined:
            return None
        if isinstance(node, exp.Parameter) and isinstance(node.this, exp.Literal) and node.this.name.isdigit():
            index = int(node.this.name) - 1
            if not 0 <= index < len(self.param_types):
                return None
            return ValueSource("param", index, casts=tuple(casts))
        if isinstance(node, exp.Null):
            return ValueSource("const", constant=None)
        if isinstance(node, exp.Literal):
            value = node.name if node.is_string else (int(node.name) if node.name.isdigit() else None)
            if value is None:
                return None
            slot = self.literal_slot(node)
            if slot is not None:
                return ValueSource("slot", slot, casts=tuple(casts))
            return ValueSource("const", constant=value, casts=tuple(casts))
        return None

    def equality(self, node: exp.Expr) -> tuple[int, ValueSource] | None:
        if not isinstance(node, exp.EQ):
            return None
        for column, other in ((node.this, node.expression), (node.expression, node.this)):
            if isinstance(column, exp.Column):
                position = _column_position(column, self.columns, self.alias, self.name)
                if position is None or self.columns[position].type_oid not in KEY_TYPES:
                    return None
                source = self.value_source(other, self.columns[position].type_oid)
                return None if source is None else (position, source)
        return None

    def projection(self, node: exp.Expr) -> list[tuple[str, int, str | None]] | None:
        if isinstance(node, exp.Alias):
            node = node.this
        if isinstance(node, exp.Star):
            return [("column", i, None) for i in range(len(self.columns))]
        if isinstance(node, exp.Column):
            if node.is_star:
                return None if node.table not in (self.alias, self.name) else \
                    [("column", i, None) for i in range(len(self.columns))]
            position = _column_position(node, self.columns, self.alias, self.name)
            return None if position is None else [("column", position, None)]
        if isinstance(node, exp.JSONExtractScalar) and isinstance(node.this, exp.Column):
            position = _column_position(node.this, self.columns, self.alias, self.name)
            path = node.expression
            if position is None or self.columns[position].type_oid not in JSON_TYPES:
                return None
            if isinstance(path, exp.JSONPath) and len(path.expressions) == 2 \
                    and isinstance(path.expressions[0], exp.JSONPathRoot) \
                    and isinstance(path.expressions[1], exp.JSONPathKey) and isinstance(path.expressions[1].this, str):
                return [("json_text", position, path.expressions[1].this)]
        return None


def _prints_as(stored: int, shown: int) -> bool:
    """Whether a value the index holds as `stored` prints as the query's `shown` column does: the same type, or a
    text kept as text and shown as varchar(n), an integer kept wider than its declared int2 (the write checked it
    fits)."""
    return stored == shown or stored in TEXT_TYPES and shown in TEXT_TYPES or stored in INT_TYPES and shown in INT_TYPES


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    return [node]


def analyse(ast: exp.Expr, param_types: Sequence[int], output: Sequence[Column] | None,
            indexes_on: Callable[[str, str], list[IndexedRelation]], generation: int,
            literal_slot: Callable[[exp.Literal], int | None]) -> FastPlan | None:
    """The fast plan for a statement, or None if no index can answer it exactly. `output` None: whether an index
    could answer it, before its result columns are known (they are not checked)."""
    if not isinstance(ast, exp.Select):
        return None
    if any(value for key, value in ast.args.items() if key not in _ALLOWED_SELECT_ARGS) or ast.args.get("kind"):
        return None
    from_ = ast.args.get(FROM_KEY)
    where = ast.args.get("where")
    if from_ is None or where is None or from_.expressions or not isinstance(from_.this, exp.Table):
        return None
    table = from_.this
    if table.args.get("catalog") or table.args.get("joins") or not isinstance(table.this, exp.Identifier):
        return None
    if any(isinstance(node, (exp.Subquery, exp.AggFunc, exp.Window, exp.Select)) and node is not ast
           for node in ast.walk()):
        return None
    schema = table.db or "public"
    candidates = indexes_on(schema, table.name)
    for index in candidates:
        analysis = _Analysis(index.columns, table.alias_or_name, table.name, literal_slot, param_types)
        equalities = []
        for conjunct in _conjuncts(where.this):
            found = analysis.equality(conjunct)
            if found is None:
                break
            equalities.append(found)
        else:
            projections: list[tuple[str, int, str | None]] = []
            for expression in ast.expressions:
                projected = analysis.projection(expression)
                if projected is None:
                    return None
                projections += projected
            if output is not None and len(projections) != len(output) or output is not None and any(
                    kind == "column" and not _prints_as(index.columns[position].type_oid, column.type_oid)
                    or kind == "json_text" and column.type_oid != pg.TEXT
                    for (kind, position, _), column in zip(projections, output)):
                return None
            key: list[ValueSource] = []
            residual = list(equalities)
            for position in index.key_positions:
                match = next((e for e in residual if e[0] == position), None)
                if match is None:
                    break
                residual.remove(match)
                key.append(match[1])
            else:
                return FastPlan(index.index_id, generation, tuple(key), tuple(residual), tuple(projections))
    return None


# ---- the fast path --------------------------------------------------------------------------------------

@dataclass(slots=True)
class _Shape:
    """A normalized text's analysis: which literal slots feed the plan, and the other literals as written
    (a text of the same shape with different ones is a different statement)."""

    slots: frozenset[int]
    fixed: tuple[tuple[int, str], ...]
    statement: FastStatement


class FastPath:
    def __init__(self, indexes: IndexDdl) -> None:
        self.indexes = indexes
        self._shapes: dict[tuple[str, tuple[int, ...], Hashable], _Shape] = {}
        self.answered = 0
        self.declined = 0

    def generation(self) -> int:
        return self.indexes.catalog.generation

    # -- prepare ---------------------------------------------------------------------------------
    def prepare(self, sql: str, param_types: Sequence[int], fingerprint: Hashable) -> FastStatement | None:
        """A statement of a shape seen before, with this text's literal values; None if unknown."""
        if not self._shapes:
            return None
        normalized = normalize_literals(sql)
        if normalized is None:
            return None
        template, literals = normalized
        shape = self._shapes.get((template, tuple(param_types), fingerprint))
        if shape is None or any(literals[i] != written for i, written in shape.fixed):
            return None
        cached = shape.statement
        values = tuple(literal_value(written) if i in shape.slots else None for i, written in enumerate(literals))
        return FastStatement(sql, cached.ast, cached.description, cached.plan, store_reads=cached.store_reads,
                             fast=cached.fast, literals=values, exact=sql == cached.sql, shape_sql=cached.sql)

    def could_answer(self, ast: exp.Expr, param_types: Sequence[int]) -> bool:
        """Whether an index could answer `ast` (its result columns not known yet): worth describing it to learn."""
        # parameters the client left untyped ($1 with type 0) are typed by the description: any may be compared
        untyped = tuple(param_types) + (0,) * max(0, _PARAMETERS_CHECKED - len(param_types))
        return analyse(ast, untyped, None, self.indexes.indexed_relations, self.generation(),
                       lambda _literal: None) is not None

    def learn(self, sql: str, param_types: Sequence[int], ast: exp.Expr, statement: PreparedStatement,
              fingerprint: Hashable) -> PreparedStatement:
        """The statement as a FastStatement if an index can answer it; remembers its shape. `statement`: planned by
        headrace (DuckDB), or described by the PostgreSQL serving store (`store_reads`: its relations)."""
        columns = statement.description.columns
        if columns is None:
            return statement
        on_store = bool(statement.store_reads)
        if on_store:
            if any(column.type_oid not in STORE_EXACT_TYPES for column in columns):
                return statement
            # headrace decodes the parameters (the index compares Python values); PostgreSQL gets them re-encoded
            # when it answers instead (Coordinator.run_on_store)
            description = StatementDescription(statement.description.param_types, columns)
        elif statement.plan is None or statement.plan.session_inputs or statement.plan.reads_system_catalog:
            return statement
        else:
            description = statement.description
        normalized = normalize_literals(sql)
        literal_texts: list[str] = list(normalized[1]) if normalized else []
        used: set[int] = set()

        def literal_slot(node: exp.Literal) -> int | None:
            if normalized is None:
                return None
            written = node.name if not node.is_string else "'" + node.name.replace("'", "''") + "'"
            matches = [i for i, text in enumerate(literal_texts) if text == written]
            if len(matches) != 1:
                return None
            used.add(matches[0])
            return matches[0]

        fast = analyse(ast, description.param_types, columns, self.indexes.indexed_relations, self.generation(),
                       literal_slot)
        if fast is None:
            return statement
        values = tuple(literal_value(text) if i in used else None for i, text in enumerate(literal_texts))
        result = FastStatement(sql, statement.ast, description, statement.plan, store_reads=statement.store_reads,
                               fast=fast, literals=values, exact=True)
        if normalized is not None:
            fixed = tuple((i, text) for i, text in enumerate(literal_texts) if i not in used)
            self._shapes[(normalized[0], tuple(param_types), fingerprint)] = _Shape(frozenset(used), fixed, result)
            while len(self._shapes) > _CACHE_CAPACITY:
                self._shapes.pop(next(iter(self._shapes)))
        return result

    # -- execute ---------------------------------------------------------------------------------
    async def execute(self, coordinator: Coordinator, session: Session, portal: Portal, max_rows: int,
                      cancel: asyncio.Event) -> ExecuteResponse:
        return await execute(self, coordinator, session, portal, max_rows, cancel)

    async def answer(self, statement: FastStatement, params: Sequence[Any]) -> list[Row] | None:
        """The rows, or None when DuckDB must answer (index gone, or a value not reproducible)."""
        fast = statement.fast
        assert fast is not None
        arrangement: Arrangement | None = self.indexes.arrangements.get(fast.index_id)
        if arrangement is None:
            arrangement = await self.indexes.arrangement(fast.index_id)  # first use after a restart
        if arrangement is None or arrangement.closed:  # the index or its relation is gone: DuckDB says so
            return None
        # nothing committed since the last catch-up: no await at all (the common case under load)
        by_key = arrangement.rows if arrangement.is_current else await arrangement.current()
        return self._lookup(statement, fast, by_key, params)

    def answer_now(self, statement: FastStatement, params: Sequence[Any]) -> list[Row] | None:
        """The rows if the index is loaded and current (no await needed), else None (then answer())."""
        fast = statement.fast
        assert fast is not None
        arrangement = self.indexes.arrangements.get(fast.index_id)
        if arrangement is None or arrangement.closed or not arrangement.is_current:
            return None
        return self._lookup(statement, fast, arrangement.rows, params)

    def _lookup(self, statement: FastStatement, fast: FastPlan, by_key: dict[Any, list[Row]],
                params: Sequence[Any]) -> list[Row] | None:
        try:
            literals = statement.literals
            key = tuple([source.value(params, literals) for source in fast.key])
            if None in key:
                return []
            rows = by_key.get(key, ())
            if fast.residual:  # computed even without rows: a value that fails to cast declines
                residual = [(position, source.value(params, literals)) for position, source in fast.residual]
                result: list[Row] = [project(fast, row) for row in rows
                                     if all(row[position] == value and value is not None
                                            for position, value in residual)]
            else:
                result = [project(fast, row) for row in rows]
        except Declined:
            self.declined += 1
            return None
        self.answered += 1
        return result


async def execute(fast_path: FastPath, coordinator: Coordinator, session: Session, portal: Portal, max_rows: int,
                  cancel: asyncio.Event) -> ExecuteResponse:
    """Execute a FastStatement's portal: from the index, else (declined) in DuckDB."""
    statement = portal.statement
    assert isinstance(statement, FastStatement)
    description = statement.description.columns
    assert description is not None
    if statement.store_reads and session.in_block:  # PostgreSQL's snapshot, as the transaction's isolation says
        return await coordinator.run_on_store(session, portal, max_rows, cancel)
    rows = await fast_path.answer(statement, portal.params)
    if rows is not None:
        return next_rows(portal, description, rows, max_rows)
    if statement.store_reads:
        return await coordinator.run_on_store(session, portal, max_rows, cancel)
    plan = statement.plan
    if not statement.exact or plan is None:  # the cached plan holds another text's literals: plan this one
        plan = plan_select(parse_statement(statement.sql), coordinator._relation_exists, ())
    params = session_parameters(plan, portal.params, session)
    columns, found, _ = await coordinator._run_cancellable(cancel, plan, params)
    return next_rows(portal, columns, found, max_rows)


def next_rows(portal: Portal, columns: tuple[Column, ...], rows: list[Row], max_rows: int) -> SendingRows:
    """The first Execute of a portal: all rows, or max_rows of them and the rest kept for the next one."""
    portal.columns = columns
    if max_rows > 0 and len(rows) > max_rows:
        portal.pending_rows = rows[max_rows:]
        portal.rows_sent += max_rows
        return SendingRows(columns, rows[:max_rows], "SELECT", suspended=True)
    portal.pending_rows = []
    portal.rows_sent += len(rows)
    portal.finished = True
    return SendingRows(columns, rows, "SELECT")


class FastPathCollector(Collector):
    """`headrace_index_lookups_total{outcome}`: point lookups an index answered, and those it declined (the
    serving store answered them), read at scrape time."""

    def __init__(self, fast_path: FastPath) -> None:
        self._fast_path = fast_path

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("headrace_index_lookups", "Point lookups by whether an index's arrangement "
                                     "answered them or declined them to the serving store.", labels=["outcome"])
        family.add_metric(["answered"], self._fast_path.answered)
        family.add_metric(["declined"], self._fast_path.declined)
        yield family
