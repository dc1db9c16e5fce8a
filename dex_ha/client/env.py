"""Where the `dex-ha` commands and both SDKs find the cluster when they are not told.

`dex-ha cluster up` writes `tokens.env` with these exports (source it in a shell):

    DEX_HA_URLS          the node URLs, comma-separated ("http://127.0.0.1:8801,http://127.0.0.1:8802")
    DEX_HA_TOKEN         the admin token (every `dex-ha` command reads it)
    DEX_HA_CLIENT_TOKEN  the client token (DexClient reads it before DEX_HA_TOKEN)
    DEX_HA_WORKER_TOKEN  the worker token (Worker reads it before DEX_HA_TOKEN)
    DEX_HA_ADMIN_TOKEN   the admin token again, by its role's name
    DEX_HA_NAMESPACE     the namespace to work in (both SDKs and the dex-ha commands; not
                         written by `cluster up`: unset, the server uses `default`, or the
                         only namespace of a token limited to one)

An argument always wins over the environment; with neither, the URL is the one of
`dex-ha dev` (http://127.0.0.1:8801) and there is no token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

URLS_VAR = "DEX_HA_URLS"
TOKEN_VAR = "DEX_HA_TOKEN"
CLIENT_TOKEN_VAR = "DEX_HA_CLIENT_TOKEN"
WORKER_TOKEN_VAR = "DEX_HA_WORKER_TOKEN"
NAMESPACE_VAR = "DEX_HA_NAMESPACE"
DEFAULT_NAMESPACE = "default"  # the API's namespace of whatever names none (docs/api.md)
DEFAULT_URL = "http://127.0.0.1:8801"  # where `dex-ha dev` listens


def split_urls(text: str) -> list[str]:
    """The URLs of a comma-separated list (DEX_HA_URLS), blanks dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


def urls_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """The URLs of DEX_HA_URLS, or [DEFAULT_URL] when it is unset or blank."""
    environ = os.environ if environ is None else environ
    return split_urls(environ.get(URLS_VAR, "")) or [DEFAULT_URL]


def token_from_env(*names: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The first of the variables `names` that is set and not blank, else None (no token)."""
    environ = os.environ if environ is None else environ
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


def namespace_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The namespace of DEX_HA_NAMESPACE, or None (name none: the server decides) when it
    is unset or blank."""
    return token_from_env(NAMESPACE_VAR, environ=environ)  # the same rule: set and not blank
