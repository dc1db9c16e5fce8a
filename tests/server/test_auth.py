"""Token auth: who may call which route (401 / 403 / allowed), configuration errors, and
constant-time comparison against every configured token."""

from __future__ import annotations

import hmac

import pytest

from dex_ha.server.api_spec import ROUTES, ROUTES_BY_NAME
from dex_ha.server.auth import ROLES, AuthError, TokenAuth
from dex_ha.server.openapi import openapi_document

CLIENT_TOKEN = "client-token-0123456789"
WORKER_TOKEN = "worker-token-0123456789"
ADMIN_TOKEN = "admin-token-0123456789"
SECOND_CLIENT_TOKEN = "client-token-second-abcdef"
TOKENS = {"client": [CLIENT_TOKEN, SECOND_CLIENT_TOKEN], "worker": [WORKER_TOKEN], "admin": [ADMIN_TOKEN]}

BEARER = {
    "client": f"Bearer {CLIENT_TOKEN}",
    "worker": f"Bearer {WORKER_TOKEN}",
    "admin": f"Bearer {ADMIN_TOKEN}",
    "none": None,
    "unknown": "Bearer not-a-configured-token-at-all",
    "malformed": f"Token {CLIENT_TOKEN}",
}

# route -> caller -> expected: a role (allowed, the role returned), None (allowed, no role), 401 or 403.
EXPECTED = {
    "create_session": {
        "client": "client",
        "worker": 403,
        "admin": "admin",
        "none": 401,
        "unknown": 401,
        "malformed": 401,
    },
    "worker_poll": {"client": 403, "worker": "worker", "admin": "admin", "none": 401, "unknown": 401, "malformed": 401},
    "step_down": {"client": 403, "worker": 403, "admin": "admin", "none": 401, "unknown": 401, "malformed": 401},
    "cluster": {
        "client": "client",
        "worker": "worker",
        "admin": "admin",
        "none": 401,
        "unknown": 401,
        "malformed": 401,
    },
    "metrics": {"client": None, "worker": None, "admin": None, "none": None, "unknown": None, "malformed": None},
}


@pytest.fixture
def auth() -> TokenAuth:
    return TokenAuth(TOKENS)


@pytest.mark.parametrize(("route_name", "caller"), [(r, c) for r in EXPECTED for c in BEARER])
def test_who_may_call_what(auth, route_name, caller):
    route = ROUTES_BY_NAME[route_name]
    expected = EXPECTED[route_name][caller]
    if expected in (401, 403):
        with pytest.raises(AuthError) as caught:
            auth.check(BEARER[caller], route)
        assert caught.value.status == expected
        assert caught.value.code == {401: "unauthorized", 403: "forbidden"}[expected]
    else:
        assert auth.check(BEARER[caller], route) == expected


def test_a_forbidden_answer_names_the_role_needed(auth):
    with pytest.raises(AuthError) as caught:
        auth.check(BEARER["worker"], ROUTES_BY_NAME["send_message"])
    assert "client" in caught.value.message and "worker" in caught.value.message
    with pytest.raises(AuthError) as caught:
        auth.check(BEARER["client"], ROUTES_BY_NAME["add_member"])
    assert "the admin role" in caught.value.message


def test_an_unauthorized_answer_asks_for_a_bearer_token(auth):
    with pytest.raises(AuthError) as caught:
        auth.check(None, ROUTES_BY_NAME["get_session"])
    assert caught.value.headers == {"WWW-Authenticate": 'Bearer realm="dex-ha"'}
    with pytest.raises(AuthError) as caught:
        auth.check(BEARER["worker"], ROUTES_BY_NAME["get_session"])
    assert caught.value.headers == {}


@pytest.mark.parametrize("route_name", sorted(r.name for r in ROUTES if r.roles is not None))
def test_admin_may_call_every_route_that_has_roles(auth, route_name):
    assert auth.check(BEARER["admin"], ROUTES_BY_NAME[route_name]) == "admin"


@pytest.mark.parametrize("route_name", sorted(r.name for r in ROUTES if r.roles is not None))
def test_every_route_with_roles_refuses_a_missing_token(auth, route_name):
    with pytest.raises(AuthError) as caught:
        auth.check(None, ROUTES_BY_NAME[route_name])
    assert caught.value.status == 401


def test_every_token_of_a_role_works(auth):
    assert auth.check(f"Bearer {SECOND_CLIENT_TOKEN}", ROUTES_BY_NAME["send_message"]) == "client"


