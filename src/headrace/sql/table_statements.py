"""Tables in SQL: CREATE TABLE into a catalog Table, and the parts of INSERT / UPDATE / DELETE the coordinator
needs (target, columns, value rows, SET list, WHERE, RETURNING), from sqlglot's PostgreSQL ASTs.

sqlglot parses these statements already (exp.Create kind TABLE, exp.Insert, exp.Update, exp.Delete, exp.Drop
kind TABLE); this module only reads them and refuses, with 0A000, what headrace does not do."""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from headrace.catalog.items import DEFAULT_DATABASE, DEFAULT_SCHEMA
from headrace.catalog.tables import COLUMN_TYPES, HIDDEN_ROW_ID, HIDDEN_VERSION, TYPE_ALIASES, Table, TableColumn
from headrace.errors import DuplicateObject, FeatureNotSupported, HeadraceError, SyntaxError_, UndefinedColumn
from headrace.store.table_types import MAX_NUMERIC_PRECISION

# sqlglot's parsed type -> PostgreSQL's canonical name
_SQLGLOT_TYPES = {
    exp.DataType.Type.SMALLINT: "int2", exp.DataType.Type.INT: "int4", exp.DataType.Type.BIGINT: "int8",
    exp.DataType.Type.FLOAT: "float4", exp.DataType.Type.DOUBLE: "float8", exp.DataType.Type.TEXT: "text",
    exp.DataType.Type.VARCHAR: "varchar", exp.DataType.Type.CHAR: "bpchar", exp.DataType.Type.NCHAR: "bpchar",
    exp.DataType.Type.BOOLEAN: "bool", exp.DataType.Type.TIMESTAMPTZ: "timestamptz", exp.DataType.Type.JSON: "json",
    exp.DataType.Type.JSONB: "jsonb", exp.DataType.Type.VARBINARY: "bytea", exp.DataType.Type.DECIMAL: "numeric",
    exp.DataType.Type.DATE: "date", exp.DataType.Type.TIMESTAMP: "timestamp", exp.DataType.Type.UUID: "uuid",
    exp.DataType.Type.INTERVAL: "interval",
}
INVALID_TABLE_DEFINITION = "42P16"


def is_create_table(ast: exp.Expr) -> bool:
    return isinstance(ast, exp.Create) and str(ast.args.get("kind") or "").upper() == "TABLE"


def is_drop_table(ast: exp.Expr) -> bool:
    return isinstance(ast, exp.Drop) and str(ast.args.get("kind") or "").upper() == "TABLE" \
        and not ast.args.get("materialized")


def is_write(ast: exp.Expr) -> bool:
    return isinstance(ast, (exp.Insert, exp.Update, exp.Delete, exp.TruncateTable))


def truncate_as_delete(ast: exp.TruncateTable) -> exp.Delete:
    """TRUNCATE [TABLE] [ONLY] t [RESTART | CONTINUE IDENTITY] [CASCADE | RESTRICT] of a headrace table: a DELETE of
    all its rows through its log, so views over it follow (a table has no identity column, nor foreign keys)."""
    tables = ast.expressions
    if len(tables) != 1 or not isinstance(tables[0], exp.Table):
        raise FeatureNotSupported("TRUNCATE of several tables at once is not supported; truncate them one by one")
    return exp.Delete(this=tables[0].copy())


def table_name(table: exp.Expr) -> tuple[str, str]:
    """(schema, name) of a table reference; only the default database exists."""
    if not isinstance(table, exp.Table):
        raise FeatureNotSupported("expected a table name")
    database = table.catalog or DEFAULT_DATABASE
    if database != DEFAULT_DATABASE:
        raise FeatureNotSupported(f'cross-database references are not implemented: "{database}"')
    return table.db or DEFAULT_SCHEMA, table.name


