"""What every PostgreSQL type codec provides, and the errors its decoders may raise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Encoder = Callable[[Any], bytes]  # a non-NULL Python value -> its wire bytes
TextDecoder = Callable[[str], Any]  # a parameter's text form -> Python value
BinaryDecoder = Callable[[bytes], Any]  # a parameter's binary form -> Python value


class OutOfRange(ValueError):
    """The input is well-formed but does not fit the type (SQLSTATE 22003 / 22008)."""


class Unsupported(ValueError):
    """Valid PostgreSQL input that has no Python value here, e.g. 'infinity' or a 2-D array."""


@dataclass(frozen=True, slots=True)
class TypeCodec:
    """Text and binary encoders (result values) and decoders (Bind parameters) for one type.

    Decoders may raise ValueError (malformed input), OutOfRange or Unsupported; the registry turns
    them into HeadraceErrors with PostgreSQL's SQLSTATEs and messages."""

    encode_text: Encoder
    encode_binary: Encoder
    decode_text: TextDecoder
    decode_binary: BinaryDecoder
