"""GET /v1/cluster/nodes: every member's own view of the cluster, gathered by one node.

`GET /v1/cluster` answers what one node sees: its role, term, lease and applied index.
An operator (and the web console at /ui, which may only talk to the node that served it)
wants that for every node at once, so the node that is asked asks each member's
`/v1/cluster` in turn, concurrently and with a short deadline, and answers them together.
A member that does not answer in time is listed with `reachable: false` and why: a killed
node shows as unreachable instead of hanging the answer.

The caller's token is never passed on: a member's URL is whatever an admin added, and it
may point somewhere hostile. The node asks with a credential of the cluster itself
(node_credential.py: made from the cluster secret, accepted only by `GET /v1/cluster`, for a
minute), and follows no redirect.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from dex_ha.server.http_limits import SERVER_NAME

if TYPE_CHECKING:  # the node imports the app, which imports this module
    from dex_ha.server.node import NodeServer

MEMBER_VIEW_TIMEOUT_S = 1.0


async def every_node_view(node: NodeServer) -> dict[str, Any]:
    """{"node_id": who answered, "nodes": [one entry per member, ordered by id]}."""
    own = await node.cluster_view()
    authorization = node.node_credential.authorization(time.time())
    headers = {"User-Agent": SERVER_NAME, **({"Authorization": authorization} if authorization else {})}
    timeout = aiohttp.ClientTimeout(total=MEMBER_VIEW_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        entries = await asyncio.gather(*(_member_entry(http, member, own) for member in own["members"]))
    return {"node_id": own["node_id"], "nodes": list(entries)}


async def _member_entry(http: aiohttp.ClientSession, member: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    entry = {"id": member["id"], "url": member["url"], "voter": member["voter"]}
    if member["id"] == own["node_id"]:
        return {**entry, "reachable": True, "view": own}
    if not member["url"]:
        return {**entry, "reachable": False, "error": "no URL is known for this member"}
    try:
        async with http.get(member["url"].rstrip("/") + "/v1/cluster", allow_redirects=False) as resp:
            if resp.status != 200:
                return {**entry, "reachable": False, "error": f"answered HTTP {resp.status}"}
            return {**entry, "reachable": True, "view": await resp.json()}
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        why = "no answer within 1 s" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        return {**entry, "reachable": False, "error": why}
