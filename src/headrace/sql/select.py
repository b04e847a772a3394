"""Planning a SELECT: resolve names against the catalog, name the output columns as PostgreSQL
would, infer parameter types, and translate to the serving store's dialect (DuckDB)."""

from __future__ import annotations

import re

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from headrace.catalog.items import DEFAULT_DATABASE, DEFAULT_SCHEMA
from headrace.catalog.system.definitions import SCHEMA_IN_STORE, SYSTEM_DATABASE, find_system_relation
from headrace.errors import FeatureNotSupported, HeadraceError, UndefinedObject
from headrace.sql.functions import SERVER_VERSION_TEXT, FunctionTranslator, unqualify_functions
from headrace.pgwire.types import array_oid_of
from headrace.sql.types import DUCKDB_TYPE_BY_OID, OID_BY_TYPE_NAME, TEXT_OID

QUERY_TYPES = (exp.Select, exp.Union, exp.Intersect, exp.Except)

# sqlglot type -> PostgreSQL's name for it, which is also the output column name of a cast of a
# non-column expression (PostgreSQL's FigureColname).
PG_TYPE_NAMES = {
    exp.DataType.Type.INT: "int4", exp.DataType.Type.BIGINT: "int8", exp.DataType.Type.SMALLINT: "int2",
    exp.DataType.Type.TEXT: "text", exp.DataType.Type.VARCHAR: "varchar", exp.DataType.Type.BOOLEAN: "bool",
    exp.DataType.Type.DOUBLE: "float8", exp.DataType.Type.FLOAT: "float4", exp.DataType.Type.DECIMAL: "numeric",
    exp.DataType.Type.JSON: "json", exp.DataType.Type.JSONB: "jsonb", exp.DataType.Type.DATE: "date",
    exp.DataType.Type.TIMESTAMP: "timestamp", exp.DataType.Type.TIMESTAMPTZ: "timestamptz",
    exp.DataType.Type.INTERVAL: "interval", exp.DataType.Type.UUID: "uuid", exp.DataType.Type.VARBINARY: "bytea",
}

RelationResolver = Callable[[str, str], bool]  # (schema, name) -> does a relation of that name exist

# PostgreSQL's MaxTupleAttributeNumber (54011 beyond it) and the most parameters a Bind can carry (int16 count).
MAX_TARGET_LIST_ENTRIES = 1664
MAX_PARAMETER_NUMBER = 65535

# DuckDB functions that PostgreSQL does not have and that reach files, the network, settings, secrets or other SQL
# text: refused by name, as PostgreSQL refuses an unknown function (42883). The store is also locked down
# (store/serving.locked_down_config), so a name missing here still cannot read a file.
STORE_ONLY_FUNCTIONS = frozenset({
    "glob", "sniff_csv", "query", "query_table", "getvariable", "getenv", "checkpoint", "force_checkpoint",
    "which_secret", "arrow_scan", "arrow_scan_dumb", "pandas_scan", "python_map_function", "seq_scan",
    "summary", "test_all_types", "test_vector_types", "enable_logging", "disable_logging", "truncate_duckdb_logs",
    "json_execute_serialized_sql", "load_aws_credentials", "iceberg_scan", "delta_scan", "sqlite_scan",
    "postgres_scan", "postgres_query", "mysql_query", "read_xlsx", "icu_calendar_names", "repeat_row",
    "st_read", "sql_auto_complete",
})
STORE_ONLY_FUNCTION_PREFIXES = ("read_", "parquet_", "pragma_", "duckdb_", "sqlite_", "postgres_", "mysql_",
                                "iceberg_", "delta_", "json_execute")


