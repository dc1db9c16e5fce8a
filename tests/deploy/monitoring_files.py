"""What tests read from deploy/prometheus/ and deploy/grafana/: the PromQL expressions of
the alert rules and dashboard panels, the metric names they use, and promtool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS_CONFIG = DEPLOY / "prometheus.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "dex-ha.json"

# Every metric the nodes export starts with dex_ (metrics.py); PromQL functions never do.
METRIC_NAME = re.compile(r"\bdex_[a-zA-Z0-9_]+")
# Grafana fills this in per panel; any range does for checking the expression.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m"}


def alert_expressions() -> dict[str, str]:
    """Alert name -> its PromQL expression."""

    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_expressions() -> dict[str, str]:
    """ "<panel title> / <refId>" -> the PromQL of that target, Grafana variables filled in."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            exprs[f"{panel['title']} / {target['refId']}"] = expr
    return exprs


def metric_names(exprs: dict[str, str]) -> dict[str, set[str]]:
    """Metric name -> the alerts or panels that use it."""
    used: dict[str, set[str]] = {}
    for where, expr in exprs.items():
        for name in METRIC_NAME.findall(expr):
            used.setdefault(name, set()).add(where)
    return used


def promtool() -> str:
    """promtool's path; skip the test when it is missing (scripts/test installs the Debian
    package `prometheus` when it runs as root)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`; scripts/test installs it as root)")
    return path


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=60)
