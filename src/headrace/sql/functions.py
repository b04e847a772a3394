"""PostgreSQL's built-in functions, operators and casts that clients' catalog queries use,
translated for the serving store (DuckDB) over headrace's system catalogs (catalog/system).

Session-dependent values (current_user, current_setting('x'), pg_backend_pid(), ...) become extra
parameters after the client's own: the plan lists them as `session_inputs`, and they are bound at
execution time from the session (store/query.session_parameters), so a prepared statement stays
right after a SET."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from headrace.catalog.system.definitions import MACRO_SCHEMA
from headrace.errors import DataError, HeadraceError
from headrace.pgwire.types.arrays import split_array_literal

SERVER_VERSION_TEXT = "PostgreSQL 15.0 (headrace {version}) on x86_64-pc-linux-gnu, compiled by Python, 64-bit"

# PostgreSQL function -> (macro, number of arguments it takes; extra arguments are dropped)
MACRO_FUNCTIONS: dict[str, tuple[str, int]] = {
    "format_type": ("hr_format_type", 2),
    "pg_get_userbyid": ("hr_get_userbyid", 1),
    "pg_get_indexdef": ("hr_get_definition", 3),
    "pg_get_constraintdef": ("hr_get_definition", 3),
    "pg_get_viewdef": ("hr_get_definition", 3),
    "pg_encoding_to_char": ("hr_encoding_to_char", 1),
    "pg_size_pretty": ("hr_size_pretty", 1),
    "quote_ident": ("hr_quote_ident", 1),
    "to_regclass": ("hr_to_regclass", 1),
    "to_regtype": ("hr_to_regtype", 1),
    "array_upper": ("hr_array_upper", 2),
    "array_lower": ("hr_array_lower", 2),
}

# Functions whose answer is a constant for headrace (no comments, no expressions, no privileges to
# check for a superuser, no recovery, ...).
_TRUE = exp.true
_FALSE = exp.false


def _null() -> exp.Expr:
    return exp.null()


CONSTANT_FUNCTIONS: dict[str, Callable[[], exp.Expr]] = {
    **{name: _TRUE for name in (
        "pg_table_is_visible", "pg_type_is_visible", "pg_function_is_visible", "pg_has_role",
        "has_function_privilege", "has_sequence_privilege", "has_type_privilege",
        "has_language_privilege", "has_tablespace_privilege", "has_foreign_data_wrapper_privilege",
        "has_server_privilege", "pg_collation_is_visible", "pg_conversion_is_visible", "pg_opclass_is_visible",
        "pg_operator_is_visible", "pg_ts_config_is_visible")},
    **{name: _FALSE for name in ("pg_is_in_recovery", "pg_relation_is_publishable", "pg_is_other_temp_schema")},
    **{name: _null for name in (
        "obj_description", "col_description", "shobj_description", "pg_get_expr", "pg_get_ruledef",
        "pg_get_triggerdef", "pg_get_functiondef", "pg_get_function_result", "pg_get_function_arguments",
        "pg_get_function_identity_arguments", "pg_get_statisticsobjdef_columns", "pg_get_partkeydef",
        "pg_get_serial_sequence", "inet_server_addr", "inet_client_addr", "inet_server_port",
        "inet_client_port", "pg_get_function_sqlbody")},
    **{name: (lambda: exp.Literal.number(0)) for name in (
        "pg_table_size", "pg_total_relation_size", "pg_relation_size", "pg_indexes_size", "pg_database_size",
        "pg_stat_get_numscans", "pg_stat_get_tuples_returned", "pg_stat_get_tuples_fetched",
        "pg_stat_get_live_tuples", "pg_stat_get_dead_tuples")},
    "txid_current": lambda: exp.Literal.number(1),
    "pg_current_xact_id": lambda: exp.Literal.number(1),
    "pg_client_encoding": lambda: exp.Literal.string("UTF8"),
    "pg_encoding_max_length": lambda: exp.Literal.number(4),
    "pg_tablespace_location": lambda: exp.Literal.string(""),
    "current_schema": lambda: exp.Literal.string("public"),
    "pg_postmaster_start_time": lambda: exp.Anonymous(this="now", expressions=[]),
}

# has_*_privilege over headrace's ACLs: function -> (the object kind, the number of arguments without a role;
# a column argument is dropped: privileges are per relation). Answered by the hr_has_privilege macro over the
# privileges the system catalog lists (catalog/system/privilege_rows.py).
PRIVILEGE_FUNCTIONS: dict[str, tuple[str, int]] = {
    "has_table_privilege": ("relation", 2), "has_any_column_privilege": ("relation", 2),
    "has_column_privilege": ("relation", 3), "has_schema_privilege": ("schema", 2),
    "has_database_privilege": ("database", 2),
}

# Set-returning functions answered by a table macro of catalog/system/macros.py (no arguments).
TABLE_MACROS = {"pg_get_keywords": "hr_get_keywords"}

# Same function, DuckDB's name.
RENAMED_FUNCTIONS = {"json_build_object": "json_object", "jsonb_build_object": "json_object",
                     "json_build_array": "json_array", "jsonb_build_array": "json_array",
                     "json_agg": "json_group_array", "jsonb_agg": "json_group_array",
                     "json_object_agg": "json_group_object", "jsonb_object_agg": "json_group_object",
                     "to_jsonb": "to_json"}

# reg* casts: (input macro for a name, output macro giving the name); None: the OID itself.
REG_TYPES: dict[str, tuple[str | None, str | None]] = {
    "regclass": ("hr_regclass_in", "hr_regclass_out"),
    "regtype": ("hr_regtype_in", "hr_format_type"),
    "regnamespace": ("hr_regnamespace_in", "hr_regnamespace_out"),
    "regrole": ("hr_regrole_in", "hr_get_userbyid"),
    "oid": (None, None),
}
# PostgreSQL type names DuckDB does not know, as DuckDB types.
STORE_TYPE_NAMES = {"name": "VARCHAR", "char": "VARCHAR", "bpchar": "VARCHAR", "int2vector": "SMALLINT[]",
                    "oidvector": "UINTEGER[]", "xid": "UINTEGER", "cid": "UINTEGER", "text": "VARCHAR",
                    "int2": "SMALLINT", "int4": "INTEGER", "int8": "BIGINT", "float4": "FLOAT", "float8": "DOUBLE",
                    "bool": "BOOLEAN", "pg_node_tree": "VARCHAR", "aclitem": "VARCHAR",
                    **{name: "UINTEGER" for name in REG_TYPES}}

REGEX_OPERATORS = {"~": (False, False), "!~": (True, False), "~*": (False, True), "!~*": (True, True)}


def macro_call(name: str, *args: exp.Expr) -> exp.Expr:
    """A call of one of catalog/system/macros.py's macros, fully qualified."""
    database, schema = MACRO_SCHEMA.split(".")
    return exp.Dot.build([exp.to_identifier(database), exp.to_identifier(schema),
                          exp.Anonymous(this=name, expressions=list(args))])


