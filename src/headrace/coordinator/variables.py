"""Session variables: SET [SESSION | LOCAL], SHOW, RESET, SET TRANSACTION, as PostgreSQL answers them.

Variables a client may set are the ones in the session (see session.default_variables) plus the
ones below that drivers send on connect (JDBC's extra_float_digits, asyncpg's jit, ...); any name
with a dot is a custom variable, as in PostgreSQL. Anything else is 42704.
"""

from __future__ import annotations

from headrace.coordinator.responses import Column, CommandComplete, SendingRows
from headrace.coordinator.session import REPORTED_VARIABLES, Session
from headrace.errors import HeadraceError, InvalidParameterValue
from headrace.pgwire.types.time_zone import canonical_zone_name, zone_named
from headrace.sql.ast import ResetVariable, SetTransaction, SetVariable
from headrace.sql.types import TEXT_OID

# Settable and shown; the values change nothing in headrace but clients read them back.
EXTRA_DEFAULTS: dict[str, str] = {
    "extra_float_digits": "1",
    "client_min_messages": "notice",
    "statement_timeout": "0",
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
    "jit": "off",
    "bytea_output": "hex",
    "lc_messages": "C",
    "lc_monetary": "C",
    "lc_numeric": "C",
    "lc_time": "C",
    "default_transaction_read_only": "off",
    "transaction_read_only": "off",
    "default_transaction_deferrable": "off",
    "synchronous_commit": "on",
    "max_identifier_length": "63",
    "row_security": "on",
    "escape_string_warning": "on",
    "xmloption": "content",
    "geqo": "on",
    "cluster": "default",
    "max_copy_from_size": str(64 << 20),
}
READ_ONLY = {"server_version", "server_version_num", "server_encoding", "is_superuser", "integer_datetimes",
             "max_identifier_length", "session_authorization", "database"}
ISOLATION_LEVELS = ("serializable", "strict serializable", "repeatable read", "read committed", "read uncommitted")
# SHOW's spelled-out names -> the variable.
ALIASES = {"transaction isolation level": "transaction_isolation", "time zone": "timezone",
           "session authorization": "session_authorization"}


def known_value(session: Session, name: str) -> str | None:
    if name in session.variables:
        return session.variables[name]
    return EXTRA_DEFAULTS.get(name)


def execute_set(session: Session, ast: SetVariable) -> CommandComplete:
    name = str(ast.this).lower()
    local = bool(ast.args.get("local"))
    values: list[str] | None = ast.args.get("values")
    if name in READ_ONLY:
        raise HeadraceError(f'parameter "{name}" cannot be changed', sqlstate="55P02")
    if known_value(session, name) is None and "." not in name:
        raise HeadraceError(f'unrecognized configuration parameter "{name}"', sqlstate="42704")
    if local and not session.in_block:
        return CommandComplete("SET", ("SET LOCAL can only be used in transaction blocks",))
    if values is None:
        value = _default(session, name)
    else:
        value = _canonical(name, values)
    session.set_variable(name, value, local=local)
    return CommandComplete("SET", parameters=reported(session, [name]))


def reported(session: Session, names: list[str]) -> tuple[tuple[str, str], ...]:
    """The ParameterStatus announcements for these variables (those clients track)."""
    return tuple((REPORTED_VARIABLES[name], session.variables[name]) for name in names
                 if name in REPORTED_VARIABLES and name in session.variables)


def _default(session: Session, name: str) -> str:
    if name in session.session_defaults:
        return session.session_defaults[name]
    return EXTRA_DEFAULTS.get(name, "")


def _canonical(name: str, values: list[str]) -> str:
    if name == "timezone":
        if len(values) != 1:
            raise InvalidParameterValue("SET TIME ZONE takes only one argument")
        return _time_zone(values[0])
    if name == "client_encoding":
        if values[0].replace("-", "").replace("_", "").upper() not in ("UTF8", "UNICODE"):
            raise InvalidParameterValue(f'invalid value for parameter "client_encoding": "{values[0]}"',
                                        hint="headrace speaks UTF8 only")
        return "UTF8"
    if name in ("transaction_isolation", "default_transaction_isolation"):
        level = values[0].lower()
        if level not in ISOLATION_LEVELS:
            raise InvalidParameterValue(f'invalid value for parameter "{name}": "{values[0]}"')
        return level
    if name == "datestyle":
        return _datestyle(values)
    return ", ".join(values)


