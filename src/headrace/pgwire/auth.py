"""Authentication, sans-I/O: which method a connection must use (rules like pg_hba.conf), and the
cleartext-password and SCRAM-SHA-256 exchanges as objects fed the payloads of 'p' messages.

Rules are tried in order, the first match decides (as pg_hba.conf). Text form, comma separated:
    METHOD                              every connection
    [KIND ][USER@]HOSTS=METHOD          HOSTS: all | loopback | an address or CIDR network
KIND is pg_hba.conf's connection type: `host` (any TCP connection, the default), `hostssl` (only connections
that completed TLS) or `hostnossl` (only connections without TLS). e.g. "headrace@loopback=trust,all=scram-sha-256"
(the default: trusts loopback only), or "loopback=trust,hostssl all=scram-sha-256" to require TLS of every other
client: a connection no rule matches is refused with 28000 "no pg_hba.conf entry ...", as PostgreSQL does.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Protocol

from headrace.catalog.roles import ScramVerifier, make_scram_verifier
from headrace.errors import HeadraceError
from headrace.pgwire import messages

SCRAM_SHA_256 = "SCRAM-SHA-256"
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AuthMethod(enum.Enum):
    TRUST = "trust"
    PASSWORD = "password"  # cleartext: use it over TLS
    SCRAM_SHA_256 = "scram-sha-256"
    REJECT = "reject"


class CredentialStore(Protocol):
    def password_verifier(self, user: str) -> ScramVerifier | None:
        """The verifier of a role that may log in with a password, else None."""
        ...


class AuthenticationFailed(HeadraceError):
    sqlstate = "28P01"
    severity = "FATAL"


class ConnectionKind(enum.Enum):
    """pg_hba.conf's first column, for TCP connections."""

    HOST = "host"  # with or without TLS
    HOSTSSL = "hostssl"  # only over TLS
    HOSTNOSSL = "hostnossl"  # only without TLS


@dataclass(frozen=True, slots=True)
class AuthRule:
    method: AuthMethod
    user: str | None = None  # None: every user
    hosts: str | IPNetwork = "all"  # "all" | "loopback" | a network
    kind: ConnectionKind = ConnectionKind.HOST

    def matches(self, user: str, address: str | None, tls: bool = False) -> bool:
        if self.user is not None and self.user != user:
            return False
        if (self.kind is ConnectionKind.HOSTSSL and not tls) or (self.kind is ConnectionKind.HOSTNOSSL and tls):
            return False
        if self.hosts == "all":
            return True
        client = _ip_address(address)
        if self.hosts == "loopback":
            return client is None or client.is_loopback  # None: a Unix socket, local like loopback
        assert not isinstance(self.hosts, str)
        return client is not None and client.version == self.hosts.version and client in self.hosts

    def trusts_beyond_loopback(self) -> bool:
        """A trust rule that can match a client on another machine (refused on a public address without --insecure)."""
        if self.method is not AuthMethod.TRUST or self.hosts == "loopback":
            return False
        return self.hosts == "all" or not self.hosts.is_loopback  # type: ignore[union-attr]


DEFAULT_AUTH_RULES = (AuthRule(AuthMethod.TRUST, hosts="loopback"), AuthRule(AuthMethod.SCRAM_SHA_256))


