"""Talking to a running cluster: which URLs and token to use, finding the active node,
one admin request, and the /v1/cluster view of every node.

Every request goes through the Client SDK's Connection, so the commands follow the
active node like the SDKs do. Without --url and --token they read DEX_HA_URLS and
DEX_HA_TOKEN, which `source DIR/tokens.env` sets after `dex-ha cluster up`
(dex_ha/client/env.py).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dex_ha.cli.common import EXIT_NO_NODE, EXIT_REFUSED, EXIT_USAGE, CommandFailed
from dex_ha.client import Connection, DexError, DexUnavailable
from dex_ha.client.env import (
    TOKEN_VAR,
    URLS_VAR,
    split_urls,
    token_from_env,
    urls_from_env,
)

# How long a command looks for the active node (an election takes about a second).
FIND_ACTIVE_TIMEOUT_S = 15.0
# How long one node may take to answer before it is marked as not answering.
NODE_ANSWER_TIMEOUT_S = 2.0

UNAUTHORIZED_HINT = f"401 unauthorized: set {TOKEN_VAR} or pass --token"


def urls_of(args: argparse.Namespace) -> list[str]:
    """--url (repeated or comma-separated), else $DEX_HA_URLS, else the dev URL; checked, no repeats."""
    given = [url for text in args.url for url in split_urls(text)] if args.url else None
    source = "--url" if given else URLS_VAR
    urls: list[str] = []
    for url in given or urls_from_env():
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise CommandFailed(f"{source}: expected http://host:port, got {url!r}", EXIT_USAGE)
        if url.strip().rstrip("/") not in urls:
            urls.append(url.strip().rstrip("/"))
    return urls


def token_of(args: argparse.Namespace) -> str | None:
    token: str | None = args.token
    return token or token_from_env(TOKEN_VAR)


def refusal(exc: DexError) -> str:
    """One line for a server's refusal (with a hint for the usual 401)."""
    if exc.status == 401:  # the usual first stumble: tokens.env not sourced
        return f"{UNAUTHORIZED_HINT} (the server said: {exc.message})"
    return f"refused ({exc.status} {exc.code}): {exc.message}"


async def find_active(urls: list[str], token: str | None, timeout_s: float = FIND_ACTIVE_TIMEOUT_S) -> str:
    """The URL of the active node: /readyz, following `leader_url` like the SDKs do.

    The member URLs that the nodes list join the given ones, so that one --url of any
    node is enough (a Connection follows `leader_url` only when it has several URLs).
    CommandFailed with exit 3 when no URL answers at all, or when no node becomes
    active within `timeout_s`.
    """
    answers = await gather_views(urls, token)
    if not any(a.view or a.refused for a in answers):
        raise CommandFailed(f"no dex-ha node answers at {', '.join(urls)}", EXIT_NO_NODE)
    if not any(a.view for a in answers):  # every node that answered refused (a token problem)
        raise CommandFailed(next(a.error or "refused" for a in answers if a.refused), EXIT_REFUSED)
    candidates = list(dict.fromkeys(urls + [a.url for a in answers]))
    async with Connection(
        candidates, token, give_up_after_s=timeout_s, request_timeout_s=NODE_ANSWER_TIMEOUT_S
    ) as conn:
        try:
            await conn.request("GET", "/readyz")
        except DexUnavailable as exc:
            raise CommandFailed(f"no active node within {timeout_s:.0f} s: {exc.message}", EXIT_NO_NODE) from None
        except DexError as exc:
            raise CommandFailed(refusal(exc), EXIT_REFUSED) from None
        return conn.current_url


async def call_once(
    url: str, token: str | None, method: str, path: str, body: Any = None, timeout_s: float = 30.0
) -> Any:
    """One request to one node, never repeated: an admin change must not run twice."""
    async with Connection(url, token, give_up_after_s=0, request_timeout_s=timeout_s) as conn:
        try:
            return await conn.request(method, path, body)
        except DexUnavailable as exc:
            raise CommandFailed(f"{url} did not answer as the active node: {exc.message}", EXIT_NO_NODE) from None
        except DexError as exc:
            raise CommandFailed(refusal(exc), EXIT_REFUSED) from None


async def call_active(
    args: argparse.Namespace, method: str, path: str, body: Any = None, timeout_s: float = 30.0
) -> Any:
    """One request to the active node (found first), never repeated."""
    url = await find_active(urls_of(args), token_of(args))
    return await call_once(url, token_of(args), method, path, body, timeout_s)


@dataclass
class NodeAnswer:
    """What one URL answered to GET /v1/cluster: the view (its JSON), or why there is none."""

    url: str
    view: dict[str, Any] | None = None
    error: str | None = None
    refused: bool = False  # it answered with an error status (it is up, but said no)
    status: int | None = None  # the HTTP status of a refusal


async def fetch_view(url: str, token: str | None) -> NodeAnswer:
    async with Connection(
        url, token, give_up_after_s=NODE_ANSWER_TIMEOUT_S / 2, request_timeout_s=NODE_ANSWER_TIMEOUT_S
    ) as conn:
        try:
            return NodeAnswer(url, view=await conn.request("GET", "/v1/cluster"))
        except DexUnavailable:
            return NodeAnswer(url, error="no answer")
        except DexError as exc:
            return NodeAnswer(url, error=refusal(exc), refused=True, status=exc.status)


async def gather_views(urls: list[str], token: str | None) -> list[NodeAnswer]:
    """/v1/cluster from the given URLs, then from every member URL they list that was not asked yet."""
    answers = list(await asyncio.gather(*(fetch_view(url, token) for url in urls)))
    seen_ids = {a.view["node_id"] for a in answers if a.view}
    member_urls = [
        m["url"].rstrip("/")
        for a in answers
        if a.view
        for m in a.view.get("members", [])
        if m.get("url") and m["id"] not in seen_ids
    ]
    extra = [url for url in dict.fromkeys(member_urls) if url not in urls]
    answers += await asyncio.gather(*(fetch_view(url, token) for url in extra))
    return answers