@dataclass(frozen=True, slots=True)
class SelectPlan:
    duckdb_sql: str
    column_names: tuple[str, ...]
    param_types: tuple[int, ...]
    # Session values bound after the client's parameters, e.g. ("user", "setting:timezone")
    # (see sql/functions.py); execution appends them (store/query.session_parameters).
    session_inputs: tuple[str, ...] = ()
    # Reads pg_catalog / information_schema: the system catalog must be fresh (catalog/system).
    reads_system_catalog: bool = False
    # Parameters typed text only for want of a cast, each compared with an expression: (numbers, a DuckDB
    # query whose output columns are those expressions). Describing it gives their types, which PostgreSQL
    # would give the parameters (`k = $1` with k int4 makes $1 int4): see parameter_types_from_probe.
    param_probe: tuple[tuple[int, ...], str] | None = None
    # The user relations it reads, as (schema, name): what needs SELECT (coordinator/privileges.py).
    relations: tuple[tuple[str, str], ...] = ()


def is_query(ast: exp.Expr) -> bool:
    return isinstance(ast, QUERY_TYPES)


def plan_select(ast: exp.Expr, relation_exists: RelationResolver, declared_param_types: Sequence[int] = ()) -> SelectPlan:
    ast = ast.copy()
    unqualify_functions(ast)
    refuse_store_only_functions(ast)  # file readers, SQL-text runners (issue 20); pg_catalog.read_text(...) too
    _check_target_lists(ast)
    relations: list[tuple[str, str]] = []
    reads_system_catalog = _resolve_relations(ast, relation_exists, relations)
    names = _output_names(ast)
    param_types = _param_types(ast, declared_param_types)
    _type_parameters(ast, param_types, declared_param_types)
    translator = FunctionTranslator(len(param_types) + 1, _is_known_setting, SERVER_VERSION_TEXT.format(version=_version()))
    translator.translate(ast)
    _use_store_functions(ast)
    untyped = _untyped_parameters(ast, param_types, declared_param_types)
    _check_unicode_escapes(ast)
    return SelectPlan(duckdb_sql=ast.sql(dialect="duckdb"), column_names=tuple(names), param_types=param_types,
                      session_inputs=tuple(translator.session_inputs),
                      reads_system_catalog=reads_system_catalog or translator.reads_system_catalog,
                      relations=tuple(dict.fromkeys(relations)), param_probe=_parameter_probe(ast, untyped) if untyped and not translator.session_inputs else None)


_UNICODE_ESCAPE = re.compile(r"\\(\\|[0-9A-Fa-f]{4}|\+[0-9A-Fa-f]{6})")


def _check_unicode_escapes(ast: exp.Expr) -> None:
    """U&'...' literals as PostgreSQL reads them: a surrogate must be half of a pair (42601 "invalid Unicode
    surrogate pair"), and no escape may be NUL or beyond U+10FFFF (42601 "invalid Unicode escape value")."""
    for literal in ast.find_all(exp.UnicodeString):
        pending_high = False
        for match in _UNICODE_ESCAPE.finditer(literal.name):
            if match.group(1) == "\\":
                continue
            code = int(match.group(1).lstrip("+"), 16)
            if code == 0 or code > 0x10FFFF:
                raise HeadraceError("invalid Unicode escape value", sqlstate="42601")
            if pending_high != (0xDC00 <= code <= 0xDFFF):
                raise HeadraceError("invalid Unicode surrogate pair", sqlstate="42601")
            pending_high = 0xD800 <= code <= 0xDBFF
        if pending_high:
            raise HeadraceError("invalid Unicode surrogate pair", sqlstate="42601")


def _check_target_lists(ast: exp.Expr) -> None:
    for select in ast.find_all(exp.Select):
        if len(select.expressions) > MAX_TARGET_LIST_ENTRIES:
            raise HeadraceError(f"target lists can have at most {MAX_TARGET_LIST_ENTRIES} entries", sqlstate="54011")


