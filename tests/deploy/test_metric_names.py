"""Every metric named in deploy/prometheus/alerts.yml and deploy/grafana/dex-ha.json is
exported by real nodes: the /metrics of a three-node `dex-ha cluster up` (the per-member
gauges only show on the leader of a cluster). A renamed metric would silently empty a panel
and silence an alert; this test fails instead."""

from __future__ import annotations

import re

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from harness.cluster_process import LocalCluster
from harness.waiting import eventually
from tests.deploy.monitoring_files import alert_expressions, dashboard_expressions, metric_names

# The sample names a family of each type writes (prometheus_client's text format).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
}
# `name{label="value", ...}` in PromQL: the labels a query selects on.
SELECTOR = re.compile(r"\b(dex_[a-zA-Z0-9_]+)\{([^}]*)\}")


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as response:
            assert response.status == 200, url
            return await response.text()


def exported(texts: list[str]) -> tuple[set[str], dict[str, set[str]]]:
    """(every sample name the nodes declare, sample name -> label names seen on its samples)."""
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
            for sample in family.samples:
                names.add(sample.name)
                labels.setdefault(sample.name, set()).update(sample.labels)
    return names, labels


async def test_every_metric_in_the_alerts_and_the_dashboard_is_exported(cluster: LocalCluster):
    leader = await cluster.active_node()
    texts: list[str] = []

    async def the_leader_tracks_both_followers():
        texts[:] = [await scrape(url) for url in cluster.urls.values()]
        return texts[list(cluster.urls).index(leader)].count("dex_raft_follower_lag_entries{") == 2

    await eventually(the_leader_tracks_both_followers, "the leader's per-member gauges", deadline_s=10)
    names, labels = exported(texts)
    exprs = {
        **{f"alert {k}": v for k, v in alert_expressions().items()},
        **{f"panel {k}": v for k, v in dashboard_expressions().items()},
    }
    used = metric_names(exprs)
    assert len(used) >= 15, sorted(used)  # the scan found the queries' metrics at all
    missing = {name: sorted(where) for name, where in used.items() if name not in names}
    assert not missing, f"not exported by the nodes: {missing}"
    for where, expr in exprs.items():
        for name, selector in SELECTOR.findall(expr):
            selected = {part.split("=")[0].strip().rstrip("!~") for part in selector.split(",") if part.strip()}
            if name in labels:  # labels are known only for metrics with samples yet
                assert selected <= labels[name], f"{where}: {name} has no label {selected - labels[name]}"
