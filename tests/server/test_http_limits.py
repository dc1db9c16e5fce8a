"""Slow and broken HTTP clients (dex_ha.server.http_limits): read timeouts for the request,
a cap on open connections with a reserve for /livez and /readyz, and clients that go away.

Most tests run a node in the test's event loop with small limits, and speak raw HTTP over
sockets so that they can stop half way through a request. One runs `dex-ha dev` as a child
process under a real open-files limit and counts its descriptors in /proc.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dex_ha.server.config import ConfigError, load_config
from dex_ha.server.http_limits import (
    ACCEPT_BATCH,
    FD_HEADROOM,
    PROBE_HEADER_TIMEOUT_S,
    PROBE_LISTENER_LIMITS,
    PROBE_RESERVE,
    HttpLimits,
)
from dex_ha.server.node import NodeServer
from harness.dev_process import DevProcess
from harness.waiting import eventually
from tests.server.conftest import HttpFactory, NodeFactory
from tests.server.node_fixture import expect, open_sse, single_node_config, tool

HALF_SENT = b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow\r\n"  # the blank line never comes
MARGIN_S = 3.0  # on top of a timeout: a busy 2-core machine is slow to run the timer


# ---------------------------------------------------------------- raw HTTP


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class RawConnection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    opened_at: float

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def closed_by_server(self, timeout_s: float) -> float | None:
        """Seconds from the connect until the server closed the connection (EOF or reset);
        None if it is still open after `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                while await self.reader.read(4096):
                    pass
        except TimeoutError:
            return None
        except ConnectionResetError:
            pass
        return time.monotonic() - self.opened_at

    async def response(self, timeout_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        """The next response: status, headers (lower-case names) and body (Content-Length)."""
        async with asyncio.timeout(timeout_s):
            head = await self.reader.readuntil(b"\r\n\r\n")
            status_line, *lines = head.decode().split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return int(status_line.split()[1]), headers, body

    def close(self) -> None:
        self.writer.close()


async def connect(port: int, first_bytes: bytes = b"") -> RawConnection:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = RawConnection(reader, writer, time.monotonic())
    if first_bytes:
        await conn.send(first_bytes)
    return conn


async def open_slow(port: int, count: int, first_bytes: bytes = HALF_SENT) -> list[RawConnection]:
    return [await connect(port, first_bytes) for _ in range(count)]


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def post_head(path: str, content_length: int, more_headers: bytes = b"") -> bytes:
    return (
        (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {content_length}\r\n"
        ).encode()
        + more_headers
        + b"\r\n"
    )


def sample(node: NodeServer, name: str, **labels: str) -> float:
    value = node.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def request_counts(node: NodeServer, route: str) -> dict[str, float]:
    """dex_http_requests_total of one route, by status code."""
    return {
        s.labels["code"]: s.value
        for metric in node.metrics.registry.collect()
        if metric.name == "dex_http_requests"
        for s in metric.samples
        if s.name == "dex_http_requests_total" and s.labels["route"] == route
    }


async def holds(what: Callable[[], bool]) -> bool:
    return what()


# ---------------------------------------------------------------- (a) header timeout


async def test_half_sent_and_silent_connections_are_closed_within_the_header_timeout(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    timeout_s = 0.5
    node = await nodes(single_node_config(tmp_path / "n", http_header_timeout_ms=int(timeout_s * 1000)))
    baseline = open_fds()
    clients = await open_slow(node.http_port, 100) + await open_slow(node.http_port, 100, first_bytes=b"")

    # Each is held until the header timeout (counted from its connect), then closed.
    closed_or_open = await asyncio.gather(*(c.closed_by_server(timeout_s + MARGIN_S) for c in clients))
    closed_after = [t for t in closed_or_open if t is not None]
    still_open = len(clients) - len(closed_after)
    assert still_open == 0, f"{still_open} of {len(clients)} connections outlived the header timeout"
    # (Half: this test's clock starts when its connect returns, the node's may start a little before.)
    assert min(closed_after) >= 0.5 * timeout_s, f"closed long before the header timeout: {min(closed_after):.2f} s"
    # Only our own ends are left open in this process: the node released its descriptors.
    assert open_fds() <= baseline + len(clients) + 5
    for c in clients:
        c.close()
    assert sample(node, "dex_http_connections_rejected_total", reason="header_timeout") == len(clients)
    await eventually(
        lambda: holds(lambda: sample(node, "dex_http_connections_open") == 0),
        deadline_s=5,
        what="dex_http_connections_open to return to 0",
    )


async def test_an_idle_keep_alive_connection_outlives_the_header_timeout_but_not_a_stalled_request(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    timeout_s = 0.3
    node = await nodes(single_node_config(tmp_path / "n", http_header_timeout_ms=int(timeout_s * 1000)))
    conn = await connect(node.http_port, get("/livez"))
    assert (await conn.response())[0] == 200
    await asyncio.sleep(3 * timeout_s)  # idle between requests: aiohttp's keep-alive timeout applies
    await conn.send(get("/livez"))
    assert (await conn.response())[0] == 200, "an idle keep-alive connection must stay usable"

    await conn.send(HALF_SENT)  # the next request begins and stalls
    conn.opened_at = time.monotonic()
    closed_after = await conn.closed_by_server(timeout_s + MARGIN_S)
    assert closed_after is not None, "a stalled request on a keep-alive connection was not closed"
    assert closed_after >= 0.5 * timeout_s
    conn.close()


async def test_long_polls_and_event_streams_outlast_the_read_timeouts(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path
) -> None:
    timeout_ms = 300
    node = await nodes(
        single_node_config(tmp_path / "n", http_header_timeout_ms=timeout_ms, http_body_timeout_ms=timeout_ms)
    )
    api = http(node)
    poll = expect(
        await api.post(
            "/v1/worker/poll",
            {"worker_id": "w1", "agents": ["a"], "max_tasks": 1, "wait_ms": 5 * timeout_ms},
            role="worker",
        ),
        200,
    )
    assert poll == {"tasks": []}

    await api.register_agent("a", [tool("lookup")])
    await api.create_session("a", "s1")
    response, stream = await open_sse(api, "s1")
    try:
        await stream.next_event()  # session_created: the stream is up
        await asyncio.sleep(5 * timeout_ms / 1000)  # quiet for longer than any read timeout
        await api.send_message("s1", "hello")
        await stream.until(lambda e: e.event == "message_received")
    finally:
        response.close()


# ---------------------------------------------------------------- body timeout


async def test_a_body_that_does_not_arrive_in_time_is_answered_408(nodes: NodeFactory, tmp_path: Path) -> None:
    timeout_s = 0.5
    node = await nodes(single_node_config(tmp_path / "n", auth=False, http_body_timeout_ms=int(timeout_s * 1000)))
    conn = await connect(node.http_port, post_head("/v1/sessions", 100) + b"{")
    status, headers, body = await conn.response(timeout_s + MARGIN_S)
    assert status == 408, body
    assert headers["content-type"].startswith("application/json")
    assert b'"error":"request_timeout"' in body
    conn.close()


# ---------------------------------------------------------------- (c) clients that go away


@pytest.mark.parametrize("path,route", [("/v1/sessions", "create_session"), ("/v1/worker/poll", "worker_poll")])
async def test_a_client_that_goes_away_mid_body_is_a_499_logged_at_debug_not_a_server_error(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture, path: str, route: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="dex_ha.server.http")
    node = await nodes(single_node_config(tmp_path / "n", auth=False))
    # With Expect: 100-continue the node says when its handler reads the body (as curl waits for).
    conn = await connect(node.http_port, post_head(path, 1000, b"Expect: 100-continue\r\n"))
    async with asyncio.timeout(5):
        assert await conn.reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    await conn.send(b"{")
    conn.close()  # 999 bytes short
    await eventually(
        lambda: holds(lambda: bool(request_counts(node, route))),
        deadline_s=5,
        what=f"the request to be counted in dex_http_requests_total{{route={route!r}}}",
    )
    assert request_counts(node, route) == {"499": 1}

    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, f"a client going away was logged as an error: {[r.getMessage() for r in errors]}"
    assert any("went away" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)
    metrics = (await http(node, auth=False).get("/metrics", role=None)).body
    assert 'code="500"' not in metrics, [line for line in metrics.splitlines() if 'code="500"' in line]


# ---------------------------------------------------------------- (b) the cap and the probe reserve


async def test_over_the_cap_probes_are_answered_and_other_requests_get_503_overloaded(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    cap = 8
    node = await nodes(single_node_config(tmp_path / "n", auth=False, http_max_connections=cap))
    assert sample(node, "dex_http_connections_max") == cap
    # The cap, the whole reserve, and more: the newest push the oldest out of the reserve.
    evicted = 24
    slow = await open_slow(node.http_port, cap + PROBE_RESERVE + evicted)
    await eventually(
        lambda: holds(lambda: sample(node, "dex_http_connections_rejected_total", reason="over_capacity") == evicted),
        deadline_s=10,
        what="the oldest slow reserve connections to be closed",
    )
    assert sample(node, "dex_http_connections_open") == cap + PROBE_RESERVE

    for _ in range(10):
        for path in ("/livez", "/readyz"):
            probe = await connect(node.http_port, get(path))
            status, headers, body = await probe.response(timeout_s=5)
            assert status == 200, (path, body)
            assert headers.get("connection", "").lower() == "close", "a reserve connection serves one request"
            probe.close()

    other = await connect(node.http_port, post_head("/v1/sessions", 2) + b"{}")
    status, headers, body = await other.response(timeout_s=5)
    assert status == 503 and b'"error":"overloaded"' in body, (status, body)
    assert headers["retry-after"] == "1"
    assert await other.closed_by_server(5) is not None, "the overloaded answer closes the connection"

    for conn in slow:
        conn.close()
    await eventually(
        lambda: holds(lambda: sample(node, "dex_http_connections_open") == 0),
        deadline_s=5,
        what="every slow connection to be gone",
    )
    below_cap = await connect(node.http_port, get("/v1/sessions"))
    assert (await below_cap.response())[0] == 200
    below_cap.close()


async def test_the_probe_listener_holds_few_connections_and_closes_silent_ones(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    node = await nodes(single_node_config(tmp_path / "n", auth=False, probe_listen=("127.0.0.1", 0)))
    assert node.probes is not None
    cap = PROBE_LISTENER_LIMITS.max_connections
    clients = await open_slow(node.probes.port, cap + 40, first_bytes=b"")
    closed_or_open = await asyncio.gather(*(c.closed_by_server(PROBE_HEADER_TIMEOUT_S + MARGIN_S) for c in clients))
    closed_after = [t for t in closed_or_open if t is not None]
    assert len(closed_after) == len(clients), "the probe port held silent connections past its timeout"
    # The ones over the cap were closed at once, the others at the header timeout.
    assert sum(t < 0.5 * PROBE_HEADER_TIMEOUT_S for t in closed_after) == 40, sorted(closed_after)
    for c in clients:
        c.close()
    probe = await connect(node.probes.port, get("/readyz"))
    assert (await probe.response())[0] == 200
    probe.close()


def _open_files_limit(soft: int, hard: int) -> Callable[[], None]:
    def set_limit() -> None:  # in the child, before exec: like `ulimit -n`
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return set_limit


async def _probe(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as response:
        return response.status, await response.text()


async def test_dev_under_a_low_open_files_limit_answers_every_probe_and_keeps_descriptors_for_itself(
    tmp_path: Path,
) -> None:
    soft, hard = 200, 300
    dev = DevProcess(tmp_path / "data", tmp_path / "dev.log", preexec_fn=_open_files_limit(soft, hard))
    dev.start()
    assert dev.proc is not None
    pid = dev.proc.pid
    slow: list[RawConnection] = []
    try:
        await dev.wait_ready()
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection per probe, as kubelet does
        async with aiohttp.ClientSession(connector=connector) as session:
            _, metrics = await _probe(session, dev.url + "/metrics")
            # The node raised its soft limit to the hard one and derived its cap from that.
            cap = hard - FD_HEADROOM - PROBE_RESERVE - ACCEPT_BATCH
            assert f"dex_http_connections_max {cap}.0" in metrics, dev.log_tail()
            baseline = open_fds(pid)

            slow = await open_slow(dev.port, 2 * hard)  # more than the process may have open
            peak = open_fds(pid)
            for _ in range(20):
                for path in ("/livez", "/readyz"):
                    status, body = await _probe(session, dev.url + path)
                    assert status == 200, (path, body, dev.log_tail())
                peak = max(peak, open_fds(pid))
            # Still over the cap: anything but a probe is turned away.
            async with session.post(dev.url + "/v1/sessions", json={"agent": "a"}) as response:
                assert response.status == 503 and (await response.json())["error"] == "overloaded"
            # HTTP clients hold no more than the cap, the reserve and one accept batch.
            assert peak <= baseline + hard - FD_HEADROOM, (peak, baseline)

            for conn in slow:
                conn.close()
            slow = []
            await eventually(
                lambda: holds(lambda: open_fds(pid) <= baseline + 2),
                deadline_s=10,
                what="the node's descriptors to return to their baseline",
            )
            status, _ = await _probe(session, dev.url + "/livez")
            assert status == 200
    finally:
        for conn in slow:
            conn.close()
        dev.stop()


# ---------------------------------------------------------------- settings


def test_the_default_cap_leaves_headroom_below_the_open_files_limit_and_an_explicit_one_is_clamped() -> None:
    def limits(open_files: int, **config: Any) -> HttpLimits:
        return HttpLimits.from_config(single_node_config(Path("unused"), **config), open_files=open_files)

    assert limits(1024).max_connections == 1024 - FD_HEADROOM - PROBE_RESERVE - ACCEPT_BATCH
    assert limits(1 << 20).max_connections == 10_000  # memory bounds it too
    assert limits(1024, http_max_connections=100).max_connections == 100
    assert limits(1024, http_max_connections=5000).max_connections == 1024 - FD_HEADROOM - PROBE_RESERVE - ACCEPT_BATCH
    # The probe listener's connections come out of the same budget.
    with_probes = limits(1024, probe_listen=("127.0.0.1", 0)).max_connections
    assert with_probes == 1024 - FD_HEADROOM - PROBE_RESERVE - ACCEPT_BATCH - PROBE_LISTENER_LIMITS.descriptors()
    assert limits(1024).header_timeout_s == 10 and limits(1024).handler_args() == {"keepalive_timeout": 75}


def test_http_settings_load_from_toml_and_environment_and_are_checked(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text(
        'node_id = "n1"\ndata_dir = "/tmp/n1"\nhttp_listen = "127.0.0.1:8801"\n'
        'raft_listen = "127.0.0.1:9801"\nhttp_header_timeout_ms = 5000\nhttp_max_connections = 300\n'
        '[[peers]]\nid = "n1"\nraft_addr = "127.0.0.1:9801"\nurl = "http://127.0.0.1:8801"\n'
    )
    config = load_config(toml, env={"DEX_HA_HTTP_BODY_TIMEOUT_MS": "7000"}, insecure=True)
    assert (
        config.http_header_timeout_ms,
        config.http_body_timeout_ms,
        config.http_keepalive_timeout_ms,
        config.http_max_connections,
    ) == (5000, 7000, 75_000, 300)

    with pytest.raises(ConfigError, match="http_header_timeout_ms: must be positive"):
        load_config(toml, env={"DEX_HA_HTTP_HEADER_TIMEOUT_MS": "0"}, insecure=True)
    with pytest.raises(ConfigError, match="http_max_connections: must be int"):
        toml.write_text(toml.read_text().replace("http_max_connections = 300", 'http_max_connections = "300"'))
        load_config(toml, env={}, insecure=True)


async def test_headers_sent_slowly_but_within_the_timeout_are_answered(nodes: NodeFactory, tmp_path: Path) -> None:
    node = await nodes(single_node_config(tmp_path / "n", http_header_timeout_ms=2000))
    conn = await connect(node.http_port, b"GET /livez HTTP/1.1\r\n")
    await asyncio.sleep(0.3)  # a slow client, within the timeout
    await conn.send(b"Host: 127.0.0.1\r\n\r\n")
    status, _, body = await conn.response()
    assert status == 200, body
    conn.close()
