"""The startup phase: protocol version check, then (after authentication, see auth.py) the
session and its greeting."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.errors import HeadraceError
from headrace.pgwire import messages
from headrace.pgwire.interfaces import AdapterClient, SessionClient

SUPPORTED_MAJOR_VERSION = 3
NEWEST_MINOR_VERSION = 0


@dataclass(frozen=True, slots=True)
class StartupRequest:
    user: str
    database: str
    parameters: dict[str, str]  # the rest: application_name, client_encoding, options, ...


def check_startup(startup: messages.StartupMessage, out: bytearray) -> StartupRequest:
    """Validate a StartupMessage. Raises HeadraceError, to be reported as FATAL.

    A newer 3.x minor version, or `_pq_.` protocol options, are answered with
    NegotiateProtocolVersion as PostgreSQL does, so clients that ask for 3.2 fall back to 3.0."""
    major, minor = startup.protocol_version >> 16, startup.protocol_version & 0xFFFF
    if major != SUPPORTED_MAJOR_VERSION:
        raise HeadraceError(f"unsupported frontend protocol {major}.{minor}: server supports 3.0 to 3.0",
                            sqlstate="08004")
    parameters = dict(startup.parameters)
    protocol_options = sorted(name for name in parameters if name.startswith("_pq_."))
    for name in protocol_options:
        del parameters[name]
    if minor > NEWEST_MINOR_VERSION or protocol_options:
        out += messages.negotiate_protocol_version(NEWEST_MINOR_VERSION, protocol_options)
    user = parameters.pop("user", "")
    if not user:
        raise HeadraceError("no PostgreSQL user name specified in startup packet", sqlstate="28000")
    database = parameters.pop("database", "") or user
    return StartupRequest(user, database, parameters)


async def open_session(adapter: AdapterClient, request: StartupRequest, out: bytearray) -> SessionClient:
    """Open the session of an authenticated client and write AuthenticationOk, the ParameterStatus
    set, BackendKeyData and ReadyForQuery. Raises HeadraceError, to be reported as FATAL."""
    session = await adapter.new_session(request.user, request.database, request.parameters)
    out += messages.authentication_ok()
    for name, value in session.startup_parameters().items():
        out += messages.parameter_status(name, value)
    out += messages.backend_key_data(session.connection_id, session.secret_key)
    out += messages.ready_for_query(session.transaction_status)
    return session