def table_from_create(item_id: str, ast: exp.Create, sql: str) -> Table:
    """The Table a CREATE TABLE statement defines (42P16 for a bad definition, 0A000 for what is not supported)."""
    schema_node = ast.this
    if not isinstance(schema_node, exp.Schema) or ast.args.get("expression") is not None:
        raise FeatureNotSupported("CREATE TABLE ... AS is not supported; create the table, then INSERT ... SELECT")
    if ast.args.get("replace") or ast.args.get("properties") and any(
            isinstance(p, exp.TemporaryProperty) for p in ast.args["properties"].expressions):
        raise FeatureNotSupported("only plain CREATE TABLE is supported (no OR REPLACE, no TEMPORARY)")
    properties = ast.args.get("properties")
    if properties is not None and properties.expressions:
        # PARTITION BY, INHERITS, WITH (storage options), UNLOGGED, TABLESPACE, USING: a table headrace's log
        # cannot keep (PARTITION OF has no column list: refused above)
        shown = " ".join(p.sql(dialect="postgres") for p in properties.expressions)
        raise FeatureNotSupported(f"CREATE TABLE ... {shown} is not supported", hint="tables take columns, NOT NULL, "
                                  "DEFAULT and PRIMARY KEY")
    schema, name = table_name(schema_node.this)
    columns: list[TableColumn] = []
    primary_key: tuple[str, ...] = ()
    for node in schema_node.expressions:
        if isinstance(node, exp.ColumnDef):
            column, is_key = _column(node)
            if any(c.name == column.name for c in columns):
                raise DuplicateObject(f'column "{column.name}" specified more than once', sqlstate="42701")
            columns.append(column)
            if is_key:
                if primary_key:
                    raise HeadraceError(f'multiple primary keys for table "{name}" are not allowed',
                                        sqlstate=INVALID_TABLE_DEFINITION)
                primary_key = (column.name,)
        elif isinstance(node, exp.PrimaryKey):
            if primary_key:
                raise HeadraceError(f'multiple primary keys for table "{name}" are not allowed',
                                    sqlstate=INVALID_TABLE_DEFINITION)
            primary_key = tuple(_identifier(part) for part in node.expressions)
        else:
            raise FeatureNotSupported(f"table constraint {node.sql(dialect='postgres')} is not supported",
                                      hint="tables take columns, NOT NULL and PRIMARY KEY")
    if not columns:
        raise FeatureNotSupported("a table needs at least one column")
    names = {c.name for c in columns}
    for key in primary_key:
        if key not in names:
            raise UndefinedColumn(f'column "{key}" named in key does not exist')
    if len(set(primary_key)) != len(primary_key):
        raise DuplicateObject("a column appears twice in the primary key", sqlstate="42701")
    for reserved in (HIDDEN_ROW_ID, HIDDEN_VERSION):
        if reserved in names:
            raise FeatureNotSupported(f'column name "{reserved}" is reserved')
    return Table(id=item_id, name=name, schema=schema, columns=tuple(columns), primary_key=primary_key,
                 create_sql=sql.strip().rstrip(";").strip())


def table_from_create_sql(item_id: str, sql: str) -> Table:
    from headrace.sql.parser import parse_statement

    ast = parse_statement(sql)
    if not is_create_table(ast):
        raise SyntaxError_(f"not a CREATE TABLE statement: {sql[:60]}")
    assert isinstance(ast, exp.Create)
    return table_from_create(item_id, ast, sql)


def _identifier(node: exp.Expr) -> str:
    return node.name if isinstance(node, (exp.Identifier, exp.Column)) else str(node)


def _column(node: exp.ColumnDef) -> tuple[TableColumn, bool]:
    name = node.name
    kind = node.args.get("kind")
    if not isinstance(kind, exp.DataType):
        raise SyntaxError_(f'column "{name}" needs a type')
    pg_type = _pg_type(kind, name)
    max_length = None
    if pg_type in ("varchar", "bpchar") and kind.expressions:
        max_length = int(kind.expressions[0].name)
    elif pg_type == "bpchar":
        max_length = 1  # char without a length is char(1)
    precision, scale = _numeric_shape(kind, name) if pg_type == "numeric" else (None, None)
    if pg_type in ("timestamp", "timestamptz") and kind.expressions:  # timestamp(p): p fractional digits kept
        precision = int(kind.expressions[0].name)
        if not 0 <= precision <= 6:
            raise HeadraceError(f"{pg_type.upper()}({precision}) precision must be between 0 and 6",
                                sqlstate="22023")
    not_null, is_key, default = False, False, None
    for constraint in node.args.get("constraints") or []:
        inner = constraint.args.get("kind") if isinstance(constraint, exp.ColumnConstraint) else constraint
        if isinstance(inner, exp.NotNullColumnConstraint):
            not_null = not inner.args.get("allow_null")
        elif isinstance(inner, exp.PrimaryKeyColumnConstraint):
            is_key = True
        elif isinstance(inner, exp.DefaultColumnConstraint) and isinstance(inner.this, exp.Expr):
            default = inner.this.sql(dialect="postgres")
        else:
            shown = inner.sql(dialect="postgres") if isinstance(inner, exp.Expr) else str(inner)
            raise FeatureNotSupported(f'column constraint {shown} of "{name}" is not supported',
                                      hint="tables take NOT NULL, DEFAULT and PRIMARY KEY (UNIQUE, CHECK come later)")
    column = TableColumn(name=name, pg_type=pg_type, not_null=not_null or is_key, max_length=max_length,
                         precision=precision, scale=scale, default=default)
    if default is not None:
        from headrace.coordinator.table_defaults import check_default

        check_default(column)  # a default that is not a constant / now() / gen_random_uuid(), or does not fit
    return column, is_key


