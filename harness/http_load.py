"""An HTTP load generator for overload tests and benchmarks: N concurrent clients against
one node for D seconds, recording every answer.

Each client is a closed loop: it sends one request, waits for the answer, and sends the
next at once (no think time, and it does not wait out Retry-After: the node has to shed
the load it is given, not the load a polite client would give it). Every client holds its
own keep-alive connection: the clients share one connector without a connection limit,
so N requests in flight are N connections.

The request mix (weights, see DEFAULT_MIX):
- `get_session`     GET /v1/sessions/{sid} of one of the sessions created before the load;
- `list_sessions`   GET /v1/sessions?limit=10;
- `create_session`  POST /v1/sessions with a random session id (a Raft proposal each);
- `metrics`         GET /metrics without a token, as a Prometheus scraper sends it;
- `sse`             GET /v1/sessions/{sid}/events: read the first chunk, then drop the
                    connection (off by default);
- `big_list`        GET /v1/sessions?limit=1000 over `big_sessions` sessions created before the
                    load with `big_metadata_bytes` of metadata each: a page as big as the
                    node's page budget allows (off by default);
- `big_body`        POST /v1/sessions/{sid}/messages with a body of 4 MiB minus 100 bytes (the
                    route's limit is 4 MiB), a text over the message cap: read, decoded and
                    answered 413, or shed (503 overloaded) past the bytes in flight (off by default).

Recorded per answer: the request kind, the HTTP status, the `error` code of a JSON error
body (`overloaded`, `not_active`, ...), whether a 503 carried Retry-After, and the latency
of accepted (2xx) answers. Failures without an HTTP answer (connection reset, refused,
timeouts) are counted apart, by class. Only error bodies are parsed (they are small); a
2xx body is read to the end, so the connection can be reused, and dropped.

    result = await run_load(LoadConfig(base_url, token, clients=2000, duration_s=10))
    print(result.summary())
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import random
import resource
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

DEFAULT_MIX: Mapping[str, float] = {
    "get_session": 0.40,
    "list_sessions": 0.15,
    "create_session": 0.20,
    "metrics": 0.25,
    "sse": 0.0,
    "big_list": 0.0,
    "big_body": 0.0,
}
KINDS = tuple(DEFAULT_MIX)
LOAD_AGENT = "load"
# File descriptors this process needs besides one socket per client (the interpreter,
# pytest, logs, the probes that read /v1/cluster, ...).
FD_HEADROOM = 256
SEED_DEADLINE_S = 30.0
BIG_BODY_BYTES = (4 << 20) - 100


class LoadSetupError(RuntimeError):
    """The load cannot run as asked (file descriptor limit, seeding sessions failed)."""


@dataclass(frozen=True)
class LoadConfig:
    base_url: str  # e.g. http://127.0.0.1:8801 (no trailing slash)
    token: str | None  # bearer token for /v1 routes (None: a node without authentication)
    clients: int
    duration_s: float
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    seed_sessions: int = 20  # sessions created before the load, for the session GETs and SSE
    # Sessions with big metadata created before the load when `big_list` has weight: together
    # past the default page budget (4 MiB), under the default metadata cap (64 KiB) each.
    big_sessions: int = 80
    big_metadata_bytes: int = 60_000
    connect_timeout_s: float = 10.0  # a dropped SYN is retransmitted after 1, 3, 7 s
    request_timeout_s: float = 20.0  # the whole request; also bounds the drain after the window
    rng_seed: int | None = None

    def check(self) -> None:
        unknown = set(self.mix) - set(KINDS)
        if unknown:
            raise ValueError(f"mix: unknown request kinds {sorted(unknown)}; known: {list(KINDS)}")
        if not any(w > 0 for w in self.mix.values()) or any(w < 0 for w in self.mix.values()):
            raise ValueError(f"mix: weights must be >= 0 and at least one > 0, got {dict(self.mix)}")
        if self.clients < 1 or self.duration_s <= 0:
            raise ValueError(f"clients must be >= 1 and duration_s > 0, got {self.clients}, {self.duration_s}")


# ---------------------------------------------------------------- file descriptors


def raise_fd_limit(needed: int) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit when it is below
    `needed`; (soft, hard) after.

    Child processes started afterwards (the server nodes) inherit it, which they need too:
    each client connection is a socket on both sides. Raises LoadSetupError when even the
    hard limit is below `needed`.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft, hard
    how = (
        f"raise it (`ulimit -Hn {needed}` as root, LimitNOFILE= in a systemd unit, --ulimit nofile= "
        f"for docker) or run fewer clients"
    )
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise LoadSetupError(
            f"{needed} file descriptors needed (one socket per client plus {FD_HEADROOM}), "
            f"but the hard limit RLIMIT_NOFILE is {hard}: {how}"
        )
    wanted = hard if hard != resource.RLIM_INFINITY else needed
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:
        raise LoadSetupError(
            f"cannot raise the soft RLIMIT_NOFILE from {soft} to {wanted} ({exc}); {needed} are needed: {how}"
        ) from None
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def fds_needed(clients: int) -> int:
    return clients + FD_HEADROOM


# ---------------------------------------------------------------- what was recorded


@dataclass
class Tally:
    """Everything the clients of one run recorded (one per run; the clients share it)."""

    answers: Counter[tuple[str, int, str]] = field(default_factory=Counter)  # (kind, status, error code)
    unavailable_without_retry_after: Counter[str] = field(default_factory=Counter)  # 503 error code
    accepted_latencies_s: list[float] = field(default_factory=list)
    transport_errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, error class)
    error_examples: dict[str, str] = field(default_factory=dict)  # error class -> one message
    connections_opened: int = 0
    clients_answered: set[int] = field(default_factory=set)
    last_answer_at: float = 0.0  # time.monotonic() of the latest answer or error

    def answer(self, client: int, kind: str, status: int, code: str, retry_after: bool, latency_s: float) -> None:
        self.answers[(kind, status, code)] += 1
        self.clients_answered.add(client)
        self.last_answer_at = time.monotonic()
        if 200 <= status < 300:
            self.accepted_latencies_s.append(latency_s)
        elif status == 503 and not retry_after:
            self.unavailable_without_retry_after[code] += 1

    def transport_error(self, kind: str, error_class: str, exc: BaseException) -> None:
        self.transport_errors[(kind, error_class)] += 1
        self.last_answer_at = time.monotonic()
        self.error_examples.setdefault(error_class, f"{type(exc).__name__}: {exc}"[:300])


@dataclass(frozen=True)
class LoadResult:
    """The outcome of one run; `summary()` is one line for a table or an assertion message."""

    base_url: str
    clients: int
    duration_s: float  # from the first request to the last answer
    answers: int
    answers_per_s: float
    accepted: int
    p50_ms: float | None  # of accepted (2xx) answers
    p99_ms: float | None
    by_code: dict[str, int]  # "2xx", "overloaded", "not_active", "http_500", ...: answers
    by_answer: dict[str, int]  # "200", "201", "503 overloaded", "503 not_active", ...: answers
    by_kind: dict[str, dict[str, int]]  # kind -> code -> answers
    transport_errors: dict[str, int]  # error class -> count
    transport_errors_by_kind: dict[str, dict[str, int]]
    error_examples: dict[str, str]
    unavailable_without_retry_after: dict[str, int]  # 503 error code -> answers without Retry-After
    clients_answered: int  # clients that got at least one HTTP answer
    connections_opened: int

    def count(self, code: str) -> int:
        return self.by_code.get(code, 0)

    @property
    def other_non_2xx(self) -> int:
        return self.answers - self.accepted - self.count("overloaded") - self.count("not_active")

    @property
    def transport_error_count(self) -> int:
        return sum(self.transport_errors.values())

    def summary(self) -> str:
        codes = ", ".join(f"{code} {n}" for code, n in sorted(self.by_code.items(), key=lambda kv: -kv[1]))
        errors = ", ".join(f"{cls} {n}" for cls, n in sorted(self.transport_errors.items())) or "none"
        p50 = "-" if self.p50_ms is None else f"{self.p50_ms:.1f}"
        p99 = "-" if self.p99_ms is None else f"{self.p99_ms:.1f}"
        return (
            f"{self.clients} clients for {self.duration_s:.1f} s against {self.base_url}: "
            f"{self.answers} answers ({self.answers_per_s:.0f}/s; {codes}); accepted p50 {p50} ms, "
            f"p99 {p99} ms; transport errors: {errors}; {self.clients_answered} clients answered, "
            f"{self.connections_opened} connections opened"
        )


def error_code(status: int, body: bytes) -> str:
    """ "2xx" for accepted answers; else the `error` of a JSON error body, or http_<status>."""
    if 200 <= status < 300:
        return "2xx"
    try:
        code = json.loads(body).get("error")
    except (ValueError, AttributeError):
        code = None
    return code if isinstance(code, str) and code else f"http_{status}"


def classify_transport_error(exc: BaseException) -> str:
    """A short class for a request that got no HTTP answer."""
    connection_timeout = getattr(aiohttp, "ConnectionTimeoutError", ())  # aiohttp >= 3.10
    if connection_timeout and isinstance(exc, connection_timeout):
        return "connect_timeout"
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return "timeout"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "disconnected"  # the server closed the connection without an answer
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "truncated"
    os_errno = getattr(exc, "errno", None)
    if os_errno is None and isinstance(exc.__cause__, OSError):
        os_errno = exc.__cause__.errno
    if os_errno == errno.ECONNRESET or isinstance(exc, ConnectionResetError):
        return "reset"
    if os_errno == errno.ECONNREFUSED:
        return "refused"
    if os_errno in (errno.EMFILE, errno.ENFILE):
        return "fd_exhausted"  # ours: this process ran out of file descriptors
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_error"
    return type(exc).__name__


def percentile_ms(sorted_values: list[float], pct: float) -> float | None:
    """The nearest-rank percentile of seconds, in ms (None for no values)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return round(sorted_values[min(rank, len(sorted_values)) - 1] * 1000, 3)


