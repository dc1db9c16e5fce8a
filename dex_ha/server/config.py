"""Node configuration: one dataclass, loaded from TOML with `DEX_HA_*` environment overrides.

Example `node.toml` (every key; `deploy/` has a three-node set):

    node_id = "n1"
    data_dir = "/var/lib/dex-ha/n1"
    http_listen = "0.0.0.0:8801"
    url = "http://10.0.0.1:8801"          # how clients and peers reach this node (leader_url)
    raft_listen = "0.0.0.0:9801"
    probe_listen = "0.0.0.0:8802"         # /livez and /readyz on a thread of their own (probes.py)
    durability = "strict"                 # strict (fsync) | relaxed (tests, demos)
    cluster_secret = "…"                  # or cluster_secret_file = "/etc/dex-ha/secret"
    join = false                          # true: a new node that joins a running cluster as a learner
    heartbeat_timeout_ms = 30000          # a running attempt with no heartbeat for this long fails (HTTP Workers)
    worker_channel_grace_ms = 1000        # a Worker channel closed: its attempts fail this long after
    worker_channel_ping_ms = 2000         # ping a Worker channel this often; no pong in half of it: closed
    drain_timeout_ms = 30000              # SIGTERM / step down: how long running attempts may finish
    proposal_timeout_ms = 5000            # a write not committed this long: 503 unavailable (it may still commit)
    max_inflight_requests = 512           # requests worked on at once; past it: 503 overloaded
    max_inflight_body_bytes = 67108864    # bytes of request bodies held at once; past it: 503 overloaded
    max_metadata_bytes = 65536            # a session's or agent's metadata, as JSON; over it: 413
    max_message_bytes = 1048576           # a user message's text, UTF-8; over it: 413
    max_result_bytes = 2097152            # a result a Worker reports (or a reconcile gives), as JSON; over it: 413
    page_max_bytes = 4194304              # a page of a list stops once it holds this much (next_after follows)
    max_streams = 4000                    # SSE event streams open at once; past it: 503 overloaded
    max_streams_per_token = 1000          # of them, open with one token; past it: 503 overloaded
    election_timeout_min_ms = 500
    election_timeout_max_ms = 750
    raft_heartbeat_interval_ms = 50       # below election_timeout_min_ms - lease_drift_margin_ms
    lease_drift_margin_ms = 50            # the lease ends this much before the followers may vote
    http_header_timeout_ms = 10000        # request headers within this of the connect (or of their first byte)
    http_body_timeout_ms = 30000          # the request body within this (408 request_timeout)
    http_keepalive_timeout_ms = 75000     # an idle keep-alive connection is closed after this
    http_max_connections = 0              # open HTTP connections; 0: derived from the open-files limit
    allowed_hosts = ["dex-ha.example.com"]  # Host names served besides loopback, IPs, http_listen's and url's
    allowed_origins = []                  # web pages of other sites that may call the API ("https://app.example")
    retention_days = 0                    # delete ended sessions idle this many days (fractions too); 0: keep forever
    retention_check_interval_ms = 600000  # how often the active node looks for sessions past retention_days
    log_json = false

    [tokens]                              # role -> list of bearer tokens (≥ 16 characters each);
    client = ["…"]                        # these may use every namespace
    worker = ["…"]
    admin = ["…"]

    [[scoped_tokens]]                     # a client or worker token that may use only these namespaces
    role = "client"
    namespaces = ["team-a"]
    value = "…"

    [[peers]]                             # every voter at bootstrap, this node included
    id = "n1"
    raft_addr = "10.0.0.1:9801"
    url = "http://10.0.0.1:8801"

Environment overrides (they win over the file): DEX_HA_NODE_ID, DEX_HA_DATA_DIR, DEX_HA_HTTP_LISTEN,
DEX_HA_URL, DEX_HA_RAFT_LISTEN, DEX_HA_PROBE_LISTEN, DEX_HA_DURABILITY, DEX_HA_CLUSTER_SECRET, DEX_HA_JOIN,
DEX_HA_HEARTBEAT_TIMEOUT_MS, DEX_HA_WORKER_CHANNEL_GRACE_MS, DEX_HA_WORKER_CHANNEL_PING_MS, DEX_HA_DRAIN_TIMEOUT_MS, DEX_HA_PROPOSAL_TIMEOUT_MS, DEX_HA_MAX_INFLIGHT_REQUESTS,
DEX_HA_MAX_INFLIGHT_BODY_BYTES, DEX_HA_MAX_METADATA_BYTES, DEX_HA_MAX_MESSAGE_BYTES, DEX_HA_MAX_RESULT_BYTES,
DEX_HA_PAGE_MAX_BYTES, DEX_HA_MAX_STREAMS,
DEX_HA_MAX_STREAMS_PER_TOKEN, DEX_HA_ELECTION_TIMEOUT_MIN_MS,
DEX_HA_ELECTION_TIMEOUT_MAX_MS, DEX_HA_RAFT_HEARTBEAT_INTERVAL_MS, DEX_HA_LEASE_DRIFT_MARGIN_MS,
DEX_HA_HTTP_HEADER_TIMEOUT_MS, DEX_HA_HTTP_BODY_TIMEOUT_MS, DEX_HA_HTTP_KEEPALIVE_TIMEOUT_MS,
DEX_HA_HTTP_MAX_CONNECTIONS, DEX_HA_RETENTION_DAYS, DEX_HA_RETENTION_CHECK_INTERVAL_MS, DEX_HA_ALLOWED_HOSTS, DEX_HA_ALLOWED_ORIGINS (comma-separated), DEX_HA_LOG_JSON,
DEX_HA_TOKENS_CLIENT / _WORKER / _ADMIN (comma-separated), DEX_HA_SCOPED_TOKENS (comma-separated
`role:namespace+namespace=token` entries, added to those of the file).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from dex_ha.raft.core import (
    DEFAULT_ELECTION_TIMEOUT_MAX_MS,
    DEFAULT_ELECTION_TIMEOUT_MIN_MS,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_LEASE_DRIFT_MARGIN_MS,
    check_timing,
)
from dex_ha.server.api_spec import FIELD_CAP_CEILINGS, MAX_ID_LENGTH, NAME_PATTERN, PATTERN_RULES, ROUTES
from dex_ha.server.auth import ROLES, ScopedToken
from dex_ha.server.browsers import check_origin_setting, is_loopback

Address = tuple[str, int]


# The smallest page budget: one default-size metadata per page. Smaller would only make more requests.
MIN_PAGE_BYTES = 64 << 10


class ConfigError(ValueError):
    """The configuration cannot run; the message names the key."""


@dataclass(frozen=True)
class Peer:
    id: str
    raft_addr: Address
    url: str


@dataclass(frozen=True)
class ServerConfig:
    node_id: str
    data_dir: Path
    http_listen: Address
    url: str
    raft_listen: Address | None  # None: no Raft listener (`dex-ha dev`, a single voter)
    peers: tuple[Peer, ...]
    # Where load balancers and kubelets probe /livez and /readyz, answered on a thread of
    # its own so that a flood of API requests cannot make them time out. None: API port only.
    probe_listen: Address | None = None
    durability: str = "strict"
    cluster_secret: str | None = None
    tokens: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # every namespace
    scoped_tokens: tuple[ScopedToken, ...] = ()  # each limited to its namespaces
    insecure: bool = False  # run without tokens / cluster secret (a node says so loudly)
    join: bool = False
    heartbeat_timeout_ms: int = 30_000
    # A Worker channel that closed is a dead Worker: the attempts it held fail this long
    # after (unless the same Worker opens a channel again meanwhile and takes them over).
    worker_channel_grace_ms: int = 1_000
    # Ping each Worker channel this often; one whose pong does not come within half of it is
    # closed (a hung Worker, a half-open connection).
    worker_channel_ping_ms: int = 2_000
    drain_timeout_ms: int = 30_000
    # A client's write that has not committed (and applied) this long after it was proposed
    # is answered 503 `unavailable`: fewer than a quorum of voters store entries, and an
    # answer beats a request that hangs. The entry stays in the log and may still commit.
    proposal_timeout_ms: int = 5_000
    # Admission control (admission.py): requests worked on at once; probes, long-lived
    # requests and a Worker's heartbeats and results are not counted. Past it the node
    # answers 503 `overloaded` at once instead of queueing.
    max_inflight_requests: int = 512
    # Admission control of bodies: the bytes of the request bodies being read and worked on
    # at once (a body counts from its Content-Length, or its route's limit when chunked,
    # before it is read). Past it: 503 `overloaded`, and the body is never read.
    max_inflight_body_bytes: int = 64 << 20
    # Caps on what one request may store (413 `too_large` naming the field), so that every
    # item a node keeps and answers with stays small: a session's or an agent's metadata
    # (as JSON), a user message's text (UTF-8), a Worker's result or a reconcile's (as JSON).
    # Each is at most the body limit of its routes (api_spec.py).
    max_metadata_bytes: int = 64 << 10
    max_message_bytes: int = 1 << 20
    max_result_bytes: int = 2 << 20
    # A page of a list (GET /v1/sessions, a read of a session's events) stops adding items
    # once they hold this many bytes, and says where to go on (next_after), so no answer
    # holds more than about this plus one item.
    page_max_bytes: int = 4 << 20
    # SSE event streams (admission.StreamAdmission): open at once on this node, and open with
    # one token. Each holds a connection: keep max_streams below http_max_connections, so
    # that streams leave connections for the other requests.
    max_streams: int = 4_000
    max_streams_per_token: int = 1_000
    # The Raft timing defaults come from the raft layer (dex_ha.raft.core), their one source.
    election_timeout_min_ms: int = DEFAULT_ELECTION_TIMEOUT_MIN_MS
    election_timeout_max_ms: int = DEFAULT_ELECTION_TIMEOUT_MAX_MS
    raft_heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS
    # Clock-rate drift the lease tolerates: up to margin / (2 * election_timeout_min - margin)
    # (5.3 % for 50 of 500). The lease ends this much earlier than the followers' refusal.
    lease_drift_margin_ms: int = DEFAULT_LEASE_DRIFT_MARGIN_MS
    snapshot_every_entries: int = 20_000
    # The replica check (consistency.py): how often the active node has every node hash its
    # state at one log index and compares the hashes. 0: never.
    consistency_check_interval_ms: int = 60_000
    # Retention (retention.py): the active node deletes ended (idle) sessions whose last
    # activity is older than this many days, checking every retention_check_interval_ms.
    # 0: sessions are kept until deleted (DELETE /v1/sessions/{id}).
    retention_days: float = 0.0
    retention_check_interval_ms: int = 600_000
    # HTTP connections (dex_ha.server.http_limits): read timeouts for the request (never for
    # the answer: long polls and event streams last), and a cap on open connections.
    http_header_timeout_ms: int = 10_000
    http_body_timeout_ms: int = 30_000
    http_keepalive_timeout_ms: int = 75_000
    http_max_connections: int = 0  # 0: derived from the open-files limit (RLIMIT_NOFILE)
    # Browsers (dex_ha.server.browsers): Host names served besides loopback names, IP
    # addresses and the hosts of http_listen and url ("*": any); origins of web pages of
    # other sites that may call the API ("*": any).
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    log_json: bool = False
    dev: bool = False  # `dex-ha dev`: one node; no auth unless tokens are configured

    @property
    def auth_enabled(self) -> bool:
        return bool(self.scoped_tokens) or any(self.tokens.get(role) for role in ROLES)

    def check(self) -> None:
        """Refuse a configuration that cannot run safely."""
        if self.durability not in ("strict", "relaxed"):
            raise ConfigError(f"durability: must be strict or relaxed, not {self.durability!r}")
        if not self.node_id:
            raise ConfigError("node_id: required")
        if self.node_id not in {p.id for p in self.peers} and not self.join:
            raise ConfigError(f"peers: must list this node ({self.node_id!r}) unless join = true")
        if self.election_timeout_min_ms >= self.election_timeout_max_ms:
            raise ConfigError("election_timeout_min_ms: must be below election_timeout_max_ms")
        for name in (
            "heartbeat_timeout_ms",
            "worker_channel_grace_ms",
            "drain_timeout_ms",
            "raft_heartbeat_interval_ms",
            "lease_drift_margin_ms",
            "consistency_check_interval_ms",
            "retention_days",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must not be negative")
        self._check_lease_timing()
        if self.worker_channel_ping_ms <= 0:
            raise ConfigError("worker_channel_ping_ms: must be positive")
        if self.proposal_timeout_ms <= 0:
            raise ConfigError("proposal_timeout_ms: must be positive")
        if self.retention_check_interval_ms <= 0:
            raise ConfigError("retention_check_interval_ms: must be positive")
        for name in ("max_inflight_requests", "max_streams", "max_streams_per_token"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be at least 1")
        self._check_request_bounds()
        if self.http_max_connections < 0:
            raise ConfigError("http_max_connections: must not be negative (0: derived from the open-files limit)")
        for name in ("http_header_timeout_ms", "http_body_timeout_ms", "http_keepalive_timeout_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be positive")
        self._check_browser_settings()
        if self.insecure:
            return
        if self.dev:
            self._check_dev_listens_on_loopback()
            return
        if not self.auth_enabled:
            raise ConfigError("tokens: a node needs client, worker and admin tokens (or --insecure)")
        if not self.cluster_secret or len(self.cluster_secret) < 16:
            raise ConfigError("cluster_secret: a node needs a cluster secret of ≥ 16 characters (or --insecure)")

    def _check_request_bounds(self) -> None:
        for name, most in FIELD_CAP_CEILINGS.items():
            value = getattr(self, name)
            if not 1 <= value <= most:
                raise ConfigError(f"{name}: must be from 1 to {most} (the body limit of its routes), got {value}")
        largest_body = max(route.max_body_bytes for route in ROUTES)
        if self.max_inflight_body_bytes < largest_body:
            raise ConfigError(
                f"max_inflight_body_bytes: must be at least {largest_body} (the largest body a route takes), "
                f"got {self.max_inflight_body_bytes}"
            )
        if self.page_max_bytes < MIN_PAGE_BYTES:
            raise ConfigError(f"page_max_bytes: must be at least {MIN_PAGE_BYTES}, got {self.page_max_bytes}")

    def _check_browser_settings(self) -> None:
        for i, host in enumerate(self.allowed_hosts):
            if not isinstance(host, str) or not host or any(c in host for c in "/: "):
                raise ConfigError(f"allowed_hosts[{i}]: must be a host name without scheme or port (got {host!r})")
        for i, origin in enumerate(self.allowed_origins):
            problem = check_origin_setting(origin) if isinstance(origin, str) else f"must be a string (got {origin!r})"
            if problem:
                raise ConfigError(f"allowed_origins[{i}]: {problem}")

    def _check_dev_listens_on_loopback(self) -> None:
        """`dex-ha dev` without tokens serves everything to whoever can reach it: loopback only."""
        host = self.http_listen[0]
        if not self.auth_enabled and not is_loopback(host):
            raise ConfigError(
                f"http_listen: {host or 'every address'} is not a loopback address, and with no tokens anyone "
                "who reaches it may do anything; set DEX_HA_TOKENS_CLIENT, _WORKER and _ADMIN, or pass --insecure"
            )

    def _check_lease_timing(self) -> None:
        """Raft's own timing check (raft.core.check_timing, the one source of the rule),
        its message led by our key name: every message of it starts with the setting's name."""
        try:
            check_timing(
                self.election_timeout_min_ms,
                self.election_timeout_max_ms,
                self.raft_heartbeat_interval_ms,
                self.lease_drift_margin_ms,
            )
        except ValueError as exc:
            raft_name, _, what = str(exc).partition(" ")
            if what.startswith("("):  # "(<value>) must be …": say the rule first, then the value
                value, _, rule = what[1:].partition(") ")
                what = f"{rule}, got {value}"
            raise ConfigError(f"{_RAFT_SETTING_KEYS.get(raft_name, raft_name)}: {what}") from None


