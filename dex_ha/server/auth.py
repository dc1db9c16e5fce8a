"""Bearer-token authentication, role checks and namespace scopes.

Every token has one role: `client`, `worker` or `admin`, and the namespaces it may use:
the tokens of `[tokens]` may use every namespace, a token of `[[scoped_tokens]]` only those
it lists (docs/operations.md, "Namespaces and tokens"). Admin tokens use every namespace. A route lists the roles that may
call it (api_spec.py); `admin` may call every route that has roles, so an operator can do
what a client or a Worker can. Operations routes (`roles` None: /livez, /readyz, /metrics,
/openapi.json) need no token, because load balancers and Prometheus probe them.

Tokens are compared in constant time: the presented token's SHA-256 digest is compared with
`hmac.compare_digest` against the digest of EVERY configured token, without stopping at a
match, so neither the position of the matching token nor a matching prefix nor the length
of a configured token shows in the response time. Only digests are kept, so a repr or a
crash dump of the auth object reveals no token.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dex_ha.engine import DEFAULT_NAMESPACE
from dex_ha.server.api_spec import RouteSpec
from dex_ha.server.errors import HttpError

ROLES = ("client", "worker", "admin")
MIN_TOKEN_LENGTH = 16


class AuthError(HttpError):
    """401 `unauthorized` (no valid token) or 403 `forbidden` (the token's role may not call the route).
    A 401 tells the caller which scheme to use (RFC 6750) in WWW-Authenticate."""

    def __init__(self, status: int, message: str) -> None:
        if status not in (401, 403):
            raise ValueError(f"status: must be 401 or 403 (got {status})")
        headers = {"WWW-Authenticate": 'Bearer realm="dex-ha"'} if status == 401 else {}
        super().__init__(status, "unauthorized" if status == 401 else "forbidden", message, headers)
        self.message = message


@dataclass(frozen=True, slots=True)
class ScopedToken:
    """A token that may use only `namespaces` (`[[scoped_tokens]]` in the configuration)."""

    role: str
    namespaces: tuple[str, ...]
    value: str

    def __repr__(self) -> str:  # never the token itself: configurations end up in logs
        return f"ScopedToken(role={self.role!r}, namespaces={self.namespaces!r})"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: the role of its token (None when no token is needed: no tokens
    are configured, or an operations route) and the namespaces it may use (None: every one)."""

    role: str | None
    namespaces: frozenset[str] | None

    def namespace(self, named: str | None) -> str:
        """The namespace a request works in: the one it names (header Dex-Namespace), else
        the token's only namespace, else `default`; AuthError 403 if the token may not use it."""
        if named is None:
            named = next(iter(self.namespaces)) if self.namespaces and len(self.namespaces) == 1 else DEFAULT_NAMESPACE
        if self.namespaces is not None and named not in self.namespaces:
            raise AuthError(
                403,
                f"namespace: this token may not use namespace {named!r} (it may use "
                f"{', '.join(sorted(self.namespaces))}; name one in the Dex-Namespace header)",
            )
        return named


NO_TOKEN_NEEDED = Caller(role=None, namespaces=None)
# Another node of the cluster, on the routes it calls with the cluster's own credential
# (node_credential.py): it may use no namespace.
NODE_CALLER = Caller(role="node", namespaces=frozenset())


@dataclass(frozen=True, slots=True)
class _Token:
    role: str
    namespaces: frozenset[str] | None  # None: every namespace
    digest: bytes


class TokenAuth:
    """The configured tokens; `caller` decides whether a request may call a route."""

    def __init__(self, tokens: Mapping[str, Iterable[str]] | None, scoped: Iterable[ScopedToken] = ()) -> None:
        self._tokens: list[_Token] = _configured_tokens(tokens or {}, scoped)

    @property
    def enabled(self) -> bool:
        """False when no token is configured: every request is allowed (`dex-ha dev`)."""
        return bool(self._tokens)

    def role_of(self, authorization: str | None) -> str | None:
        """The role of the token in an `Authorization: Bearer <token>` header, or None."""
        found = self._lookup(authorization)
        return None if found is None else found.role

    def _lookup(self, authorization: str | None) -> _Token | None:
        token = _bearer_token(authorization)
        if token is None:
            return None
        presented = _digest(token)
        found = None
        for candidate in self._tokens:  # every token, no early exit (see the module docstring)
            if hmac.compare_digest(presented, candidate.digest):
                found = candidate
        return found

    def check(self, authorization: str | None, route: RouteSpec) -> str | None:
        """The caller's role if it may call `route` (see `caller`)."""
        return self.caller(authorization, route).role

    def caller(self, authorization: str | None, route: RouteSpec) -> Caller:
        """Who calls, if they may call `route`; raises AuthError 401 or 403 otherwise.

        NO_TOKEN_NEEDED when authentication is disabled, and for operations routes that
        need no token.
        """
        if not self.enabled or route.roles is None:
            return NO_TOKEN_NEEDED
        token = self._authenticate(authorization)
        if token.role == "admin" or token.role in route.roles:
            return Caller(token.role, token.namespaces)
        raise AuthError(
            403, f"{route.method} {route.path} needs {_role_names(route.roles)} (this token has the {token.role} role)"
        )

    def _authenticate(self, authorization: str | None) -> _Token:
        if authorization is None or not authorization.strip():
            raise AuthError(401, "missing Authorization header: send 'Authorization: Bearer <token>'")
        if _bearer_token(authorization) is None:
            raise AuthError(401, "malformed Authorization header: expected 'Bearer <token>'")
        token = self._lookup(authorization)
        if token is None:
            raise AuthError(401, "unknown token")
        return token


def token_digest(authorization: str | None) -> bytes | None:
    """What names the caller's token without being it (its SHA-256 digest), for counting
    per token (the cap on event streams); None without a bearer token."""
    token = _bearer_token(authorization)
    return None if token is None else _digest(token)


# ---------------------------------------------------------------- helpers


def _configured_tokens(tokens: Mapping[str, Iterable[str]], scoped: Iterable[ScopedToken]) -> list[_Token]:
    """Every configured token (digest, role, namespaces); raises for a bad configuration."""
    found: dict[str, _Token] = {}
    for role, role_tokens in tokens.items():
        if role not in ROLES:
            raise ValueError(f"tokens: unknown role {role!r} (roles are {', '.join(ROLES)})")
        if isinstance(role_tokens, (str, bytes)):
            raise TypeError(f"tokens[{role!r}]: must be a list of tokens, not a single string")
        for token in role_tokens:
            _check_token(role, token)
            _add_token(found, token, _Token(role, None, _digest(token)), f"tokens[{role!r}]")
    for i, entry in enumerate(scoped):
        where = f"scoped_tokens[{i}]"
        if entry.role not in ("client", "worker"):
            raise ValueError(f"{where}.role: must be client or worker (admin tokens use every namespace: [tokens])")
        if not entry.namespaces:
            raise ValueError(f"{where}.namespaces: must list at least one namespace")
        _check_token(entry.role, entry.value)
        _add_token(found, entry.value, _Token(entry.role, frozenset(entry.namespaces), _digest(entry.value)), where)
    return list(found.values())


def _add_token(found: dict[str, _Token], token: str, entry: _Token, where: str) -> None:
    other = found.setdefault(token, entry)
    if other.role != entry.role:
        raise ValueError(f"{where}: a token of role {entry.role!r} is also a token of role {other.role!r}")
    if other.namespaces != entry.namespaces:
        raise ValueError(f"{where}: a token is configured twice, with other namespaces")


def _check_token(role: str, token: object) -> None:
    # The messages never include the token: configuration errors end up in logs.
    if not isinstance(token, str):
        raise TypeError(f"tokens[{role!r}]: each token must be a string (got {type(token).__name__})")
    if not token:
        raise ValueError(f"tokens[{role!r}]: a token is empty")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"tokens[{role!r}]: a token is shorter than {MIN_TOKEN_LENGTH} characters")
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise ValueError(f"tokens[{role!r}]: a token must be printable ASCII without spaces")


def _bearer_token(authorization: str | None) -> str | None:
    """The token of 'Bearer <token>' (the scheme is case-insensitive, RFC 7235), or None."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def _digest(token: str) -> bytes:
    # Equal-length digests: compare_digest's time then depends on neither token's length.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _role_names(roles: frozenset[str]) -> str:
    names = sorted(roles | {"admin"})
    if len(names) == 1:
        return f"the {names[0]} role"
    return "one of the roles " + ", ".join(names)
