"""A real Prometheus server (Debian's `prometheus`) scraping a local cluster, for tests.

The config is generated from the shipped deploy/prometheus.yml: the same rule file
(deploy/prometheus/alerts.yml, copied with only chosen `for:` durations shortened), the
same job, its targets pointed at the loopback nodes, and short scrape and evaluation
intervals. The server runs on a free port with its data directory under the test's tmp
path, and is stopped by pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from harness.ports import free_ports
from harness.processes import stop

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SHIPPED_CONFIG = DEPLOY / "prometheus.yml"
START_DEADLINE_S = 30.0


def prometheus_binary() -> str | None:
    """The server's path (the Debian package `prometheus`, which also gives promtool)."""
    return shutil.which("prometheus")


def rules_with_shorter_for(rules_text: str, for_of_alert: dict[str, str]) -> str:
    """The shipped rules with the `for:` of the named alerts replaced (nothing else
    changes); KeyError for an alert name the file does not have, so a renamed alert fails
    the test rather than silently keeping its long `for:`."""
    doc = yaml.safe_load(rules_text)
    seen = set()
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in for_of_alert:
                rule["for"] = for_of_alert[rule["alert"]]
                seen.add(rule["alert"])
    missing = set(for_of_alert) - seen
    if missing:
        raise KeyError(f"no such alerts in the shipped rules: {sorted(missing)}")
    return yaml.safe_dump(doc, sort_keys=False)


def config_for(targets: dict[str, str], rule_file: Path, interval: str) -> str:
    """deploy/prometheus.yml with the dex-ha job's targets replaced by `targets` (node id ->
    host:port), the given rule file and scrape/evaluation interval; the rest as shipped."""
    doc = yaml.safe_load(SHIPPED_CONFIG.read_text())
    doc["global"]["scrape_interval"] = interval
    doc["global"]["evaluation_interval"] = interval
    doc["rule_files"] = [str(rule_file)]
    (job,) = [j for j in doc["scrape_configs"] if j["job_name"] == "dex-ha"]
    job["static_configs"] = [{"targets": [hostport], "labels": {"node": node}} for node, hostport in targets.items()]
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]

    async def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; its `data` (the request must succeed)."""
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{self.url}/api/v1/{path}", params=params, timeout=aiohttp.ClientTimeout(10)) as r:
                body = await r.json()
        assert body["status"] == "success", body
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector (a scalar answer is given as one sample)."""
        data = await self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    async def alerts(self) -> list[dict[str, Any]]:
        """Alerts pending or firing now (labels, state)."""
        return (await self.api("alerts"))["alerts"]

    async def firing(self) -> set[str]:
        return {a["labels"]["alertname"] for a in await self.alerts() if a["state"] == "firing"}


@contextlib.asynccontextmanager
async def prometheus_scraping(
    targets: dict[str, str], directory: Path, for_of_alert: dict[str, str], interval: str = "1s"
) -> AsyncIterator[Prometheus]:
    """Run Prometheus on a free loopback port until the block ends (then SIGTERM by pid)."""
    binary = prometheus_binary()
    assert binary is not None, "prometheus is not installed"
    directory.mkdir(parents=True, exist_ok=True)
    rules = directory / "alerts.yml"
    rules.write_text(rules_with_shorter_for((DEPLOY / "prometheus" / "alerts.yml").read_text(), for_of_alert))
    config = directory / "prometheus.yml"
    config.write_text(config_for(targets, rules, interval))
    (port,) = free_ports(1)
    log = (directory / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        server = Prometheus(f"http://127.0.0.1:{port}", proc)
        await _wait_ready(server, directory / "prometheus.log")
        yield server
    finally:
        stop(proc)
        log.close()


async def _wait_ready(server: Prometheus, log: Path) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            assert server.proc.poll() is None, f"prometheus exited:\n{log.read_text()[-3000:]}"
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with http.get(server.url + "/-/ready", timeout=aiohttp.ClientTimeout(1)) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise AssertionError(f"prometheus not ready within {START_DEADLINE_S} s:\n{log.read_text()[-3000:]}")