@pytest.mark.parametrize(
    ("header", "role"),
    [
        (f"Bearer {CLIENT_TOKEN}", "client"),
        (f"bearer {WORKER_TOKEN}", "worker"),  # the scheme is case-insensitive
        (f"  BEARER   {ADMIN_TOKEN}  ", "admin"),
        (f"Bearer {CLIENT_TOKEN[:-1]}", None),  # a prefix is not the token
        (f"Bearer {CLIENT_TOKEN}x", None),
        (f"Bearer {CLIENT_TOKEN.upper()}", None),
        (f"Bearer {CLIENT_TOKEN} {WORKER_TOKEN}", None),
        (f"Basic {CLIENT_TOKEN}", None),
        (CLIENT_TOKEN, None),
        ("Bearer", None),
        ("Bearer ", None),
        ("", None),
        (None, None),
        ("Bearer tökén-with-non-ascii-chars", None),
    ],
)
def test_role_of(auth, header, role):
    assert auth.role_of(header) == role


def test_operations_routes_never_need_a_token_and_the_openapi_text_says_so():
    """No setting makes them need one, so the document must not say one could."""
    auth = TokenAuth(TOKENS)
    document = openapi_document(version="1")
    for route in ROUTES:
        if route.roles is None:
            assert auth.check(None, route) is None
            description = document["paths"][route.path][route.method.lower()]["description"]
            assert description.startswith("No token needed:") and "configured" not in description, description


@pytest.mark.parametrize("tokens", [None, {}, {"client": [], "worker": (), "admin": []}])
def test_without_tokens_auth_is_disabled_and_allows_everything(tokens):
    auth = TokenAuth(tokens)
    assert not auth.enabled
    for route in ROUTES:
        assert auth.check(None, route) is None


def test_with_a_token_auth_is_enabled():
    assert TokenAuth({"worker": [WORKER_TOKEN]}).enabled


def test_roles():
    assert ROLES == ("client", "worker", "admin")


# ---------------------------------------------------------------- constant time


def test_every_configured_token_is_compared_with_compare_digest(monkeypatch, auth):
    real_compare = hmac.compare_digest
    calls: list[tuple[bytes, bytes]] = []

    def counting_compare(a, b):
        calls.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting_compare)
    configured = sum(len(tokens) for tokens in TOKENS.values())
    for header, role in [(BEARER["client"], "client"), (BEARER["admin"], "admin"), (BEARER["unknown"], None)]:
        calls.clear()
        assert auth.role_of(header) == role
        assert len(calls) == configured  # no early exit on the first match
        assert len({b for _, b in calls}) == configured  # ... and each configured token once


# ---------------------------------------------------------------- configuration errors


@pytest.mark.parametrize(
    ("tokens", "error", "words"),
    [
        ({"operator": ["x" * 20]}, ValueError, ["'operator'"]),
        ({"client": [""]}, ValueError, ["'client'", "empty"]),
        ({"worker": ["fifteen-chars-x"]}, ValueError, ["'worker'", "shorter than 16"]),
        (
            {"client": ["same-token-0123456789"], "admin": ["same-token-0123456789"]},
            ValueError,
            ["'client'", "'admin'"],
        ),
        ({"client": "a-single-string-token"}, TypeError, ["'client'"]),
        ({"client": [12345678901234567890]}, TypeError, ["'client'"]),
        ({"client": ["has a space in it 0123"]}, ValueError, ["'client'"]),
        ({"client": ["non-ascii-tökén-0123456"]}, ValueError, ["'client'"]),
    ],
)
def test_bad_configuration_is_refused(tokens, error, words):
    with pytest.raises(error) as caught:
        TokenAuth(tokens)
    for word in words:
        assert word in str(caught.value)
    for role_tokens in tokens.values():  # secrets stay out of error messages (they end up in logs)
        for token in [role_tokens] if isinstance(role_tokens, str) else role_tokens:
            if isinstance(token, str) and token:
                assert token not in str(caught.value)


def test_a_token_of_exactly_16_characters_is_accepted():
    auth = TokenAuth({"client": ["0123456789abcdef"]})
    assert auth.role_of("Bearer 0123456789abcdef") == "client"


def test_the_same_token_twice_in_one_role_is_harmless():
    auth = TokenAuth({"client": [CLIENT_TOKEN, CLIENT_TOKEN]})
    assert auth.role_of(BEARER["client"]) == "client"


def test_tokens_are_not_kept_in_clear(auth):
    kept = repr(vars(auth))
    assert CLIENT_TOKEN not in kept and CLIENT_TOKEN.encode().hex() not in kept


def test_auth_error_statuses():
    assert (AuthError(401, "m").code, AuthError(403, "m").code) == ("unauthorized", "forbidden")
    with pytest.raises(ValueError):
        AuthError(500, "m")