def _numeric_shape(kind: exp.DataType, column: str) -> tuple[int | None, int | None]:
    """numeric(p,s) / numeric(p) / numeric: DuckDB's DECIMAL holds at most 38 digits, so a wider numeric is
    refused rather than rounded."""
    if not kind.expressions:
        return None, None
    try:
        numbers = [int(part.name) for part in kind.expressions]
    except ValueError:
        raise SyntaxError_(f'bad numeric type modifier of column "{column}"') from None
    precision, scale = numbers[0], numbers[1] if len(numbers) > 1 else 0
    if not 1 <= precision <= 1000:
        raise HeadraceError(f"NUMERIC precision {precision} must be between 1 and 1000", sqlstate="22023")
    if not 0 <= scale <= precision:
        raise FeatureNotSupported(f'numeric({precision},{scale}) of column "{column}": a scale outside 0..precision '
                                  "is not supported")
    if precision > MAX_NUMERIC_PRECISION:
        raise FeatureNotSupported(f'numeric({precision},{scale}) of column "{column}" is wider than the serving store '
                                  f"holds exactly", hint=f"use numeric(p,s) with p <= {MAX_NUMERIC_PRECISION}")
    return precision, scale


def _pg_type(kind: exp.DataType, column: str) -> str:
    if kind.this == exp.DataType.Type.USERDEFINED:
        written = str(kind.args.get("kind") or kind.sql(dialect="postgres")).lower()
        pg_type = TYPE_ALIASES.get(written, written)
    else:
        pg_type = _SQLGLOT_TYPES.get(kind.this, "")
    if pg_type not in COLUMN_TYPES:
        shown = kind.sql(dialect="postgres").lower()
        raise FeatureNotSupported(f'type {shown} of column "{column}" is not supported in tables yet',
                                  hint="supported: " + ", ".join(sorted(COLUMN_TYPES)))
    return pg_type


# ---------------------------------------------------------------------------------------------- writes

@dataclass(frozen=True)
class WriteTarget:
    schema: str
    name: str
    alias: str | None


def write_target(ast: exp.Expr) -> WriteTarget:
    if isinstance(ast, exp.TruncateTable):
        ast = truncate_as_delete(ast)
    node = ast.this
    if isinstance(node, exp.Schema):  # INSERT INTO t (a, b)
        node = node.this
    if not isinstance(node, exp.Table):
        raise FeatureNotSupported("the target of a write must be a table name")
    schema, name = table_name(node)
    alias = node.alias or None
    return WriteTarget(schema, name, alias)


def insert_columns(ast: exp.Insert, table: Table) -> list[str]:
    """The target columns of an INSERT: those listed, or every column in order."""
    if isinstance(ast.this, exp.Schema) and ast.this.expressions:
        names = [_identifier(node) for node in ast.this.expressions]
        for name in names:
            if table.column(name) is None:
                raise UndefinedColumn(f'column "{name}" of relation "{table.name}" does not exist')
        if len(set(names)) != len(names):
            raise SyntaxError_("a column is named more than once in the INSERT column list", sqlstate="42701")
        return names
    return table.column_names()


def other_relations(ast: exp.Expr) -> list[exp.Expr]:
    """UPDATE ... FROM's and DELETE ... USING's relations (copies), joined to the target as PostgreSQL joins them."""
    found = ast.args.get("from_") or ast.args.get("from")
    items = [found.this] if isinstance(found, exp.From) else []
    items += list(ast.args.get("using") or [])
    return [item.copy() for item in items if isinstance(item, exp.Expr)]


