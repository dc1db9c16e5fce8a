"""The node's Prometheus metrics (prefix `dex_`; the names are a contract: dashboards and alerts use them).

Each node has its own registry (no global state: tests run several nodes in one process).
Counters and histograms are updated where things happen; gauges that describe state
(term, indexes, queued steps, sessions, …) are read when /metrics is scraped, from the
Raft node and the engine. `dex_tool_calls_total` is read from the replicated state, so it
does not restart from zero on the node that takes over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A scrape sees values at most this old (Prometheus scrapes every 10-60 s).
RENDER_INTERVAL_S = 1.0
SCHEDULE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0)


class ServerMetrics:
    """Counters and histograms, plus a collector for the state gauges."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rendered: tuple[float, bytes] | None = None  # (when, text) of the latest render
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.proposal_seconds = Histogram(
            "dex_raft_proposal_seconds", "Time from propose to applied.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.proposals_timed_out = Counter(
            "dex_raft_proposals_timed_out",
            "Client writes answered 503 unavailable because they were not committed within "
            "proposal_timeout_ms (they may still commit later).",
            registry=r,
        )
        self.fsync_seconds = Histogram(
            "dex_raft_fsync_seconds", "Time of one Raft log fsync.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.attempts_started = Counter("dex_attempts_started", "Attempts handed out to Workers.", ["kind"], registry=r)
        self.attempts_failed = Counter(
            "dex_attempts_failed", "Attempts failed, by reason.", ["kind", "reason"], registry=r
        )
        self.schedule_to_start = Histogram(
            "dex_step_schedule_to_start_seconds",
            "Time a task step waited in its queue before hand-out.",
            ["kind"],
            buckets=SCHEDULE_BUCKETS,
            registry=r,
        )
        self.http_requests = Counter(
            "dex_http_requests", "HTTP requests by route and status code.", ["route", "code"], registry=r
        )
        self._http_children: dict[tuple[str, int], Any] = {}
        self.consistency_mismatches = Counter(
            "dex_consistency_mismatches",
            "On the leader: members found with a state hash that differs from the majority's at a "
            "consistency check (each is logged at ERROR and put under the consistency alarm).",
            registry=r,
        )
        # Connections (dex_ha.server.http_limits). A request the client gave up on is counted
        # in dex_http_requests_total with code 499, never as a 5xx.
        self.http_connections_open = Gauge(
            "dex_http_connections_open",
            "Open HTTP connections on the API port, the probe reserve included.",
            registry=r,
        )
        self.http_connections_max = Gauge(
            "dex_http_connections_max",
            "The cap on open HTTP connections on the API port (http_max_connections); "
            "/livez and /readyz have a small reserve above it.",
            registry=r,
        )
        self.http_connections_rejected = Counter(
            "dex_http_connections_rejected",
            "API-port HTTP connections closed before their request was answered, "
            "by reason: over_capacity (the cap and the probe reserve were full, or a non-probe request came on "
            "the reserve), header_timeout (the request's headers did not arrive in time), accept_error (accept "
            "failed, e.g. out of file descriptors).",
            ["reason"],
            registry=r,
        )

    def count_request(self, route: str, code: int) -> None:
        """`dex_http_requests_total{route,code}` + 1 (the labelled child is looked up once)."""
        child = self._http_children.get((route, code))
        if child is None:
            child = self._http_children[(route, code)] = self.http_requests.labels(route=route, code=str(code))
        child.inc()

    def add_state_gauges(self, read_state: Callable[[], dict[str, Any]]) -> None:
        """`read_state()` returns the gauge values at scrape time (see NodeServer.metrics_state)."""
        self.registry.register(_StateCollector(read_state))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def render_cached(self) -> bytes:
        """The exposition text, rendered at most once per RENDER_INTERVAL_S: a scrape flood
        then costs a dictionary of bytes per request, not a pass over the state each."""
        now = self._clock()
        if self._rendered is None or now - self._rendered[0] >= RENDER_INTERVAL_S:
            self._rendered = (now, self.render())
        return self._rendered[1]


class _StateCollector:
    def __init__(self, read_state: Callable[[], dict[str, Any]]) -> None:
        self._read_state = read_state

    def describe(self) -> list[Metric]:
        return []  # values come at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        s = self._read_state()
        for name, help_text in (
            ("dex_raft_term", "Current Raft term."),
            ("dex_raft_is_leader", "1 on the Raft leader."),
            ("dex_active", "1 only on the active node (leader, lease, takeover, not draining)."),
            ("dex_raft_commit_index", "Highest log index known committed."),
            ("dex_raft_applied_index", "Highest log index applied to the engine."),
            ("dex_lease_remaining_seconds", "Seconds left on the leader's lease (0 elsewhere)."),
            (
                "dex_raft_leader_contact_gap_max_seconds",
                "Largest gap between two messages from the leader of the current term, as "
                "they arrived here (0 on the leader); near the election timeout, a failover is close.",
            ),
            ("dex_timers_pending", "Timers waiting to fire."),
            (
                "dex_engine_wal_bytes",
                "Size of the engine database's write-ahead log; it should stay at tens of MB. "
                "Steady growth means checkpoints do not keep up (see the node's log).",
            ),
            (
                "dex_state_bytes",
                "Size of the engine database file (the state), without its write-ahead log; it shrinks "
                "after sessions are deleted (by DELETE or by retention_days).",
            ),
            (
                "dex_state_free_bytes",
                "Bytes of free pages inside the engine database file, not yet given back to the file system "
                "(they are, within moments of a deletion).",
            ),
            ("dex_http_requests_in_flight", "Requests being worked on, of those admission control bounds."),
            (
                "dex_http_request_body_bytes_in_flight",
                "Bytes of the request bodies being read or worked on (admission control: max_inflight_body_bytes).",
            ),
            ("dex_sse_streams", "SSE event streams open (capped by max_streams and max_streams_per_token)."),
            ("dex_workers_connected", "Workers seen polling or heartbeating recently."),
            ("dex_worker_channels_open", "Workers connected over the Worker channel (on the active node)."),
            (
                "dex_disk_full",
                "1 while this node's disk is full: it writes nothing, answers writes 503 no_space "
                "and resumes by itself once space is freed (see its log for the path).",
            ),
        ):
            yield GaugeMetricFamily(name, help_text, value=s[name])
        shed = CounterMetricFamily(
            "dex_http_requests_shed",
            "Requests answered 503 overloaded at once (admission control: max_inflight_requests, "
            "max_inflight_body_bytes).",
        )
        shed.add_metric([], s["dex_http_requests_shed_total"])
        yield shed
        streams_shed = CounterMetricFamily(
            "dex_sse_streams_shed",
            "Event streams answered 503 overloaded at once (max_streams or max_streams_per_token reached).",
        )
        streams_shed.add_metric([], s["dex_sse_streams_shed_total"])
        yield streams_shed
        leader_changes = CounterMetricFamily("dex_raft_leader_changes", "Leader changes seen by this node.")
        leader_changes.add_metric([], s["dex_raft_leader_changes_total"])
        yield leader_changes
        slow_turns = CounterMetricFamily(
            "dex_raft_slow_turns",
            "Turns of the Raft loop longer than a quarter of the election timeout (kind=long), "
            "and gaps as long between two turns (kind=late); each is logged as a warning.",
            labels=["kind"],
        )
        for kind, n in sorted(s["dex_raft_slow_turns_total"].items()):
            slow_turns.add_metric([kind], n)
        yield slow_turns
        queued = GaugeMetricFamily("dex_steps_queued", "Task steps waiting for a Worker.", labels=["agent", "kind"])
        for (agent, kind), n in sorted(s["steps_queued"].items()):
            queued.add_metric([agent, kind], n)
        yield queued
        sessions = GaugeMetricFamily("dex_sessions", "Sessions stored, by status.", labels=["status"])
        for status, n in sorted(s["sessions"].items()):
            sessions.add_metric([status], n)
        yield sessions
        deleted = CounterMetricFamily(
            "dex_sessions_deleted",
            "Sessions deleted, by how: deleted (DELETE /v1/sessions/{id}) or expired (retention_days). "
            "Replicated, so it does not restart from zero on the node that takes over.",
            labels=["how"],
        )
        for how in ("deleted", "expired"):
            deleted.add_metric([how], s["sessions_deleted"].get(how, 0))
        yield deleted
        yield from _follower_families(s["followers"])
        alarm = GaugeMetricFamily(
            "dex_consistency_alarm",
            "1 for each member under the consistency alarm (its state differed from the majority's at a "
            "consistency check: it cannot become the leader; replace it). Every node exports the same.",
            labels=["member"],
        )
        for member in sorted(s["consistency_alarms"]):
            alarm.add_metric([member], 1)
        yield alarm
        lost = CounterMetricFamily(
            "dex_raft_follower_lost_entries",
            "On the leader: times the member's answers showed it lacked entries it had acknowledged "
            "(a wiped data directory, a disk that lost writes); each is logged as an error.",
            labels=["member"],
        )
        for member, n in sorted(s["dex_raft_follower_lost_entries_total"].items()):
            lost.add_metric([member], n)
        yield lost
        calls = CounterMetricFamily(
            "dex_tool_calls",
            "Tool call outcomes recorded (a reconciled call counts as outcome_unknown and again as its settlement).",
            labels=["outcome"],
        )
        for outcome, n in sorted(s["tool_calls"].items()):
            calls.add_metric([outcome], n)
        yield calls


def _follower_families(followers: dict[str, tuple[int, float]]) -> Iterator[Metric]:
    """Per-member replication gauges, exported by the leader only (followers track no one)."""
    lag = GaugeMetricFamily(
        "dex_raft_follower_lag_entries",
        "On the leader: entries the member is behind the commit index (its match index); absent on other nodes.",
        labels=["member"],
    )
    contact = GaugeMetricFamily(
        "dex_raft_follower_last_contact_seconds",
        "On the leader: seconds since the "
        "member last answered; a heartbeat interval when healthy, growing while it is "
        "unreachable; absent on other nodes.",
        labels=["member"],
    )
    for member, (behind, seconds) in sorted(followers.items()):
        lag.add_metric([member], behind)
        contact.add_metric([member], seconds)
    yield lag
    yield contact