def parse_auth_rules(text: str) -> tuple[AuthRule, ...]:
    """Parse the --auth option; raises ValueError with a message fit for the command line."""
    rules = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        target, _, method_text = entry.rpartition("=")
        try:
            method = AuthMethod(method_text.strip().lower())
        except ValueError:
            choices = ", ".join(method.value for method in AuthMethod)
            raise ValueError(f"unknown authentication method {method_text!r} (one of {choices})") from None
        kind = ConnectionKind.HOST
        words = target.split()
        if len(words) == 2:
            try:
                kind = ConnectionKind(words[0].lower())
            except ValueError:
                raise ValueError(f"unknown connection type {words[0]!r} in --auth (host, hostssl or hostnossl)") from None
            target = words[1]
        elif len(words) > 2:
            raise ValueError(f"bad --auth rule {entry!r}: [host|hostssl|hostnossl ][USER@]HOSTS=METHOD")
        user, _, hosts_text = target.rpartition("@") if "@" in target else ("", "", target)
        hosts_text = hosts_text.strip().lower() or "all"
        hosts: str | IPNetwork = hosts_text
        if hosts_text not in ("all", "loopback"):
            try:
                hosts = ipaddress.ip_network(hosts_text, strict=False)
            except ValueError:
                raise ValueError(f"bad host {hosts_text!r} in --auth (all, loopback, an address or a CIDR)") from None
        rules.append(AuthRule(method, user.strip() or None, hosts, kind))
    if not rules:
        raise ValueError("--auth needs at least one rule")
    return tuple(rules)


def choose_method(rules: tuple[AuthRule, ...], user: str, address: str | None, tls: bool = False) -> AuthMethod:
    for rule in rules:
        if rule.matches(user, address, tls):
            return rule.method
    return AuthMethod.REJECT


def rejection(user: str, address: str | None, tls: bool, database: str | None = None) -> HeadraceError:
    """PostgreSQL's words for a connection no pg_hba.conf line matches (an explicit `reject` rule included)."""
    on = f', database "{database}"' if database is not None else ""
    return HeadraceError(f'no pg_hba.conf entry for host "{address or "[local]"}", user "{user}"{on}, '
                         f'{"SSL encryption" if tls else "no encryption"}', sqlstate="28000")


def insecure_trust_rules(rules: tuple[AuthRule, ...], host: str) -> list[AuthRule]:
    """The trust rules that would let clients on other machines in without a password when the server listens on
    `host`: none unless `host` is reachable from elsewhere (not a loopback address or name)."""
    if _listens_on_loopback_only(host):
        return []
    return [rule for rule in rules if rule.trusts_beyond_loopback()]


