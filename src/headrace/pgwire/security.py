"""What a pgwire server needs to secure connections: authentication rules, where verifiers come
from, and the TLS context (None: SSLRequest is answered 'N')."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from headrace.catalog.roles import ScramVerifier
from headrace.pgwire.auth import DEFAULT_AUTH_RULES, AuthRule, CredentialStore


class NoCredentials:
    """No role has a password: only trust rules can let anyone in."""

    def password_verifier(self, user: str) -> ScramVerifier | None:
        return None


@dataclass(frozen=True)
class SecurityConfig:
    auth_rules: tuple[AuthRule, ...] = DEFAULT_AUTH_RULES
    credentials: CredentialStore = field(default_factory=NoCredentials)
    tls: ssl.SSLContext | None = None


def make_tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server context for the certificate chain and key (PEM); TLS 1.2 or newer, as PostgreSQL's
    default ssl_min_protocol_version."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context