def unqualify_functions(ast: exp.Expr) -> None:
    """pg_catalog.f(...) -> f(...): headrace's functions all live on the default path."""
    for dot in list(ast.find_all(exp.Dot)):
        if (isinstance(dot.this, exp.Identifier) and dot.this.name.lower() in ("pg_catalog", "information_schema")
                and isinstance(dot.expression, exp.Func)):
            dot.replace(dot.expression)


class FunctionTranslator:
    """Rewrites one statement's tree; collects the session values it needs."""

    def __init__(self, first_session_parameter: int, known_setting: Callable[[str], bool], server_version: str) -> None:
        self.next_parameter = first_session_parameter
        self.session_inputs: list[str] = []
        self.reads_system_catalog = False  # has_*_privilege reads the system catalog's privilege lists
        self._numbers: dict[str, int] = {}
        self.known_setting = known_setting
        self.server_version = server_version

    def session_value(self, name: str) -> exp.Expr:
        """A parameter bound, at execution, to the session's value of `name` (user, database, pid,
        setting:<name>); the same name reuses one parameter."""
        if name not in self._numbers:
            self._numbers[name] = self.next_parameter
            self.next_parameter += 1
            self.session_inputs.append(name)
        cast_to = {"pid": "INTEGER", "setting_names": "VARCHAR[]", "setting_values": "VARCHAR[]"}.get(name, "VARCHAR")
        return exp.Cast(this=exp.Parameter(this=exp.Literal.number(self._numbers[name])),
                        to=exp.DataType.build(cast_to, dialect="duckdb"))

    def translate(self, ast: exp.Expr) -> None:
        # Children before parents (reversed pre-order), so a parent sees its translated children.
        for node in reversed(list(ast.walk())):
            replacement = self._translate_node(node)
            if replacement is not None and replacement is not node:
                node.replace(replacement)

    def _translate_node(self, node: exp.Expr) -> exp.Expr | None:
        if isinstance(node, (exp.CurrentUser, exp.SessionUser)):
            return self.session_value("user")
        if isinstance(node, (exp.CurrentDatabase, exp.CurrentCatalog)):
            return self.session_value("database")
        if isinstance(node, exp.CurrentSchema):
            return exp.Literal.string("public")
        if isinstance(node, exp.CurrentVersion):
            return exp.Literal.string(self.server_version)
        if isinstance(node, exp.Operator):
            return self._operator(node)
        if isinstance(node, exp.Collate):
            return node.this  # one collation (C, UTF-8) for everything
        if isinstance(node, exp.Cast):
            return self._cast(node)
        if isinstance(node, (exp.Div, exp.Mod, exp.IntDiv)):
            divisor = node.expression
            if not (isinstance(divisor, exp.Literal) and divisor.is_number and float(divisor.this) != 0):
                node.set("expression", macro_call("hr_nonzero_divisor", divisor.copy()))
            return None
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous) and node.this.name.lower() in TABLE_MACROS:
            database, schema = MACRO_SCHEMA.split(".")  # pg_get_keywords(): a table macro of catalog/system
            node.set("this", exp.Anonymous(this=TABLE_MACROS[node.this.name.lower()], expressions=[]))
            node.set("db", exp.to_identifier(schema))
            node.set("catalog", exp.to_identifier(database))
            return None
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Func):
            node.set("db", None)  # pg_catalog.generate_series(...) / unnest(...) as a table
            alias = node.args.get("alias")
            if isinstance(alias, exp.TableAlias) and alias.this is not None and not alias.columns:
                # PostgreSQL names a scalar function's single column after the table alias.
                alias.set("columns", [exp.to_identifier(alias.name)])
            return None
        if isinstance(node, exp.EQ) and isinstance(node.expression, exp.Any) and not isinstance(node.expression.this, exp.Subquery | exp.Select):
            array = node.expression.this
            array = array.this if isinstance(array, exp.Paren) else array
            return exp.Anonymous(this="list_contains", expressions=[array.copy(), node.this.copy()])
        if isinstance(node, exp.Anonymous):
            return self._function(str(node.this).lower(), list(node.expressions))
        return None

    def _function(self, name: str, args: list[exp.Expr]) -> exp.Expr | None:
        if name in MACRO_FUNCTIONS:
            macro, arity = MACRO_FUNCTIONS[name]
            padded = [arg.copy() for arg in args[:arity]] + [exp.null() for _ in range(arity - len(args))]
            return _keeping_parameters(macro_call(macro, *padded), args[arity:])
        if name in CONSTANT_FUNCTIONS:
            return _keeping_parameters(CONSTANT_FUNCTIONS[name](), args)
        if name in PRIVILEGE_FUNCTIONS:
            return self._has_privilege(name, args)
        if name in RENAMED_FUNCTIONS:
            return exp.Anonymous(this=RENAMED_FUNCTIONS[name], expressions=[arg.copy() for arg in args])
        if name == "version":
            return exp.Literal.string(self.server_version)
        if name == "_pg_expandarray" and len(args) == 1:
            # information_schema._pg_expandarray(a): one row (x, n) per element (pgjdbc's getPrimaryKeys)
            expansion = exp.maybe_parse("unnest(list_transform(range(1, len(hr_array) + 1), "
                                        "hr_i -> {'x': hr_array[hr_i], 'n': hr_i}))", dialect="duckdb")
            for column in list(expansion.find_all(exp.Column)):
                if column.name == "hr_array":
                    column.replace(args[0].copy())
            return expansion
        if name == "pg_backend_pid":
            return self.session_value("pid")
        if name in ("current_database", "current_catalog"):
            return self.session_value("database")
        if name in ("current_user", "session_user", "user", "current_role"):
            return self.session_value("user")
        if name == "current_schemas":
            implicit = not (args and isinstance(args[0], exp.Boolean) and not args[0].this)
            names = ["pg_catalog", "public"] if implicit else ["public"]
            return exp.Array(expressions=[exp.Literal.string(n) for n in names])
        if name == "current_setting":
            return self._current_setting(args)
        if name == "set_config":
            # Accepted and answered like PostgreSQL (the new value); headrace's settings change via SET.
            return args[1].copy() if len(args) > 1 else exp.null()
        return None

    def _has_privilege(self, name: str, args: list[exp.Expr]) -> exp.Expr:
        kind, arity = PRIVILEGE_FUNCTIONS[name]
        if len(args) not in (arity, arity + 1):
            raise HeadraceError(f"function {name}() with {len(args)} arguments does not exist", sqlstate="42883")
        role = args[0].copy() if len(args) > arity else self.session_value("user")
        rest = args[len(args) - arity:]
        self.reads_system_catalog = True
        return macro_call("hr_has_privilege", role, exp.Literal.string(kind), rest[0].copy(), rest[-1].copy())

    def _current_setting(self, args: list[exp.Expr]) -> exp.Expr:
        if not args:
            raise HeadraceError("function current_setting() does not exist", sqlstate="42883")
        if not isinstance(args[0], exp.Literal) or not args[0].is_string:
            # A name known only at execution: look it up in the session's settings (unknown -> NULL).
            names, values = self.session_value("setting_names"), self.session_value("setting_values")
            position = exp.Anonymous(this="list_position", expressions=[names, exp.Lower(this=args[0].copy())])
            return exp.Anonymous(this="list_extract", expressions=[values, position])
        setting = args[0].this.lower()
        missing_ok = len(args) > 1 and isinstance(args[1], exp.Boolean) and bool(args[1].this)
        if not self.known_setting(setting):
            if missing_ok:
                return exp.null()
            raise HeadraceError(f'unrecognized configuration parameter "{args[0].this}"', sqlstate="42704")
        return self.session_value(f"setting:{setting}")

    def _operator(self, node: exp.Operator) -> exp.Expr:
        operator = str(node.args.get("operator", "")).split(".")[-1].strip()
        left, right = node.this.copy(), node.expression.copy()
        if operator in REGEX_OPERATORS:
            negated, insensitive = REGEX_OPERATORS[operator]
            args = [left, right] + ([exp.Literal.string("i")] if insensitive else [])
            match: exp.Expr = exp.Anonymous(this="regexp_matches", expressions=args)
            return exp.Not(this=match) if negated else match
        binary = {"=": exp.EQ, "<>": exp.NEQ, "!=": exp.NEQ, "<": exp.LT, "<=": exp.LTE, ">": exp.GT,
                  ">=": exp.GTE, "||": exp.DPipe, "+": exp.Add, "-": exp.Sub}.get(operator)
        if binary is None:
            raise HeadraceError(f"operator does not exist: OPERATOR({node.args.get('operator')})", sqlstate="42883")
        return binary(this=left, expression=right)

    def _cast(self, node: exp.Cast) -> exp.Expr | None:
        type_name = _type_name(node.to)
        if type_name in ("regproc", "regprocedure"):
            # Functions are known by name (pg_type.typinput holds 'array_in'): regproc is its name.
            operand = node.this.copy()
            if isinstance(operand, exp.Literal) and operand.is_string:
                return exp.Literal.string(operand.this.split(".")[-1].strip('"'))
            return exp.Cast(this=operand, to=exp.DataType.build("VARCHAR", dialect="duckdb"))
        if type_name in REG_TYPES:
            in_macro, out_macro = REG_TYPES[type_name]
            operand = node.this.copy()
            if isinstance(operand, exp.Literal) and operand.is_string:
                if in_macro is None or operand.this.strip().isdigit():
                    oid = exp.Cast(this=operand, to=exp.DataType.build("UINTEGER", dialect="duckdb"))
                else:
                    oid = macro_call(in_macro, operand)
            else:
                oid = exp.Cast(this=operand, to=exp.DataType.build("UINTEGER", dialect="duckdb"))
            if out_macro is not None and _wants_text(node):
                args = [oid, exp.null()] if out_macro == "hr_format_type" else [oid]
                return macro_call(out_macro, *args)
            return oid
        if node.to.this == exp.DataType.Type.USERDEFINED or type_name in STORE_TYPE_NAMES:
            store_type = STORE_TYPE_NAMES.get(type_name)
            if store_type:
                node.set("to", exp.DataType.build(store_type, dialect="duckdb"))
        elif node.to.this == exp.DataType.Type.ARRAY and node.to.expressions:
            literal = node.this
            if isinstance(literal, exp.Literal) and literal.is_string and literal.this.lstrip().startswith(("{", "[")):
                # PostgreSQL's array literal '{a,b}' -> a DuckDB list of the element texts, then the cast
                try:
                    elements = split_array_literal(literal.this)
                except ValueError:
                    raise DataError(f'malformed array literal: "{literal.this}"', sqlstate="22P02") from None
                node.set("this", exp.Array(expressions=[exp.null() if e is None else exp.Literal.string(e)
                                                        for e in elements]))
            element = _type_name(node.to.expressions[0])
            if element in STORE_TYPE_NAMES:
                node.set("to", exp.DataType.build(STORE_TYPE_NAMES[element] + "[]", dialect="duckdb"))
        return None


