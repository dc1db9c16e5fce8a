"""Bearer-token authentication and role checks.

Every token has one role: `client`, `worker` or `admin`. A route lists the roles that may
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


class TokenAuth:
    """The configured tokens by role; `check` decides whether a request may call a route."""

    def __init__(self, tokens: Mapping[str, Iterable[str]] | None) -> None:
        self._digests: list[tuple[str, bytes]] = _digests_by_role(tokens or {})

    @property
    def enabled(self) -> bool:
        """False when no token is configured: every request is allowed (`dex-ha dev`)."""
        return bool(self._digests)

    def role_of(self, authorization: str | None) -> str | None:
        """The role of the token in an `Authorization: Bearer <token>` header, or None."""
        token = _bearer_token(authorization)
        if token is None:
            return None
        presented = _digest(token)
        role_found = None
        for role, digest in self._digests:  # every token, no early exit (see the module docstring)
            if hmac.compare_digest(presented, digest):
                role_found = role
        return role_found

    def check(self, authorization: str | None, route: RouteSpec) -> str | None:
        """The caller's role if it may call `route`; raises AuthError 401 or 403 otherwise.

        Returns None when authentication is disabled, and for operations routes that need
        no token.
        """
        if not self.enabled:
            return None
        if route.roles is None:
            return None
        role = self._authenticate(authorization)
        if role == "admin" or role in route.roles:
            return role
        raise AuthError(
            403, f"{route.method} {route.path} needs {_role_names(route.roles)} (this token has the {role} role)"
        )

    def _authenticate(self, authorization: str | None) -> str:
        if authorization is None or not authorization.strip():
            raise AuthError(401, "missing Authorization header: send 'Authorization: Bearer <token>'")
        if _bearer_token(authorization) is None:
            raise AuthError(401, "malformed Authorization header: expected 'Bearer <token>'")
        role = self.role_of(authorization)
        if role is None:
            raise AuthError(401, "unknown token")
        return role


def token_digest(authorization: str | None) -> bytes | None:
    """What names the caller's token without being it (its SHA-256 digest), for counting
    per token (the cap on event streams); None without a bearer token."""
    token = _bearer_token(authorization)
    return None if token is None else _digest(token)


# ---------------------------------------------------------------- helpers


def _digests_by_role(tokens: Mapping[str, Iterable[str]]) -> list[tuple[str, bytes]]:
    """(role, digest) for every configured token; raises for a bad configuration."""
    role_by_token: dict[str, str] = {}
    for role, role_tokens in tokens.items():
        if role not in ROLES:
            raise ValueError(f"tokens: unknown role {role!r} (roles are {', '.join(ROLES)})")
        if isinstance(role_tokens, (str, bytes)):
            raise TypeError(f"tokens[{role!r}]: must be a list of tokens, not a single string")
        for token in role_tokens:
            _check_token(role, token)
            other = role_by_token.setdefault(token, role)
            if other != role:
                raise ValueError(f"tokens[{role!r}]: a token of role {role!r} is also a token of role {other!r}")
    return [(role, _digest(token)) for token, role in role_by_token.items()]


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
