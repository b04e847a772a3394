"""timestamptz in the session's TimeZone: text as PostgreSQL prints and reads it, binary always UTC microseconds."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.pgwire.types import BINARY_FORMAT, TEXT_FORMAT, TIMESTAMPTZ, decode_parameter, encode_value
from headrace.pgwire.types.time_zone import (
    bind_session_variables,
    canonical_zone_name,
    offset_text,
    zone_named,
)

NOON_UTC = datetime(2024, 1, 15, 12, 0, 0, 250000, tzinfo=timezone.utc)
ZONES = ["UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Europe/Amsterdam", "-5", "+03:30"]


def in_zone(zone: str, work: Callable[[], Any]) -> Any:
    """Run `work` in a fresh context whose session TimeZone is `zone` (the way a connection task is bound)."""
    def bound() -> Any:
        bind_session_variables({"timezone": zone})
        return work()
    return contextvars.copy_context().run(bound)


@pytest.mark.parametrize(("zone", "expected"), [
    ("UTC", "2024-01-15 12:00:00.25+00"),
    ("America/New_York", "2024-01-15 07:00:00.25-05"),
    ("Asia/Kolkata", "2024-01-15 17:30:00.25+05:30"),
    ("-5", "2024-01-15 07:00:00.25-05"),
])
def test_text_in_the_session_zone(zone: str, expected: str) -> None:
    assert in_zone(zone, lambda: encode_value(TIMESTAMPTZ, TEXT_FORMAT, NOON_UTC)) == expected.encode()


def test_daylight_saving_and_local_mean_time() -> None:
    summer = datetime(2024, 7, 1, 16, 0, tzinfo=timezone.utc)
    assert in_zone("America/New_York", lambda: encode_value(TIMESTAMPTZ, TEXT_FORMAT, summer)) == \
        b"2024-07-01 12:00:00-04"
    # PostgreSQL prints Amsterdam's local mean time offset with seconds
    old = datetime(1900, 1, 1, tzinfo=timezone.utc)
    assert in_zone("Europe/Amsterdam", lambda: encode_value(TIMESTAMPTZ, TEXT_FORMAT, old)) == \
        b"1900-01-01 00:19:32+00:19:32"


def test_text_without_offset_is_read_in_the_session_zone() -> None:
    read = in_zone("America/New_York", lambda: decode_parameter(TIMESTAMPTZ, TEXT_FORMAT, b"2024-01-15 07:00:00"))
    assert read == datetime(2024, 1, 15, 12, 0, tzinfo=timezone.utc)
    explicit = in_zone("America/New_York", lambda: decode_parameter(TIMESTAMPTZ, TEXT_FORMAT, b"2024-01-15 07:00:00+00"))
    assert explicit == datetime(2024, 1, 15, 7, 0, tzinfo=timezone.utc)


def test_outside_a_session_it_is_utc() -> None:
    assert contextvars.Context().run(lambda: encode_value(TIMESTAMPTZ, TEXT_FORMAT, NOON_UTC)) == \
        b"2024-01-15 12:00:00.25+00"


def test_zone_names() -> None:
    assert canonical_zone_name("america/new_york") == "America/New_York"
    assert canonical_zone_name("gmt") == "UTC"
    assert canonical_zone_name("Mars/Olympus") is None
    with pytest.raises(ValueError):
        zone_named("Mars/Olympus")
    assert offset_text(timedelta(hours=-5)) == "-05"
    assert offset_text(timedelta(hours=5, minutes=45)) == "+05:45"


moments = st.datetimes(min_value=datetime(1901, 1, 1), max_value=datetime(2200, 1, 1),
                       timezones=st.just(timezone.utc))


@given(moment=moments, zone=st.sampled_from(ZONES))
def test_binary_ignores_the_zone_and_text_round_trips(moment: datetime, zone: str) -> None:
    binary = in_zone(zone, lambda: encode_value(TIMESTAMPTZ, BINARY_FORMAT, moment))
    assert binary == contextvars.Context().run(lambda: encode_value(TIMESTAMPTZ, BINARY_FORMAT, moment))
    text = in_zone(zone, lambda: encode_value(TIMESTAMPTZ, TEXT_FORMAT, moment))
    assert text is not None
    assert in_zone(zone, lambda: decode_parameter(TIMESTAMPTZ, TEXT_FORMAT, text)) == moment
    # and read in any other zone it is still the same instant: the offset travels with the text
    assert in_zone("UTC", lambda: decode_parameter(TIMESTAMPTZ, TEXT_FORMAT, text)) == moment
