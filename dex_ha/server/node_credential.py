"""The credential one node shows another over HTTP: made from the cluster secret, never
a caller's token.

A node asks the other members for their `GET /v1/cluster` (cluster_nodes.py: the view of
every node that the console shows). It must not pass on the caller's token: a member's URL
is whatever an admin added, and a URL that points somewhere hostile would receive client and
admin tokens. Instead the node sends a bearer it makes from the cluster secret, which every
node holds and no client does:

    Bearer dexnode.<unix seconds>.<hex HMAC-SHA256(K, "GET /v1/cluster" NUL <unix seconds>)>
    K = HMAC-SHA256(cluster secret, "dex-ha node http v1")

It is accepted only on the routes in NODE_ROUTES (`GET /v1/cluster`, which only reads), and
only within VALID_FOR_S of the time it names, so a copy is worth little and not for long.
The nodes' clocks must agree within that (NTP keeps them far closer). A node without a
cluster secret (`--insecure`, `dex-ha dev`) makes none; without tokens it needs none.
"""

from __future__ import annotations

import hashlib
import hmac

# Route names (api_spec.ROUTES) a node's credential may call; every other route refuses it.
NODE_ROUTES = frozenset({"cluster"})
VALID_FOR_S = 60
_KEY_LABEL = b"dex-ha node http v1"
_PREFIX = "dexnode."
_SIGNED_REQUEST = b"GET /v1/cluster\x00"


class NodeCredential:
    """Makes and checks the node-to-node bearer of one cluster (its secret; None: none)."""

    def __init__(self, cluster_secret: str | None) -> None:
        self._key = None
        if cluster_secret:
            self._key = hmac.new(cluster_secret.encode(), _KEY_LABEL, hashlib.sha256).digest()

    def authorization(self, now_s: float) -> str | None:
        """The Authorization header for a call to another node now; None without a secret."""
        if self._key is None:
            return None
        seconds = str(int(now_s))
        return f"Bearer {_PREFIX}{seconds}.{self._mac(seconds)}"

    def accepts(self, authorization: str | None, now_s: float) -> bool:
        """Whether `authorization` is a bearer of this cluster's nodes, made within VALID_FOR_S of now."""
        if self._key is None or authorization is None:
            return False
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.startswith(_PREFIX):
            return False
        seconds, _, mac = token[len(_PREFIX) :].partition(".")
        if (
            not (seconds.isascii() and seconds.isdigit() and len(seconds) <= 12)
            or abs(int(seconds) - now_s) > VALID_FOR_S
        ):
            return False
        return hmac.compare_digest(mac.encode(), self._mac(seconds).encode())

    def _mac(self, seconds: str) -> str:
        assert self._key is not None
        return hmac.new(self._key, _SIGNED_REQUEST + seconds.encode(), hashlib.sha256).hexdigest()