# Raft's names of the timing settings that this config calls otherwise.
_RAFT_SETTING_KEYS = {"heartbeat_interval_ms": "raft_heartbeat_interval_ms"}


def parse_address(text: str, key: str) -> Address:
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{key}: expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


def dev_config(
    data_dir: Path,
    port: int,
    *,
    host: str = "127.0.0.1",
    tokens: Mapping[str, tuple[str, ...]] | None = None,
    durability: str = "strict",
    insecure: bool = False,
) -> ServerConfig:
    """`dex-ha dev`: a single voter on loopback. No one ever sends it a Raft message, so
    it opens no Raft port (an open one would be one more thing to attack)."""
    url = f"http://{host}:{port}"
    no_raft_addr = (host, 0)  # its entry in the member list: never dialled
    return ServerConfig(
        node_id="dev",
        data_dir=data_dir,
        http_listen=(host, port),
        url=url,
        raft_listen=None,
        peers=(Peer("dev", no_raft_addr, url),),
        tokens=dict(tokens or {}),
        dev=True,
        insecure=insecure,
        durability=durability,
        # One voter: no one to wait for, so a restart is ready at once.
        election_timeout_min_ms=150,
        election_timeout_max_ms=300,
    )


def load_config(path: Path | None, env: Mapping[str, str] | None = None, *, insecure: bool = False) -> ServerConfig:
    """The configuration of `dex-ha node`: the TOML file, then environment overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    raw = _apply_env(raw, os.environ if env is None else env)
    config = _from_raw(raw, insecure=insecure)
    config.check()
    return config


ENV_KEYS = {
    "node_id": str,
    "data_dir": str,
    "http_listen": str,
    "url": str,
    "raft_listen": str,
    "probe_listen": str,
    "durability": str,
    "cluster_secret": str,
    "join": bool,
    "heartbeat_timeout_ms": int,
    "worker_channel_grace_ms": int,
    "worker_channel_ping_ms": int,
    "drain_timeout_ms": int,
    "proposal_timeout_ms": int,
    "max_inflight_requests": int,
    "max_inflight_body_bytes": int,
    "max_metadata_bytes": int,
    "max_message_bytes": int,
    "max_result_bytes": int,
    "page_max_bytes": int,
    "max_streams": int,
    "max_streams_per_token": int,
    "election_timeout_min_ms": int,
    "election_timeout_max_ms": int,
    "raft_heartbeat_interval_ms": int,
    "lease_drift_margin_ms": int,
    "log_json": bool,
    "http_header_timeout_ms": int,
    "http_body_timeout_ms": int,
    "http_keepalive_timeout_ms": int,
    "http_max_connections": int,
    "consistency_check_interval_ms": int,
    "retention_days": float,
    "retention_check_interval_ms": int,
    "allowed_hosts": list,
    "allowed_origins": list,
}


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    raw = dict(raw)
    for key, kind in ENV_KEYS.items():
        value = env.get(f"DEX_HA_{key.upper()}")
        if value is None:
            continue
        if kind is bool:
            raw[key] = value.strip().lower() in ("1", "true", "yes", "on")
        elif kind is list:
            raw[key] = [item.strip() for item in value.split(",") if item.strip()]
        elif kind is int:
            try:
                raw[key] = int(value)
            except ValueError:
                raise ConfigError(f"DEX_HA_{key.upper()}: must be an integer, got {value!r}") from None
        elif kind is float:
            try:
                raw[key] = float(value)
            except ValueError:
                raise ConfigError(f"DEX_HA_{key.upper()}: must be a number, got {value!r}") from None
        else:
            raw[key] = value
    tokens = {**(raw.get("tokens") or {}), **tokens_from_env(env)}
    if tokens:
        raw["tokens"] = tokens
    scoped = env.get("DEX_HA_SCOPED_TOKENS")
    if scoped is not None:
        raw["scoped_tokens"] = [*(raw.get("scoped_tokens") or []), *_scoped_tokens_from_env(scoped)]
    return raw


def _scoped_tokens_from_env(value: str) -> list[dict[str, Any]]:
    """DEX_HA_SCOPED_TOKENS: `role:namespace+namespace=token` entries, comma-separated, as
    `[[scoped_tokens]]` tables (a token holds no comma; a role and a namespace no '=')."""
    found = []
    for i, entry in enumerate(item.strip() for item in value.split(",") if item.strip()):
        scope, equals, token = entry.partition("=")
        role, colon, namespaces = scope.partition(":")
        if not (equals and colon and token):
            raise ConfigError(f"DEX_HA_SCOPED_TOKENS: entry {i} must be role:namespace+namespace=token")
        found.append({"role": role, "namespaces": namespaces.split("+"), "value": token})
    return found


# The limits on what a node takes on at once and per request: set the same way by a node's
# file and by `dex-ha dev`'s environment.
LIMIT_KEYS = (
    "max_inflight_requests",
    "max_inflight_body_bytes",
    "max_metadata_bytes",
    "max_message_bytes",
    "max_result_bytes",
    "page_max_bytes",
    "max_streams",
    "max_streams_per_token",
)

# How long ended sessions are kept: set the same way by a node's file and by `dex-ha dev`'s environment.
RETENTION_KEYS = ("retention_days", "retention_check_interval_ms")

# What `dex-ha dev` takes from DEX_HA_* (its other keys are fixed: one voter on loopback).
DEV_ENV_KEYS = (
    "probe_listen",
    "heartbeat_timeout_ms",
    "worker_channel_grace_ms",
    "worker_channel_ping_ms",
    "drain_timeout_ms",
    "proposal_timeout_ms",
    *LIMIT_KEYS,
    *RETENTION_KEYS,
    "http_header_timeout_ms",
    "http_body_timeout_ms",
    "http_keepalive_timeout_ms",
    "http_max_connections",
    "allowed_hosts",
    "allowed_origins",
    "scoped_tokens",
)


def dev_overrides_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings of DEV_ENV_KEYS that DEX_HA_* variables give, parsed (ConfigError naming
    the variable otherwise), for `replace(dev_config(...), **overrides)`."""
    raw = {k: v for k, v in _apply_env({}, env).items() if k in DEV_ENV_KEYS}
    if "probe_listen" in raw:
        raw["probe_listen"] = parse_address(raw["probe_listen"], "DEX_HA_PROBE_LISTEN")
    for key in ("allowed_hosts", "allowed_origins"):
        if key in raw:
            raw[key] = tuple(raw[key])
    if "scoped_tokens" in raw:
        raw["scoped_tokens"] = scoped_tokens(raw["scoped_tokens"])
    return raw


