"""Turning parsed DDL into catalog items, and items back into their canonical CREATE statement
(what the catalog stores, so ALTER SOURCE can change one clause and keep one source of truth)."""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from headrace.catalog.items import (
    DEFAULT_DATABASE,
    DEFAULT_SCHEMA,
    DEFAULT_WINDOW_US,
    MAX_WINDOW_US,
    CheckOption,
    HeaderColumn,
    WebhookSource,
)
from headrace.errors import DuplicateObject, FeatureNotSupported, InternalError, InvalidParameterValue
from headrace.sql.ast import CreateWebhookSource
from headrace.sql.expr import SqlType, compile_expression
from headrace.sql.expr_types import interval_text, parse_interval
from headrace.sql.parser import parse_statement

# Columns every IDEMPOTENT expression can read, besides the INCLUDE HEADER columns. `headers` is
# always there (the key often comes from a header such as Idempotency-Key), included or not.
_BODY_TYPES = {"text": SqlType.TEXT, "bytes": SqlType.BYTEA, "json": SqlType.JSONB, "json_array": SqlType.JSONB}
_FORMAT_SQL = {"text": "TEXT", "json": "JSON", "json_array": "JSON ARRAY", "bytes": "BYTES"}
_RESERVED_COLUMNS = ("received_at", "idempotency_key")


def qualified_name(table: exp.Table) -> tuple[str, str, str]:
    """(database, schema, name) of a possibly qualified object name."""
    return (table.catalog or DEFAULT_DATABASE, table.db or DEFAULT_SCHEMA, table.name)


def parse_window(text: str) -> int:
    """A WINDOW interval as microseconds: more than zero, at most 30 days."""
    micros = parse_interval(text)
    if micros <= 0:
        raise InvalidParameterValue(f"WINDOW must be a positive interval, not '{text}'")
    if micros > MAX_WINDOW_US:
        raise InvalidParameterValue(f"WINDOW '{text}' exceeds the maximum of {interval_text(MAX_WINDOW_US)}",
                                    hint="idempotency keys are kept on disk for the whole window")
    return micros


def webhook_source_from_statement(item_id: str, statement: CreateWebhookSource, create_sql: str = "") -> WebhookSource:
    """The item a CREATE SOURCE statement describes. Its `create_sql` is the canonical statement
    rendered from the item (the `create_sql` argument is accepted for older callers and unused)."""
    database, schema, name = qualified_name(statement.this)
    if database != DEFAULT_DATABASE or schema != DEFAULT_SCHEMA:
        raise FeatureNotSupported(f"sources live in {DEFAULT_DATABASE}.{DEFAULT_SCHEMA} for now, not {database}.{schema}")
    args = statement.args
    idempotent = args.get("idempotent")
    window = args.get("window")
    if window is not None and idempotent is None:
        raise FeatureNotSupported("WINDOW applies to IDEMPOTENT: give IDEMPOTENT (<expr>) WINDOW '<interval>'")
    source = WebhookSource(
        id=item_id,
        name=name,
        body_format=args["body_format"],
        include_headers=bool(args.get("include_headers")),
        idempotent_expr=idempotent,
        create_sql="",
        headers_allowed=tuple(args.get("headers_allowed") or ()),
        headers_excluded=tuple(args.get("headers_excluded") or ()),
        header_columns=tuple(HeaderColumn(h, c, b) for h, c, b in args.get("header_columns") or ()),
        check_expr=args.get("check"),
        check_options=tuple(CheckOption(k, a, b, s) for k, a, b, s in args.get("check_options") or ()),
        window_us=parse_window(window) if window is not None else DEFAULT_WINDOW_US,
    )
    _check_columns(source)
    return replace(source, create_sql=render_create_source(source))


def _check_columns(source: WebhookSource) -> None:
    names = source.column_names()
    for column in source.header_columns:
        if column.column in _RESERVED_COLUMNS or names.count(column.column) > 1:
            raise DuplicateObject(f'column "{column.column}" specified more than once',
                                  hint="INCLUDE HEADER ... AS <column> needs a name no other column has")
    aliases = [option.alias for option in source.check_options]
    if len(set(aliases)) != len(aliases):
        raise DuplicateObject("CHECK ( WITH (...) ) names the same alias twice")
    kinds = [option.kind for option in source.check_options if option.kind != "secret"]
    if len(set(kinds)) != len(kinds):
        raise DuplicateObject("CHECK ( WITH (...) ) includes BODY or HEADERS twice")