def refuse_store_only_functions(ast: exp.Expr) -> None:
    """42883 for a call of one of DuckDB's own file, settings or SQL-text functions (STORE_ONLY_FUNCTIONS), with
    PostgreSQL's message and hint for a function that does not exist."""
    for function in ast.find_all(exp.Func):
        name = (function.name if isinstance(function, exp.Anonymous) else function.sql_name()).lower()
        if name in STORE_ONLY_FUNCTIONS or name.startswith(STORE_ONLY_FUNCTION_PREFIXES):
            arguments = list(function.expressions)
            if not isinstance(function, exp.Anonymous) and isinstance(function.this, exp.Expr):
                arguments.insert(0, function.this)  # sqlglot's ReadCSV, ReadParquet: the first argument apart
            shown = ", ".join(_argument_type_name(argument) for argument in arguments)
            raise HeadraceError(f"function {name}({shown}) does not exist", sqlstate="42883",
                                hint="No function matches the given name and argument types. You might need to "
                                     "add explicit type casts.")


def _argument_type_name(argument: exp.Expr) -> str:
    """The type PostgreSQL names for an argument in "function f(...) does not exist", for literals and casts."""
    if isinstance(argument, exp.Literal):
        if argument.is_string:
            return "unknown"
        return "integer" if argument.name.lstrip("-").isdigit() else "numeric"
    if isinstance(argument, exp.Boolean):
        return "boolean"
    if isinstance(argument, exp.Cast):
        return PG_TYPE_NAMES.get(argument.to.this, argument.to.sql(dialect="postgres").lower())
    return "unknown"


def _untyped_parameters(ast: exp.Expr, param_types: Sequence[int], declared: Sequence[int]) -> set[int]:
    """Parameters that are text only because nothing said otherwise (not declared, never cast)."""
    cast = {_parameter_number(node) for node in ast.find_all(exp.Placeholder, exp.Parameter)
            if isinstance(node.parent, exp.Cast)}
    return {number for number in range(1, len(param_types) + 1)
            if param_types[number - 1] == TEXT_OID and number not in cast
            and not (number <= len(declared) and declared[number - 1])}


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Add, exp.Sub, exp.Mul, exp.Div)


def _parameter_probe(ast: exp.Expr, untyped: set[int]) -> tuple[tuple[int, ...], str] | None:
    """For each untyped parameter of the top-level SELECT that meets a parameter-free expression in a
    comparison or arithmetic (`expr op $n`, `expr IN (.., $n, ..)`, `expr BETWEEN $n AND ..`): a query over
    the same FROM whose output columns are those expressions."""
    if not isinstance(ast, exp.Select) or (ast.args.get("from_") or ast.args.get("from")) is None:
        return None
    partners: dict[int, exp.Expr] = {}
    for node in ast.find_all(exp.Placeholder, exp.Parameter):
        number = _parameter_number(node)
        if number not in untyped or number in partners or node.find_ancestor(exp.Select) is not ast:
            continue
        parent = node.parent
        partner: exp.Expr | None = None
        if isinstance(parent, _COMPARISONS):
            partner = parent.left if parent.right is node else parent.right
        elif isinstance(parent, (exp.In, exp.Between)) and parent.this is not node:
            partner = parent.this
        if partner is not None and not any(True for _ in partner.find_all(exp.Placeholder, exp.Parameter)):
            partners[number] = partner
    if not partners:
        return None
    probe = exp.Select(expressions=[partner.copy() for partner in partners.values()])
    for part in ("with", "with_", "from", "from_", "joins"):  # sqlglot names some keys with a trailing _
        if ast.args.get(part) is not None:
            value = ast.args[part]
            probe.set(part, [item.copy() for item in value] if isinstance(value, list) else value.copy())
    return tuple(partners), probe.limit(0).sql(dialect="duckdb")


def parameter_types_from_probe(plan: SelectPlan, declared: Sequence[int], probe_types: Sequence[str],
                               oid_of_duckdb_type: Callable[[str], int]) -> tuple[int, ...]:
    """Parameter types to plan again with: the client's declared ones (0 = unspecified), plus each probed
    parameter's partner expression type (DuckDB type names of the probe's output columns, in order)."""
    assert plan.param_probe is not None
    types = [declared[i] if i < len(declared) else 0 for i in range(len(plan.param_types))]
    for number, type_name in zip(plan.param_probe[0], probe_types, strict=True):
        types[number - 1] = oid_of_duckdb_type(type_name)
    return tuple(types)