def _time_zone(value: str) -> str:
    """A TimeZone setting as SHOW answers it: UTC, an IANA name in its canonical spelling, or hours as given.
    timestamptz text values are then written in this zone (pgwire/types/time_zone.py)."""
    try:
        zone_named(value)
    except ValueError:
        raise InvalidParameterValue(f'invalid value for parameter "TimeZone": "{value}"') from None
    return canonical_zone_name(value) or value


def _datestyle(values: list[str]) -> str:
    parts = [part.strip().upper() for value in values for part in value.split(",") if part.strip()]
    style, order = "ISO", "MDY"
    for part in parts:
        if part in ("ISO", "POSTGRES", "SQL", "GERMAN"):
            style = part if part == "ISO" else part.title()
        elif part in ("MDY", "DMY", "YMD", "US", "EUROPEAN", "NONEUROPEAN"):
            order = {"US": "MDY", "NONEUROPEAN": "MDY", "EUROPEAN": "DMY"}.get(part, part)
        else:
            raise InvalidParameterValue(f'invalid value for parameter "DateStyle": "{", ".join(values)}"')
    # Every style PostgreSQL has is accepted: the store PostgreSQL writes the dates of the statements it runs in it
    # (coordinator/passthrough.py). headrace's own relations, not yet moved to the store, still write ISO.
    return f"{style}, {order}"


def execute_set_transaction(session: Session, ast: SetTransaction) -> CommandComplete:
    """Isolation is always strict serializable in headrace; the level is accepted and shown."""
    for mode in ast.args.get("modes") or []:
        if mode.startswith("isolation level "):
            level = mode.removeprefix("isolation level ")
            if level not in ISOLATION_LEVELS:
                raise InvalidParameterValue(f'invalid value for parameter "transaction_isolation": "{level}"')
            name = "default_transaction_isolation" if ast.args.get("session") else "transaction_isolation"
            if name == "transaction_isolation" and session.in_block:
                session.set_variable(name, level, local=True)
            elif name == "default_transaction_isolation":
                session.set_variable(name, level)
    if not session.in_block and not ast.args.get("session"):
        return CommandComplete("SET", ("SET TRANSACTION can only be used in transaction blocks",))
    return CommandComplete("SET")


def execute_reset(session: Session, ast: ResetVariable) -> CommandComplete:
    name = str(ast.this).lower()
    if name == "all":
        for variable in list(session.variables):
            if variable not in READ_ONLY:
                session.set_variable(variable, _default(session, variable))
        return CommandComplete("RESET", parameters=reported(session, list(REPORTED_VARIABLES)))
    if name in READ_ONLY:
        raise HeadraceError(f'parameter "{name}" cannot be changed', sqlstate="55P02")
    if known_value(session, name) is None and "." not in name:
        raise HeadraceError(f'unrecognized configuration parameter "{name}"', sqlstate="42704")
    session.set_variable(name, _default(session, name))
    return CommandComplete("RESET", parameters=reported(session, [name]))


def _show_name(name: str) -> str:
    return name.replace(" . ", ".")  # the SHOW parser joins tokens with spaces


def show_columns(name: str) -> tuple[Column, ...]:
    name = _show_name(name)
    if name == "all":
        return (Column("name", TEXT_OID), Column("setting", TEXT_OID), Column("description", TEXT_OID))
    key = ALIASES.get(name, name)
    return (Column(REPORTED_VARIABLES.get(key, key), TEXT_OID),)  # PostgreSQL names it canonically


def execute_show(session: Session, name: str) -> SendingRows:
    name = _show_name(name)
    if name == "all":
        merged = {**EXTRA_DEFAULTS, **session.variables}
        rows = [(key, value, "") for key, value in sorted(merged.items())]
        return SendingRows(show_columns(name), rows, "SHOW")
    key = ALIASES.get(name, name)
    value = known_value(session, key)
    if value is None:
        raise HeadraceError(f'unrecognized configuration parameter "{name}"', sqlstate="42704")
    return SendingRows(show_columns(name), [(value,)], "SHOW")
