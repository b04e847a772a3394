"""CREATE CONNECTION / CREATE SINK statements -> catalog items, with each driver's options checked.

Options per driver (names as written in SQL; `=` is optional):
    POSTGRES  CONNECTION <pg connection>, TABLE '<[schema.]table>' (default: the sink's name),
              DOCUMENT COLUMN '<column>' (the full row as jsonb, optional)
    REDIS     CONNECTION <redis connection>, KEY PREFIX '<prefix>' (default '<sink name>:')
    PARQUET   PATH '<directory>' (the dataset; relative paths are under the data directory), BUCKETS <n>
    HTTP      URL '<url>' | SECRET <s>, HEADERS ('<name>' = '<value>' | SECRET <s>, ...), BATCH SIZE <n>,
              MAX ATTEMPTS <n>, TIMEOUT <seconds>
    EXTERNAL  COMMAND '<shell command>' | ADDRESS '<host:port>', CONFIG '<json object>', RESOURCE '<name>'
    WITH      DELTA UPDATES [= true | false], AT LEAST ONCE [= true | false]
"""

from __future__ import annotations

import json
from typing import Any

from sqlglot import exp

from headrace.catalog.sinks import Connection, OptionValue, SecretRef, Sink
from headrace.errors import FeatureNotSupported, InternalError, InvalidParameterValue
from headrace.sql.ast import CreateConnection, CreateSink, SinkOption
from headrace.sql.ddl import qualified_name

# driver -> option name -> (kinds accepted, required)
_STRING, _NUMBER, _NAME, _SECRET, _LIST = ("string",), ("number",), ("name",), ("string", "secret"), ("list",)
SINK_OPTIONS: dict[str, dict[str, tuple[tuple[str, ...], bool]]] = {
    "POSTGRES": {"CONNECTION": (_NAME, True), "TABLE": (_STRING, False), "DOCUMENT COLUMN": (_STRING, False)},
    "REDIS": {"CONNECTION": (_NAME, True), "KEY PREFIX": (_STRING, False)},
    "PARQUET": {"PATH": (_STRING, True), "BUCKETS": (_NUMBER, False)},
    "HTTP": {"URL": (_SECRET, True), "HEADERS": (_LIST, False), "BATCH SIZE": (_NUMBER, False),
             "MAX ATTEMPTS": (_NUMBER, False), "TIMEOUT": (_NUMBER, False)},
    "EXTERNAL": {"COMMAND": (_STRING, False), "ADDRESS": (_STRING, False), "CONFIG": (_STRING, False),
                 "RESOURCE": (_STRING, False)},
}
WITH_OPTIONS = ("DELTA UPDATES", "AT LEAST ONCE")
CONNECTION_OPTIONS = {"URL": (_SECRET, True)}


def connection_from_statement(item_id: str, ast: CreateConnection, sql: str) -> Connection:
    options = _checked(ast.args["options"], CONNECTION_OPTIONS, f"CONNECTION TO {ast.args['driver']}")
    _, schema, name = qualified_name(ast.this)
    url = options["url"]
    assert isinstance(url, (str, SecretRef))
    return Connection(id=item_id, name=name, schema=schema, driver=ast.args["driver"].lower(), url=url,
                      create_sql=sql)


