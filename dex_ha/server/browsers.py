"""What keeps a web page in someone's browser from driving a node.

A page on another site can make the browser send requests to a node the user can reach
(`dex-ha dev` on their laptop, a node in their network). Three checks stop it:

- **Content-Type.** Every POST and PUT must say `Content-Type: application/json` (an empty
  body included); a DELETE needs none, but one it sends must be JSON. A page can send
  `text/plain`, form bodies or no body at all without asking first; for JSON the browser
  must ask the node first (a CORS preflight), which a node answers only for the origins
  it allows. Otherwise: 415 `unsupported_media_type`.
- **Host.** The `Host` header must name the node: a loopback name, an IP address, the host
  of `http_listen` or of `url`, or a name in `allowed_hosts`. This stops DNS rebinding, where
  a page's own name is made to point at the node's address: the browser then sends the
  page's name as `Host`. IP addresses are accepted as they are: a rebinding needs a name,
  and a node listening on 0.0.0.0 serves every address it has. Otherwise: 421
  `misdirected_request` (the request reached a server that does not serve that name).
- **Origin.** A browser names the page behind every request it sends from a script (and
  behind every POST, PUT and DELETE) in `Origin`. A request whose `Origin` is not the node
  itself (the same host and port as `Host`, as for the console at /ui) and not in
  `allowed_origins` is refused with 403 `forbidden`. Clients that are not browsers send no
  `Origin`, and pass. For an allowed origin the node answers CORS preflights and adds
  `Access-Control-Allow-Origin` to its answers, so a page there can call the API with a token.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from dex_ha.server.errors import HttpError

JSON_MEDIA_TYPE = "application/json"
ANY = "*"  # in allowed_hosts or allowed_origins: every host, every origin
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
# The methods whose requests must carry JSON (DELETE: only when it says what it carries).
JSON_METHODS = frozenset({"POST", "PUT"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
# What a CORS preflight from an allowed origin is told it may send.
CORS_ALLOW_METHODS = "GET, POST, PUT, DELETE"
CORS_ALLOW_HEADERS = "Authorization, Content-Type, Dex-Namespace, Last-Event-ID"
CORS_MAX_AGE_S = "600"


class UnsupportedMediaType(HttpError):
    """415 `unsupported_media_type`: a POST or PUT that does not say it carries JSON."""

    def __init__(self, got: str | None) -> None:
        shown = "none" if got is None else repr(got[:100])
        super().__init__(
            415,
            "unsupported_media_type",
            f"Content-Type: must be {JSON_MEDIA_TYPE} (got {shown}); every POST and PUT sends JSON, "
            "an empty body included",
        )


class MisdirectedHost(HttpError):
    """421 `misdirected_request`: the Host header names no name this node serves under."""

    def __init__(self, host: str) -> None:
        super().__init__(
            421,
            "misdirected_request",
            f"Host: this node does not serve {host[:200]!r}; it answers to loopback names, IP "
            "addresses, the hosts of its http_listen and url, and the names in allowed_hosts",
        )


class CrossSiteOrigin(HttpError):
    """403 `forbidden`: a request sent by a page of another site."""

    def __init__(self, origin: str) -> None:
        super().__init__(
            403,
            "forbidden",
            f"Origin: requests from pages of {origin[:200]!r} are refused; only this node's own pages "
            "(the console at /ui) and the origins in allowed_origins may call the API",
        )


def check_content_type(method: str, content_type: str | None) -> None:
    """Raise UnsupportedMediaType unless a request of `method` may carry `content_type`."""
    if content_type is None and method not in JSON_METHODS:
        return
    if content_type is None or media_type(content_type) != JSON_MEDIA_TYPE:
        raise UnsupportedMediaType(content_type)


def media_type(content_type: str) -> str:
    """'application/json' of 'Application/JSON; charset=utf-8'."""
    return content_type.partition(";")[0].strip().lower()


def is_loopback(host: str) -> bool:
    """True for a loopback name or address (of http_listen: "" is every address, not loopback)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class BrowserGuard:
    """The Host and Origin checks of one node (see the module docstring)."""

    hosts: frozenset[str]  # host names, lowercase, without port; ANY: every name
    origins: frozenset[str]  # "scheme://host[:port]", lowercase; ANY: every origin

    @classmethod
    def for_node(
        cls, listen_host: str, url: str, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()
    ) -> BrowserGuard:
        names = {listen_host, urlsplit(url).hostname or "", *allowed_hosts} - {""}
        return cls(
            hosts=frozenset(name.lower() for name in names) | LOOPBACK_NAMES,
            origins=frozenset(normalize_origin(origin) for origin in allowed_origins),
        )

    def check(self, request: web.BaseRequest) -> None:
        """Raise MisdirectedHost or CrossSiteOrigin for a request a page must not send."""
        host = request.headers.get("Host")
        if host is not None:
            self._check_host(host)
        origin = request.headers.get("Origin")
        if origin is not None and not self.same_origin(origin, host) and not self.allows(origin):
            raise CrossSiteOrigin(origin)

    def allows(self, origin: str) -> bool:
        """True when `origin` is one of the configured allowed_origins."""
        return ANY in self.origins or normalize_origin(origin) in self.origins

    def _check_host(self, host: str) -> None:
        try:
            name = urlsplit(f"//{host}").hostname
        except ValueError:  # a port that is not a number
            name = None
        if name is None:
            raise MisdirectedHost(host)
        if ANY in self.hosts or name in self.hosts or _is_address(name):
            return
        raise MisdirectedHost(host)

    @staticmethod
    def same_origin(origin: str, host: str | None) -> bool:
        """True when the page that sent the request was served by this node under `host`."""
        if host is None:
            return False
        try:
            parts = urlsplit(origin)
            target = urlsplit(f"{parts.scheme}://{host}")
            return (
                parts.scheme in _DEFAULT_PORTS
                and parts.hostname is not None
                and (parts.hostname, _port(parts.port, parts.scheme))
                == (target.hostname, _port(target.port, parts.scheme))
            )
        except ValueError:  # a port out of range or not a number
            return False

    # ------------------------------------------------------------ CORS, for allowed origins

    def preflight(self, request: web.BaseRequest) -> web.Response | None:
        """The answer to a CORS preflight (OPTIONS with Access-Control-Request-Method) from
        an allowed origin; None when the request is not one (the router answers it)."""
        origin = request.headers.get("Origin")
        if request.method != "OPTIONS" or origin is None or "Access-Control-Request-Method" not in request.headers:
            return None
        if not self.allows(origin):
            return None
        headers = {
            **self.cors_headers(origin),
            "Access-Control-Allow-Methods": CORS_ALLOW_METHODS,
            "Access-Control-Allow-Headers": CORS_ALLOW_HEADERS,
            "Access-Control-Max-Age": CORS_MAX_AGE_S,
        }
        return web.Response(status=204, headers=headers)

    def cors_headers(self, origin: str | None) -> dict[str, str]:
        """Headers that let a page of an allowed `origin` read an answer."""
        if origin is None or not self.allows(origin):
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


def normalize_origin(origin: str) -> str:
    """An origin as browsers send it: lowercase, no trailing slash (ANY stays ANY)."""
    return origin.strip().rstrip("/").lower()


def check_origin_setting(origin: str) -> str:
    """'' when `origin` is an origin an allowed_origins entry can be; what is wrong otherwise."""
    if origin == ANY:
        return ""
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path.strip("/"):
        return f"must be scheme://host[:port] with scheme http or https, or {ANY} (got {origin!r})"
    return ""


def _port(port: int | None, scheme: str) -> int | None:
    return port if port is not None else _DEFAULT_PORTS.get(scheme)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