def summarize(config: LoadConfig, tally: Tally, elapsed_s: float) -> LoadResult:
    by_code: Counter[str] = Counter()
    by_answer: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = {}
    for (kind, status, code), n in tally.answers.items():
        by_code[code] += n
        by_answer[str(status) if code == "2xx" else f"{status} {code}"] += n
        by_kind.setdefault(kind, Counter())[code] += n
    errors: Counter[str] = Counter()
    errors_by_kind: dict[str, Counter[str]] = {}
    for (kind, cls), n in tally.transport_errors.items():
        errors[cls] += n
        errors_by_kind.setdefault(kind, Counter())[cls] += n
    latencies = sorted(tally.accepted_latencies_s)
    answers = sum(by_code.values())
    return LoadResult(
        base_url=config.base_url,
        clients=config.clients,
        duration_s=round(elapsed_s, 3),
        answers=answers,
        answers_per_s=round(answers / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        accepted=by_code["2xx"],
        p50_ms=percentile_ms(latencies, 50),
        p99_ms=percentile_ms(latencies, 99),
        by_code=dict(by_code),
        by_answer=dict(by_answer),
        by_kind={k: dict(v) for k, v in by_kind.items()},
        transport_errors=dict(errors),
        transport_errors_by_kind={k: dict(v) for k, v in errors_by_kind.items()},
        error_examples=dict(tally.error_examples),
        unavailable_without_retry_after=dict(tally.unavailable_without_retry_after),
        clients_answered=len(tally.clients_answered),
        connections_opened=tally.connections_opened,
    )


# ---------------------------------------------------------------- the requests


@dataclass(frozen=True)
class Target:
    """What the clients of one run send: URLs and headers, built once."""

    base_url: str
    auth: Mapping[str, str]  # the Authorization header, or nothing
    post_headers: Mapping[str, str]
    session_ids: tuple[str, ...]
    big_body: bytes = b""  # built once when `big_body` has weight: every client sends the same bytes

    @classmethod
    def of(cls, config: LoadConfig, session_ids: list[str]) -> Target:
        auth = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        big_body = json_of_size(BIG_BODY_BYTES, "text") if config.mix.get("big_body", 0) > 0 else b""
        return cls(config.base_url, auth, {**auth, "Content-Type": "application/json"}, tuple(session_ids), big_body)


def json_of_size(size: int, key: str) -> bytes:
    """A JSON object of exactly `size` bytes: one string `key` padded with x."""
    head, tail = f'{{"{key}": "'.encode(), b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


async def send(
    http: aiohttp.ClientSession, target: Target, kind: str, rng: random.Random, client: int, tally: Tally
) -> None:
    """One request of `kind`; its answer or its transport error goes to `tally`."""
    base = target.base_url
    if kind == "create_session":
        body = f'{{"agent": "{LOAD_AGENT}", "session_id": "load-{rng.getrandbits(64):016x}"}}'
        request = http.post(base + "/v1/sessions", data=body, headers=target.post_headers)
    elif kind == "get_session":
        request = http.get(f"{base}/v1/sessions/{rng.choice(target.session_ids)}", headers=target.auth)
    elif kind == "list_sessions":
        request = http.get(base + "/v1/sessions?limit=10", headers=target.auth)
    elif kind == "metrics":
        request = http.get(base + "/metrics")
    elif kind == "big_list":
        request = http.get(base + "/v1/sessions?limit=1000", headers=target.auth)
    elif kind == "big_body":
        sid = rng.choice(target.session_ids)
        request = http.post(f"{base}/v1/sessions/{sid}/messages", data=target.big_body, headers=target.post_headers)
    else:  # sse
        request = http.get(f"{base}/v1/sessions/{rng.choice(target.session_ids)}/events", headers=target.auth)
    started = time.perf_counter()
    try:
        async with request as resp:
            if kind == "sse" and resp.status == 200:
                await resp.content.readany()  # the stream's first chunk: it is open
                resp.close()  # drop the connection: the stream never ends by itself
                body_bytes = b""
            else:
                body_bytes = await resp.read()
            tally.answer(
                client,
                kind,
                resp.status,
                error_code(resp.status, body_bytes),
                "Retry-After" in resp.headers,
                time.perf_counter() - started,
            )
    except asyncio.CancelledError:
        raise
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        tally.transport_error(kind, classify_transport_error(exc), exc)


async def run_client(
    http: aiohttp.ClientSession,
    target: Target,
    mix: Mapping[str, float],
    rng: random.Random,
    client: int,
    end_at: float,
    tally: Tally,
) -> None:
    """A closed loop of requests until `end_at` (the request in flight then is finished)."""
    kinds = [k for k, w in mix.items() if w > 0]
    weights = [mix[k] for k in kinds]
    while time.monotonic() < end_at:
        kind = rng.choices(kinds, weights)[0]
        await send(http, target, kind, rng, client, tally)


async def seed_sessions(http: aiohttp.ClientSession, config: LoadConfig) -> list[str]:
    """Create the sessions that the GETs read (before the load: the node is idle), and the
    big ones that `big_list` lists."""
    ids = [f"load-seed-{uuid.uuid4().hex[:12]}" for _ in range(max(1, config.seed_sessions))]
    await create_sessions(http, config, ids, None)
    if config.mix.get("big_list", 0) > 0:
        big = [f"load-big-{uuid.uuid4().hex[:12]}" for _ in range(config.big_sessions)]
        await create_sessions(http, config, big, {"pad": "x" * (config.big_metadata_bytes - len('{"pad":""}'))})
    return ids


async def create_sessions(
    http: aiohttp.ClientSession, config: LoadConfig, ids: list[str], metadata: dict[str, str] | None
) -> None:
    headers = {"Content-Type": "application/json"}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"
    deadline = time.monotonic() + SEED_DEADLINE_S
    for session_id in ids:
        while True:
            try:
                async with http.post(
                    config.base_url + "/v1/sessions",
                    headers=headers,
                    data=json.dumps({"agent": LOAD_AGENT, "session_id": session_id, "metadata": metadata}),
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as resp:
                    text = await resp.text()
                    if resp.status in (200, 201):
                        break
                    problem = f"HTTP {resp.status}: {text[:200]}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise LoadSetupError(
                    f"could not create the seed session {session_id} at {config.base_url} "
                    f"within {SEED_DEADLINE_S:.0f} s: {problem}"
                )
            await asyncio.sleep(0.1)


def counting_connections(tally: Tally) -> aiohttp.TraceConfig:
    """A trace that counts the connections the clients open (one each, unless the node
    closed some: then more)."""
    trace = aiohttp.TraceConfig()

    async def on_connection_create_end(session: Any, context: Any, params: Any) -> None:
        tally.connections_opened += 1

    trace.on_connection_create_end.append(on_connection_create_end)
    return trace


async def run_load(config: LoadConfig) -> LoadResult:
    """Seed sessions, then run `config.clients` clients for `config.duration_s` seconds."""
    config.check()
    raise_fd_limit(fds_needed(config.clients))
    tally = Tally()
    rng = random.Random(config.rng_seed)
    timeout = aiohttp.ClientTimeout(total=config.request_timeout_s, sock_connect=config.connect_timeout_s)
    # limit=0: no connection limit, so every client in flight holds its own connection.
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=[counting_connections(tally)],
    ) as http:
        target = Target.of(config, await seed_sessions(http, config))
        tally.connections_opened = 0  # count the load's connections only
        started = time.monotonic()
        end_at = started + config.duration_s
        clients = [
            asyncio.create_task(
                run_client(http, target, config.mix, random.Random(rng.getrandbits(64)), i, end_at, tally)
            )
            for i in range(config.clients)
        ]
        try:
            # Each client ends within one request timeout of end_at; the margin is for a
            # starved event loop. Past it, the run is broken, not slow.
            done, late = await asyncio.wait(clients, timeout=config.duration_s + config.request_timeout_s + 30)
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
        elapsed = max(tally.last_answer_at, end_at) - started
        for task in done:
            task.result()  # a client that raised: a bug here, not an answer of the node
        if late:
            raise LoadSetupError(
                f"{len(late)} clients did not finish within the request timeout "
                f"after the load window; the load generator is starved"
            )
    return summarize(config, tally, elapsed)