def _is_known_setting(name: str) -> bool:
    from headrace.store.query import session_setting_names  # the session's variables

    return name in session_setting_names()


def _version() -> str:
    from headrace import __version__

    return __version__


def _resolve_relations(ast: exp.Expr, relation_exists: RelationResolver,
                       relations: list[tuple[str, str]] | None = None) -> bool:
    """Check every relation exists; map pg_catalog / information_schema relations onto headrace's
    system catalog; add each other relation to `relations`. Answers whether it reads the system catalog."""
    cte_names = {cte.alias_or_name for cte in ast.find_all(exp.CTE)}
    reads_system_catalog = False
    for table in list(ast.find_all(exp.Table)):
        if not table.name or isinstance(table.this, exp.Func):
            continue  # a table function such as generate_series(...)
        name, schema, database = table.name, table.db or DEFAULT_SCHEMA, table.catalog or DEFAULT_DATABASE
        if not table.db and not table.catalog and name in cte_names:
            continue
        if database != DEFAULT_DATABASE:
            raise FeatureNotSupported(f'cross-database references are not implemented: "{database}.{schema}.{name}"')
        if table.db in SCHEMA_IN_STORE or not table.db:
            system_relation = find_system_relation(table.db or None, name)
            if system_relation is not None:
                table.set("catalog", exp.to_identifier(SYSTEM_DATABASE))
                table.set("db", exp.to_identifier(SCHEMA_IN_STORE[system_relation.schema]))
                table.set("this", exp.to_identifier(system_relation.name, quoted=True))
                reads_system_catalog = True
                continue
            if table.db in SCHEMA_IN_STORE:
                raise UndefinedObject(f'relation "{table.db}.{name}" does not exist')
        if not relation_exists(schema, name):
            shown = f"{table.db}.{name}" if table.db else name
            raise UndefinedObject(f'relation "{shown}" does not exist')
        if relations is not None:
            relations.append((schema, name))
        # the serving store holds one database: drop the database qualifier
        table.set("catalog", None)
    if reads_system_catalog:
        # pg_catalog.pg_class.relname -> pg_class.relname (the relation's own name stays its alias)
        for column in ast.find_all(exp.Column):
            if column.args.get("db") is not None and column.db in SCHEMA_IN_STORE:
                column.set("db", None)
                column.set("catalog", None)
    return reads_system_catalog


def _output_names(ast: exp.Expr) -> list[str]:
    if not isinstance(ast, exp.Select):
        left = ast.this if isinstance(ast, (exp.Union, exp.Intersect, exp.Except)) else ast
        return _output_names(left) if left is not ast else []
    names: list[str] = []
    for index, projection in enumerate(ast.expressions):
        if isinstance(projection, exp.Star) or (isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)):
            return []  # filled in from the store's own names (a * expands to real columns)
        name = projection.alias if isinstance(projection, exp.Alias) else _figure_column_name(projection)
        # Alias every output so the store's names match PostgreSQL's.
        if not isinstance(projection, exp.Alias):
            projection.replace(exp.alias_(projection.copy(), name, quoted=True))
        names.append(name)
    return names


def _figure_column_name(node: exp.Expr) -> str:
    """PostgreSQL's FigureColname for the common cases."""
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Cast):
        inner = _figure_column_name(node.this)
        if inner != "?column?":
            return inner
        return PG_TYPE_NAMES.get(node.to.this, node.to.sql(dialect="postgres").lower())
    if isinstance(node, exp.Paren):
        return _figure_column_name(node.this)
    if isinstance(node, exp.Count):
        return "count"
    if isinstance(node, exp.CurrentTimestamp):
        return "now"
    if isinstance(node, exp.CurrentVersion):
        return "version"
    if isinstance(node, exp.Array):
        return "array"
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func) and not isinstance(node, (exp.Binary, exp.JSONExtract, exp.JSONExtractScalar)):
        return node.sql_name().lower()
    if isinstance(node, exp.Boolean):
        return "bool"
    return "?column?"