def _listens_on_loopback_only(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    address = _ip_address(host)
    return address is not None and address.is_loopback


def _ip_address(address: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not address:
        return None
    try:
        parsed = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped
    return parsed


def _failed(user: str) -> AuthenticationFailed:
    return AuthenticationFailed(f'password authentication failed for user "{user}"')


class Handshake(Protocol):
    def start(self) -> bytes:
        """The Authentication request to send first."""
        ...

    def receive(self, payload: bytes) -> tuple[bytes, bool]:
        """Handle one 'p' message: (what to send back, whether the client is now authenticated).
        Raises AuthenticationFailed (28P01) or a ProtocolViolation-like HeadraceError (08P01)."""
        ...


class CleartextPasswordHandshake:
    def __init__(self, user: str, credentials: CredentialStore) -> None:
        self._user = user
        self._credentials = credentials

    def start(self) -> bytes:
        return messages.authentication_cleartext_password()

    def receive(self, payload: bytes) -> tuple[bytes, bool]:
        password = payload.split(b"\0", 1)[0].decode("utf-8", "replace")
        if not password:
            raise AuthenticationFailed("empty password returned by client")
        verifier = self._credentials.password_verifier(self._user)
        if verifier is None or not verifier.matches_password(password):
            raise _failed(self._user)
        return b"", True


class ScramSha256Handshake:
    """SASL with SCRAM-SHA-256 (RFC 5802/7677), no channel binding (-PLUS is not offered, so libpq
    with channel_binding=prefer still authenticates over TLS). The server side is done here rather
    than by scramp's ScramServer: libpq sends an empty user name ("n=,"; PostgreSQL takes the name
    from the startup packet), which scramp refuses. scramp makes the verifiers (SASLprep, PBKDF2)."""

    def __init__(self, user: str, credentials: CredentialStore) -> None:
        self._user = user
        verifier = credentials.password_verifier(user)
        # An unknown user runs the whole exchange against a throwaway verifier and fails at the
        # proof, as PostgreSQL's mock authentication does: the answer does not reveal who exists.
        self._known = verifier is not None
        self._verifier = verifier or make_scram_verifier(secrets.token_urlsafe(16))
        self._step = 0
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def start(self) -> bytes:
        return messages.authentication_sasl([SCRAM_SHA_256])

    def receive(self, payload: bytes) -> tuple[bytes, bool]:
        self._step += 1
        if self._step == 1:
            return self._client_first(payload), False
        if self._step == 2:
            return self._client_final(payload), True
        raise HeadraceError("unexpected SASL response", sqlstate="08P01")

    def _client_first(self, payload: bytes) -> bytes:
        mechanism, _, rest = payload.partition(b"\0")
        if mechanism.decode("utf-8", "replace") != SCRAM_SHA_256:
            raise HeadraceError("client selected an invalid SASL authentication mechanism", sqlstate="28000")
        if len(rest) < 4 or int.from_bytes(rest[:4], "big", signed=True) != len(rest) - 4:
            raise HeadraceError("malformed SASLInitialResponse message", sqlstate="08P01")
        text = _utf8(rest[4:])
        # gs2-header: "n,," or "y,," (no channel binding), optionally "a=authzid" in the middle.
        if not (text.startswith("n,") or text.startswith("y,")) or text.count(",") < 3:
            raise HeadraceError("malformed SCRAM message: unsupported or missing GS2 header", sqlstate="08P01")
        bare = text.split(",", 2)[2]
        attributes = _attributes(bare)
        client_nonce = attributes.get("r", "")
        if "n" not in attributes or not client_nonce or "m" in attributes:
            raise HeadraceError("malformed SCRAM message: client-first-message", sqlstate="08P01")
        verifier = self._verifier
        self._client_first_bare = bare
        self._nonce = client_nonce + base64.b64encode(secrets.token_bytes(18)).decode("ascii")
        self._server_first = (f"r={self._nonce},s={base64.b64encode(verifier.salt).decode('ascii')},"
                              f"i={verifier.iterations}")
        return messages.authentication_sasl_continue(self._server_first.encode("utf-8"))

    def _client_final(self, payload: bytes) -> bytes:
        text = _utf8(payload)
        without_proof, separator, proof_text = text.rpartition(",p=")
        attributes = _attributes(without_proof)
        if not separator or attributes.get("r") != self._nonce or attributes.get("c") not in ("biws", "eSws"):
            raise HeadraceError("malformed SCRAM message: client-final-message", sqlstate="08P01")
        try:
            proof = base64.b64decode(proof_text, validate=True)
        except ValueError:
            raise HeadraceError("malformed SCRAM message: proof", sqlstate="08P01") from None
        verifier = self._verifier
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode("utf-8")
        client_signature = hmac.new(verifier.stored_key, auth_message, hashlib.sha256).digest()
        if len(proof) != len(client_signature):
            raise _failed(self._user)
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), verifier.stored_key) or not self._known:
            raise _failed(self._user)
        server_signature = hmac.new(verifier.server_key, auth_message, hashlib.sha256).digest()
        return messages.authentication_sasl_final(b"v=" + base64.b64encode(server_signature))


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise HeadraceError("malformed SCRAM message: not UTF-8", sqlstate="08P01") from None


def _attributes(text: str) -> dict[str, str]:
    """SCRAM's "k=v,k=v" attributes (values may contain '=')."""
    attributes = {}
    for part in text.split(","):
        key, separator, value = part.partition("=")
        if not separator or len(key) != 1:
            raise HeadraceError("malformed SCRAM message: attribute", sqlstate="08P01")
        attributes[key] = value
    return attributes


def make_handshake(method: AuthMethod, user: str, credentials: CredentialStore) -> Handshake:
    if method is AuthMethod.PASSWORD:
        return CleartextPasswordHandshake(user, credentials)
    if method is AuthMethod.SCRAM_SHA_256:
        return ScramSha256Handshake(user, credentials)
    raise ValueError(f"{method} needs no handshake")