def key_columns(source: WebhookSource) -> dict[str, SqlType]:
    """What the IDEMPOTENT expression reads: one row's body, the request's headers (a map), and
    each INCLUDE HEADER column."""
    columns = {"body": _BODY_TYPES[source.body_format], "headers": SqlType.MAP}
    for column in source.header_columns:
        columns[column.column] = SqlType.BYTEA if column.as_bytes else SqlType.TEXT
    return columns


def check_columns(source: WebhookSource) -> dict[str, SqlType]:
    """What the CHECK expression reads: the whole request body (text, or bytea with BYTES), its
    headers, and each secret (text, or bytea with BYTES), under their WITH aliases. `body` and
    `headers` are there under their own names unless WITH renames them."""
    columns: dict[str, SqlType] = {}
    kinds = {option.kind for option in source.check_options}
    if "body" not in kinds:
        columns["body"] = SqlType.TEXT
    if "headers" not in kinds:
        columns["headers"] = SqlType.MAP
    for option in source.check_options:
        if option.kind == "headers":
            if option.as_bytes:
                raise FeatureNotSupported("HEADERS BYTES in CHECK; convert_to(headers->'name', 'UTF8') gives bytes")
            columns[option.alias] = SqlType.MAP
        else:
            columns[option.alias] = SqlType.BYTEA if option.as_bytes else SqlType.TEXT
    return columns


def validate_expressions(source: WebhookSource) -> None:
    """Compile CHECK and IDEMPOTENT now, so a bad expression fails CREATE SOURCE, not each request."""
    if source.idempotent_expr is not None:
        compile_expression(source.idempotent_expr, key_columns(source))
    if source.check_expr is not None:
        check = compile_expression(source.check_expr, check_columns(source))
        if check.result_type not in (SqlType.BOOLEAN,):
            raise InvalidParameterValue(f"CHECK must be a boolean expression, not {check.result_type.value}")


def render_create_source(source: WebhookSource) -> str:
    """The canonical CREATE SOURCE statement of an item (expressions as the user wrote them)."""
    parts = [f"CREATE SOURCE {_identifier(source.name)} FROM WEBHOOK BODY FORMAT {_FORMAT_SQL[source.body_format]}"]
    for column in source.header_columns:
        parts.append(f"INCLUDE HEADER {_string(column.header)} AS {_identifier(column.column)}"
                     + (" BYTES" if column.as_bytes else ""))
    if source.include_headers:
        listed = [_string(h) for h in source.headers_allowed] + [f"NOT {_string(h)}" for h in source.headers_excluded]
        parts.append("INCLUDE HEADERS" + (f" ({', '.join(listed)})" if listed else ""))
    if source.check_expr is not None:
        options = [_check_option_sql(option) for option in source.check_options]
        with_clause = f"WITH ({', '.join(options)}) " if options else ""
        parts.append(f"CHECK ({with_clause}{source.check_expr})")
    if source.idempotent_expr is not None:
        parts.append(f"IDEMPOTENT ({source.idempotent_expr}) WINDOW {_string(interval_text(source.window_us))}")
    return " ".join(parts)


def _check_option_sql(option: CheckOption) -> str:
    if option.kind == "secret":
        assert option.secret is not None
        text = "SECRET " + ".".join(_identifier(part) for part in option.secret.split("."))
        default_alias = option.secret.rpartition(".")[2]
    else:
        text, default_alias = option.kind.upper(), option.kind
    if option.alias != default_alias:
        text += f" AS {_identifier(option.alias)}"
    return text + (" BYTES" if option.as_bytes else "")


def _identifier(name: str) -> str:
    if name.isidentifier() and name == name.lower() and name.isascii():
        return name
    return '"' + name.replace('"', '""') + '"'


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def with_window(source: WebhookSource, window_us: int) -> WebhookSource:
    """ALTER SOURCE ... SET (WINDOW = ...): the same source with a new window (and statement)."""
    changed = replace(source, window_us=window_us)
    return replace(changed, create_sql=render_create_source(changed))


def item_from_create_sql(item_id: str, create_sql: str) -> WebhookSource:
    """Rebuild a catalog item from its stored CREATE statement (catalog load at start)."""
    statement = parse_statement(create_sql)
    if isinstance(statement, CreateWebhookSource):
        return webhook_source_from_statement(item_id, statement)
    raise InternalError(f"catalog item {item_id} holds an unknown statement: {create_sql!r}")


__all__ = ["check_columns", "item_from_create_sql", "key_columns", "parse_window",
           "qualified_name", "render_create_source", "validate_expressions", "webhook_source_from_statement",
           "with_window"]