def _param_types(ast: exp.Expr, declared: Sequence[int]) -> tuple[int, ...]:
    """Parameter types: those the client declared, else inferred from a cast around the parameter,
    else text (the store coerces text where the context needs another type, like PostgreSQL's unknown)."""
    inferred: dict[int, int] = {}
    for node in ast.find_all(exp.Placeholder, exp.Parameter):
        number = _parameter_number(node)
        if number is None:
            continue
        if not 1 <= number <= MAX_PARAMETER_NUMBER:
            raise HeadraceError(f"there is no parameter ${number}", sqlstate="42P02")
        parent = node.parent
        oid = TEXT_OID
        if isinstance(parent, exp.Cast):
            oid = _oid_of_type(parent.to) or TEXT_OID
        elif isinstance(parent, (exp.Limit, exp.Offset)):
            oid = OID_BY_TYPE_NAME["int8"]
        inferred.setdefault(number, oid)
    count = max([*inferred.keys(), len(declared)], default=0)
    types = []
    for number in range(1, count + 1):
        declared_oid = declared[number - 1] if number <= len(declared) else 0
        types.append(declared_oid or inferred.get(number, TEXT_OID))
    return tuple(types)


def _oid_of_type(data_type: exp.Expr) -> int | None:
    """The PostgreSQL OID of a cast's target type (int4, int8[], oid, oid[], ...), if known."""
    if isinstance(data_type, exp.ObjectIdentifier):
        return OID_BY_TYPE_NAME.get(data_type.name.lower())
    if not isinstance(data_type, exp.DataType):
        return None
    if data_type.this == exp.DataType.Type.ARRAY and data_type.expressions:
        element = _oid_of_type(data_type.expressions[0])
        return array_oid_of(element) if element else None
    if data_type.this == exp.DataType.Type.USERDEFINED:
        kind = data_type.args.get("kind")
        name = kind.name if isinstance(kind, exp.Expr) else str(kind or "")
        return OID_BY_TYPE_NAME.get(name.lower())
    return OID_BY_TYPE_NAME.get(PG_TYPE_NAMES.get(data_type.this, ""))


def _type_parameters(ast: exp.Expr, param_types: Sequence[int], declared: Sequence[int]) -> None:
    """Give the store every parameter's type where the client declared it or nothing else can
    (a bare `SELECT $1`), so Describe and Execute agree on the result types."""
    for node in list(ast.find_all(exp.Placeholder, exp.Parameter)):
        number = _parameter_number(node)
        if number is None or isinstance(node.parent, exp.Cast):
            continue
        is_declared = number <= len(declared) and declared[number - 1] != 0
        is_projection = isinstance(node.parent, (exp.Select, exp.Alias))
        duckdb_type = DUCKDB_TYPE_BY_OID.get(param_types[number - 1])
        if duckdb_type and (is_declared or is_projection):
            node.replace(exp.Cast(this=node.copy(), to=exp.DataType.build(duckdb_type, dialect="duckdb")))


def _use_store_functions(ast: exp.Expr) -> None:
    # DuckDB reads a bare CURRENT_TIMESTAMP as a reference to a same-named output column.
    for node in list(ast.find_all(exp.CurrentTimestamp)):
        node.replace(exp.Anonymous(this="now", expressions=[]))


def _parameter_number(node: exp.Expr) -> int | None:
    text = node.name if isinstance(node, exp.Placeholder) else node.this.name if isinstance(node.this, exp.Expr) else str(node.this)
    text = str(text).lstrip("$")
    return int(text) if text.isdigit() else None