def _keeping_parameters(result: exp.Expr, dropped: list[exp.Expr]) -> exp.Expr:
    """`result`, still mentioning the parameters of arguments it does not use: the store refuses a
    statement with parameters that appear nowhere."""
    for argument in dropped:
        if argument.find(exp.Placeholder, exp.Parameter) is not None:
            result = exp.Case(ifs=[exp.If(this=exp.Is(this=argument.copy(), expression=exp.null()), true=result.copy())],
                              default=result)
    return result


def _type_name(data_type: exp.Expr) -> str:
    """A cast target's unqualified lowercase name (pg_catalog.regclass -> regclass)."""
    if isinstance(data_type, exp.ObjectIdentifier):
        return data_type.name.lower()
    if isinstance(data_type, exp.DataType):
        kind = data_type.args.get("kind")
        if data_type.this == exp.DataType.Type.USERDEFINED and kind is not None:
            text = kind.sql() if isinstance(kind, exp.Expr) else str(kind)
            return text.split(".")[-1].strip('"').lower()
        if data_type.this == exp.DataType.Type.ARRAY:
            return ""
        return data_type.sql(dialect="postgres").lower()
    return ""


def _wants_text(cast: exp.Cast) -> bool:
    """A reg* value is shown as a name when cast to text or returned as a result column."""
    parent = cast.parent
    if isinstance(parent, exp.Cast):
        return _type_name(parent.to) in ("text", "varchar", "name", "character varying")
    if isinstance(parent, exp.Alias):
        parent = parent.parent
    return isinstance(parent, exp.Select)