def tokens_from_env(env: Mapping[str, str]) -> dict[str, list[str]]:
    """The tokens given by DEX_HA_TOKENS_CLIENT / _WORKER / _ADMIN (comma-separated)."""
    tokens = {}
    for role in ROLES:
        value = env.get(f"DEX_HA_TOKENS_{role.upper()}")
        if value is not None:
            tokens[role] = [t.strip() for t in value.split(",") if t.strip()]
    return tokens


def _from_raw(raw: dict[str, Any], *, insecure: bool) -> ServerConfig:
    known = {f.name for f in fields(ServerConfig)} | {"cluster_secret_file"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown configuration key")
    for key in ("node_id", "data_dir", "http_listen", "raft_listen"):
        if not raw.get(key):
            raise ConfigError(f"{key}: required")
    http_listen = parse_address(raw["http_listen"], "http_listen")
    peers = tuple(_peer(p, i) for i, p in enumerate(raw.get("peers") or []))
    secret = raw.get("cluster_secret")
    if raw.get("cluster_secret_file"):
        secret = Path(raw["cluster_secret_file"]).read_text().strip()
    tokens = raw.get("tokens") or {}
    if not isinstance(tokens, dict) or any(role not in ROLES for role in tokens):
        raise ConfigError(f"tokens: roles are {', '.join(ROLES)}")
    simple = {
        k: raw[k]
        for k in (
            "durability",
            "join",
            "heartbeat_timeout_ms",
            "worker_channel_grace_ms",
            "worker_channel_ping_ms",
            "drain_timeout_ms",
            "proposal_timeout_ms",
            *LIMIT_KEYS,
            "election_timeout_min_ms",
            "election_timeout_max_ms",
            "raft_heartbeat_interval_ms",
            "lease_drift_margin_ms",
            "snapshot_every_entries",
            "consistency_check_interval_ms",
            *RETENTION_KEYS,
            "log_json",
            "http_header_timeout_ms",
            "http_body_timeout_ms",
            "http_keepalive_timeout_ms",
            "http_max_connections",
        )
        if k in raw
    }
    for key, value in simple.items():
        expected = type(getattr(_DEFAULTS, key))
        if expected is float and type(value) is int:  # `retention_days = 30` is a number too
            simple[key] = value = float(value)
        if type(value) is not expected:
            raise ConfigError(f"{key}: must be {expected.__name__}, got {value!r}")
    return ServerConfig(
        node_id=str(raw["node_id"]),
        data_dir=Path(raw["data_dir"]),
        http_listen=http_listen,
        url=str(raw.get("url") or f"http://{http_listen[0]}:{http_listen[1]}").rstrip("/"),
        raft_listen=parse_address(raw["raft_listen"], "raft_listen"),
        peers=peers,
        probe_listen=parse_address(raw["probe_listen"], "probe_listen") if raw.get("probe_listen") else None,
        cluster_secret=secret,
        tokens={r: tuple(t) for r, t in tokens.items()},
        scoped_tokens=scoped_tokens(raw.get("scoped_tokens", [])),
        insecure=insecure,
        allowed_hosts=_string_list(raw.get("allowed_hosts", []), "allowed_hosts"),
        allowed_origins=_string_list(raw.get("allowed_origins", []), "allowed_origins"),
        **simple,
    )


def scoped_tokens(raw: Any) -> tuple[ScopedToken, ...]:
    """The `[[scoped_tokens]]` tables as ScopedTokens; ConfigError naming the key otherwise.
    The token itself is checked (length, characters) by TokenAuth, as those of [tokens]."""
    if not isinstance(raw, list):
        raise ConfigError("scoped_tokens: must be a list of tables ([[scoped_tokens]])")
    found = []
    for i, entry in enumerate(raw):
        where = f"scoped_tokens[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"role", "namespaces", "value"}:
            raise ConfigError(f"{where}: needs role, namespaces and value (and nothing else)")
        if entry["role"] not in ("client", "worker"):
            raise ConfigError(f"{where}.role: must be client or worker (admin tokens use every namespace: [tokens])")
        namespaces = _string_list(entry["namespaces"], f"{where}.namespaces")
        for namespace in namespaces:
            if len(namespace) > MAX_ID_LENGTH or not re.fullmatch(NAME_PATTERN, namespace):
                rule = PATTERN_RULES[NAME_PATTERN]
                raise ConfigError(f"{where}.namespaces: {namespace!r} {rule} (at most {MAX_ID_LENGTH} characters)")
        if not namespaces:
            raise ConfigError(f"{where}.namespaces: must list at least one namespace")
        if not isinstance(entry["value"], str):
            raise ConfigError(f"{where}.value: must be a string")
        found.append(ScopedToken(entry["role"], namespaces, entry["value"]))
    return tuple(found)


def _string_list(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{key}: must be a list of strings, got {value!r}")
    return tuple(value)


def _peer(raw: Any, i: int) -> Peer:
    if not isinstance(raw, dict) or not {"id", "raft_addr", "url"} <= set(raw):
        raise ConfigError(f"peers[{i}]: needs id, raft_addr and url")
    return Peer(str(raw["id"]), parse_address(raw["raft_addr"], f"peers[{i}].raft_addr"), str(raw["url"]).rstrip("/"))


# Defaults of the optional keys, for type checks of the TOML values.
_DEFAULTS = ServerConfig(node_id="", data_dir=Path("."), http_listen=("", 0), url="", raft_listen=("", 0), peers=())
__all__ = ["ConfigError", "Peer", "ServerConfig", "dev_config", "load_config", "parse_address", "replace"]