def sink_from_statement(item_id: str, ast: CreateSink, sql: str) -> Sink:
    driver = ast.args["driver"]
    options = _checked(ast.args["options"], SINK_OPTIONS[driver], f"SINK INTO {driver}")
    flags = _checked(ast.args.get("with_options") or [], {name: (("bool",), False) for name in WITH_OPTIONS},
                     "CREATE SINK ... WITH")
    _, schema, name = qualified_name(ast.this)
    _, relation_schema, relation_name = qualified_name(ast.args["relation"])
    delta = bool(flags.get("delta_updates", False))
    at_least_once = bool(flags.get("at_least_once", False))
    if driver == "EXTERNAL" and ("command" in options) == ("address" in options):
        raise InvalidParameterValue("SINK INTO EXTERNAL needs exactly one of COMMAND and ADDRESS")
    if driver == "EXTERNAL" and "config" in options:
        try:
            config = json.loads(str(options["config"]))
        except ValueError as exc:
            raise InvalidParameterValue(f"CONFIG must be a JSON object: {exc}") from None
        if not isinstance(config, dict):
            raise InvalidParameterValue("CONFIG must be a JSON object")
    if driver == "HTTP" and not delta:
        raise FeatureNotSupported("SINK INTO HTTP sends delta updates only",
                                  hint="add WITH (DELTA UPDATES = true)")
    if at_least_once and driver != "REDIS":
        raise InvalidParameterValue(f"AT LEAST ONCE applies to REDIS sinks; a {driver} sink is exactly once")
    for option in ("buckets", "batch_size", "max_attempts"):
        value = options.get(option)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise InvalidParameterValue(f"{option.replace('_', ' ').upper()} must be a positive integer")
    return Sink(id=item_id, name=name, schema=schema, relation_schema=relation_schema, relation_name=relation_name,
                driver=driver.lower(), options=options, create_sql=sql, delta_updates=delta,
                at_least_once=at_least_once)


def connection_from_create_sql(item_id: str, sql: str) -> Connection:
    ast = _parse(sql)
    if not isinstance(ast, CreateConnection):
        raise InternalError(f"catalog connection {item_id} holds another statement: {sql[:60]!r}")
    return connection_from_statement(item_id, ast, sql)


def sink_from_create_sql(item_id: str, sql: str) -> Sink:
    ast = _parse(sql)
    if not isinstance(ast, CreateSink):
        raise InternalError(f"catalog sink {item_id} holds another statement: {sql[:60]!r}")
    return sink_from_statement(item_id, ast, sql)


def _parse(sql: str) -> exp.Expr:
    from headrace.sql.parser import parse_statement  # the parser imports this package's grammar

    return parse_statement(sql)


def _checked(options: list[SinkOption], allowed: dict[str, tuple[tuple[str, ...], bool]],
             what: str) -> dict[str, OptionValue]:
    """Options by snake-case name; unknown, repeated, mistyped or missing required ones are refused."""
    result: dict[str, OptionValue] = {}
    for option in options:
        name, kind = option.args["name"], option.args["kind"]
        if name not in allowed:
            known = ", ".join(allowed) or "none"
            raise InvalidParameterValue(f"{what} has no option {name}", hint=f"options: {known}")
        key = name.lower().replace(" ", "_")
        if key in result:
            raise InvalidParameterValue(f"option {name} given twice")
        kinds, _ = allowed[name]
        if kind not in kinds:
            raise InvalidParameterValue(f"option {name} takes {' or '.join(_shown(k) for k in kinds)}, "
                                        f"not {_shown(kind)}")
        result[key] = _value(option)
    for name, (_, required) in allowed.items():
        if required and name.lower().replace(" ", "_") not in result:
            raise InvalidParameterValue(f"{what} needs the option {name}")
    return result


def _value(option: SinkOption) -> OptionValue:
    kind, value = option.args["kind"], option.args.get("value")
    if kind == "secret":
        return SecretRef(str(value))
    if kind == "list":
        pairs: list[tuple[str, Any]] = []
        for item in value:
            if item.args["kind"] not in ("string", "secret"):
                raise InvalidParameterValue(f"{option.args['name']} entries are '<name>' = '<value>' or SECRET <s>")
            pairs.append((item.args["name"], _value(item)))
        return tuple(pairs)
    return value  # type: ignore[no-any-return]


def _shown(kind: str) -> str:
    return {"string": "a string", "number": "a number", "name": "a name", "secret": "SECRET <name>",
            "list": "a parenthesized list", "bool": "true or false"}[kind]
