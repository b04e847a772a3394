"""Catalog items: what a user created, as data. The catalog persists each source's `create_sql`
and rebuilds items from it on start, so a definition has exactly one source of truth. Secrets are
the exception: their values never enter the catalog (see catalog/secrets.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_DATABASE = "headrace"
DEFAULT_SCHEMA = "public"

US_PER_HOUR = 3_600_000_000
DEFAULT_WINDOW_US = 24 * US_PER_HOUR  # IDEMPOTENT ... WINDOW '24 hours' unless said otherwise
MAX_WINDOW_US = 30 * 24 * US_PER_HOUR  # dedupe state is kept on disk for the window: bound it

BODY_FORMATS = ("text", "json", "json_array", "bytes")

# name -> value of a secret (None if there is no such secret); never part of an item's repr
SecretLookup = Callable[[str], bytes | None]


@dataclass(frozen=True, slots=True)
class HeaderColumn:
    """INCLUDE HEADER '<header>' AS <column> [BYTES]: one header as its own nullable column."""

    header: str  # lower-cased, as request header names are
    column: str
    as_bytes: bool = False


@dataclass(frozen=True, slots=True)
class CheckOption:
    """One entry of CHECK ( WITH (...) ): what the CHECK expression may read, and under which name."""

    kind: str  # "body" | "headers" | "secret"
    alias: str
    as_bytes: bool = False
    secret: str | None = None  # the secret's name, for kind "secret"


@dataclass(frozen=True, slots=True)
class WebhookSource:
    """CREATE SOURCE <name> FROM WEBHOOK ...

    `id` is stable for the life of the item ("u1", "u2", ...): it names the source's log directory,
    its Spark checkpoint and its serving-store table, so DROP + CREATE of the same name starts afresh."""

    id: str
    name: str
    body_format: str  # one of BODY_FORMATS
    include_headers: bool  # INCLUDE HEADERS: a `headers` column
    idempotent_expr: str | None  # the IDEMPOTENT expression as the user wrote it, or None
    create_sql: str
    schema: str = DEFAULT_SCHEMA
    database: str = DEFAULT_DATABASE
    headers_allowed: tuple[str, ...] = ()  # INCLUDE HEADERS ('a', ...): only these (empty: all)
    headers_excluded: tuple[str, ...] = ()  # INCLUDE HEADERS (NOT 'a', ...): never these
    header_columns: tuple[HeaderColumn, ...] = ()
    check_expr: str | None = None  # the CHECK expression as the user wrote it
    check_options: tuple[CheckOption, ...] = ()
    window_us: int = DEFAULT_WINDOW_US  # how long an idempotency key is remembered
    secret_lookup: SecretLookup | None = field(default=None, repr=False, compare=False)

    @property
    def materialization(self) -> str:
        """The name under which the pipeline materializes this source into the serving store."""
        return f"source_{self.id}"

    @property
    def body_type(self) -> str:
        """The SQL type of the body column: jsonb, text or bytea."""
        return {"text": "text", "bytes": "bytea"}.get(self.body_format, "jsonb")

    def column_names(self) -> list[str]:
        """The user-visible columns, in order: body, headers, each INCLUDE HEADER column, received_at,
        idempotency_key (see webhook/rows.py for their types)."""
        cols = ["body"]
        if self.include_headers:
            cols.append("headers")
        cols.extend(column.column for column in self.header_columns)
        cols.append("received_at")
        if self.idempotent_expr is not None:
            cols.append("idempotency_key")
        return cols

    def keeps_header(self, name: str) -> bool:
        """Whether the `headers` column keeps header `name` (INCLUDE HEADERS and its filter)."""
        if not self.include_headers or name in self.headers_excluded:
            return False
        return not self.headers_allowed or name in self.headers_allowed

    def secret_names(self) -> list[str]:
        return [option.secret for option in self.check_options if option.secret is not None]


@dataclass(frozen=True, slots=True)
class Secret:
    """CREATE SECRET <name> AS '...': the catalog keeps its name; its value lives in the secret store."""

    id: str
    name: str
    schema: str = DEFAULT_SCHEMA
    database: str = DEFAULT_DATABASE
