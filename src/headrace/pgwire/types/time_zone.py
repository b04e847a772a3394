"""The session's TimeZone, as timestamptz text values need it.

PostgreSQL prints a timestamptz in the session's TimeZone with that zone's offset (`2024-01-01 07:00:00-05` under
America/New_York) and reads a text value without an offset in that zone; binary values are UTC microseconds
whatever the zone. The codecs are plain functions called per value, so the zone reaches them through a context
variable: `bind_session_variables(session.variables)` is called once in the task that serves a session (a pgwire
connection, an HTTP SQL request or WebSocket), and the codecs look the current "timezone" variable up per value
(a dictionary lookup; the tzinfo is cached by name). Outside a session (webhook CHECKs, the pipeline) it is UTC.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import timedelta, timezone, tzinfo
from functools import lru_cache

_session_variables: ContextVar[Mapping[str, str] | None] = ContextVar("headrace_session_variables", default=None)
UTC_NAMES = frozenset({"UTC", "GMT", "Z", "ETC/UTC", "ETC/GMT", "ZULU", "UCT", "UNIVERSAL", "0", "+00", "+00:00"})
_NUMERIC_OFFSET = re.compile(r"^\s*([+-]?)(\d{1,2})(?::(\d{2}))?(?:\.(\d+))?\s*$")


def bind_session_variables(variables: Mapping[str, str]) -> None:
    """Make `variables` (kept up to date by SET / RESET / transaction ends) the current task's session variables."""
    _session_variables.set(variables)


def session_zone() -> tzinfo | None:
    """The current session's time zone, or None for UTC (the fast path)."""
    variables = _session_variables.get()
    if variables is None:
        return None
    try:
        return zone_named(variables.get("timezone", "UTC"))
    except ValueError:  # only SET validates; a startup parameter (JDBC sends its JVM's zone) may be anything
        return None


@lru_cache(maxsize=128)
def zone_named(name: str) -> tzinfo | None:
    """A TimeZone setting's tzinfo: None for UTC, an IANA zone, or a fixed offset for a number of hours
    (`SET TIME ZONE -5`, ISO sign: five hours west). Raises ValueError for an unknown name."""
    if name.upper() in UTC_NAMES:
        return None
    numeric = _NUMERIC_OFFSET.match(name)
    if numeric is not None:
        sign, hours, minutes, fraction = numeric.groups()
        offset = timedelta(hours=int(hours), minutes=int(minutes or 0))
        if fraction:
            offset += timedelta(hours=float("0." + fraction))
        if offset > timedelta(hours=15):
            raise ValueError(f"time zone offset out of range: {name}")
        offset = -offset if sign == "-" else offset
        return None if not offset else timezone(offset)
    canonical = canonical_zone_name(name)
    if canonical is None:
        raise ValueError(f"time zone {name!r} not recognized")
    return zoneinfo.ZoneInfo(canonical)


def canonical_zone_name(name: str) -> str | None:
    """The IANA spelling of a zone name given in any case (PostgreSQL matches zone names case-insensitively and
    SHOW answers the canonical spelling), or None if there is no such zone."""
    if name.upper() in UTC_NAMES:
        return "UTC"
    return _zones_by_folded_name().get(name.lower())


@lru_cache(maxsize=1)
def _zones_by_folded_name() -> dict[str, str]:
    return {zone.lower(): zone for zone in zoneinfo.available_timezones()}


def offset_text(offset: timedelta | None) -> str:
    """A UTC offset as PostgreSQL prints it in ISO style: -05, +05:30, +00:19:32 (local mean time)."""
    seconds = int(offset.total_seconds()) if offset is not None else 0
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{sign}{hours:02d}"
    if minutes or seconds:
        text += f":{minutes:02d}"
    if seconds:
        text += f":{seconds:02d}"
    return text