def refuse_unsupported(ast: exp.Expr, joins_allowed: bool = False) -> None:
    """0A000 for what headrace's writes do not do; `joins_allowed`: UPDATE ... FROM / DELETE ... USING, which the
    PostgreSQL serving store runs (coordinator/table_writes_postgres.py)."""
    if isinstance(ast, exp.Insert) and ast.args.get("overwrite"):
        raise FeatureNotSupported("INSERT OVERWRITE is not supported")
    if isinstance(ast, (exp.Update, exp.Delete)) and not joins_allowed and other_relations(ast):
        raise FeatureNotSupported(f"{ast.key.upper()} ... FROM / USING is not supported yet; use a subquery in WHERE")
    if ast.args.get("with_") or ast.args.get("with"):
        raise FeatureNotSupported("WITH before INSERT / UPDATE / DELETE is not supported yet")


def returning_columns(ast: exp.Expr, table: Table) -> list[str] | None:
    """RETURNING * or RETURNING col, ...: the columns (None without RETURNING). Expressions are refused."""
    returning = ast.args.get("returning")
    if returning is None:
        return None
    names: list[str] = []
    for node in returning.expressions:
        if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
            names.extend(table.column_names())
        elif isinstance(node, exp.Column):
            if table.column(node.name) is None:
                raise UndefinedColumn(f'column "{node.name}" does not exist')
            names.append(node.name)
        else:
            raise FeatureNotSupported("RETURNING takes * or column names")
    return names


def assignments(nodes: list[exp.Expr], clause: str) -> list[tuple[exp.Column, exp.Expr]]:
    """A SET list as (column, expression) pairs, PostgreSQL's multiple-column items expanded: `(a, b) = (1, b + 1)`
    and `(a, b) = ROW(...)` item by item, `(a, b) = (SELECT x, y ...)` as one scalar subquery per column over the
    sub-SELECT (its columns renamed hr_c<i>), which PostgreSQL evaluates alike: 21000 for more than one row, NULLs
    for none. `clause` names the clause in the 0A000 for anything else ("UPDATE ... SET")."""
    pairs: list[tuple[exp.Column, exp.Expr]] = []
    for node in nodes:
        if isinstance(node, exp.EQ) and isinstance(node.this, exp.Column):
            pairs.append((node.this, node.expression))
            continue
        if not (isinstance(node, exp.EQ) and isinstance(node.this, exp.Tuple)
                and all(isinstance(c, exp.Column) for c in node.this.expressions)):
            raise FeatureNotSupported(f"{clause} takes column = expression or (column, ...) = (expression, ...)")
        columns = [c for c in node.this.expressions if isinstance(c, exp.Column)]
        source = node.expression
        if isinstance(source, exp.Anonymous) and source.name.upper() == "ROW":
            source = exp.Tuple(expressions=[e.copy() for e in source.expressions])
        if isinstance(source, exp.Paren) and len(columns) == 1:
            source = exp.Tuple(expressions=[source.this.copy()])
        if isinstance(source, exp.Tuple):
            values = list(source.expressions)
            if len(values) != len(columns) or any(isinstance(v, exp.Star) or isinstance(v, exp.Column) and
                                                  isinstance(v.this, exp.Star) for v in values):
                if any(isinstance(v, exp.Column) and isinstance(v.this, exp.Star) for v in values):
                    raise FeatureNotSupported(f"{clause} (column, ...) = ROW(t.*) is not supported")
                raise SyntaxError_("number of columns does not match number of values")
            pairs.extend(zip(columns, values))
            continue
        if isinstance(source, exp.Subquery) and isinstance(source.this, exp.Query):
            query = source.this
            width = len(query.selects) if not any(isinstance(s, exp.Star) for s in query.selects) else None
            if width is not None and width != len(columns):
                raise SyntaxError_("number of columns does not match number of values")
            names = [exp.to_identifier(f"hr_c{i}") for i in range(len(columns))]
            for i, column in enumerate(columns):
                derived = exp.Subquery(this=query.copy(), alias=exp.TableAlias(
                    this=exp.to_identifier("hr_r"), columns=[n.copy() for n in names]))
                pick = exp.select(exp.column(names[i].name, table="hr_r")).from_(derived)
                pairs.append((column, exp.Subquery(this=pick)))
            continue
        raise HeadraceError("source for a multiple-column UPDATE item must be a sub-SELECT or ROW() expression",
                            sqlstate="0A000")
    return pairs
