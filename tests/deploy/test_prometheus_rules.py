"""deploy/prometheus/: the alert rules are valid, prometheus.yml loads them, their unit tests
(alerts_test.yml) pass, and the dashboard's queries are valid PromQL. All with promtool."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy.monitoring_files import (
    ALERTS,
    ALERTS_TEST,
    PROMETHEUS_CONFIG,
    alert_expressions,
    dashboard_expressions,
    run_promtool,
)

EXPECTED_ALERTS = {
    "DexHaNoActiveNode",
    "DexHaSeveralActiveNodes",
    "DexHaLeaderFlapping",
    "DexHaDispatchQueueGrowing",
    "DexHaOutcomeUnknownCalls",
    "DexHaFsyncSlow",
    "DexHaFollowerLagging",
    "DexHaFollowerLostEntries",
    "DexHaWritesNotCommitted",
    "DexHaApplyLagging",
    "DexHaMemberUnreachable",
    "DexHaEngineWalGrowing",
    "DexHaConsistencyAlarm",
}


def test_the_rules_are_valid_and_cover_what_operators_need():
    checked = run_promtool("check", "rules", ALERTS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert set(alert_expressions()) == EXPECTED_ALERTS


def test_prometheus_yml_is_valid_and_loads_the_rules():
    checked = run_promtool("check", "config", PROMETHEUS_CONFIG)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"Checking {ALERTS}" in checked.stdout, checked.stdout  # rule_files found and checked


def test_the_rule_unit_tests_pass():
    tested = run_promtool("test", "rules", ALERTS_TEST)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    exercised = {
        case["alertname"]
        for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert len(exercised) >= 3, f"alerts_test.yml makes only {sorted(exercised)} fire"


def test_the_rule_unit_tests_catch_a_broken_rule(tmp_path: Path):
    """The same tests against a copy whose no-active-node rule waits a minute: they must fail."""
    broken = ALERTS.read_text().replace(
        "(sum(dex_active) or vector(0)) < 1\n        for: 10s", "(sum(dex_active) or vector(0)) < 1\n        for: 1m"
    )
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    (tmp_path / "alerts_test.yml").write_text(ALERTS_TEST.read_text())
    tested = run_promtool("test", "rules", tmp_path / "alerts_test.yml")
    assert tested.returncode != 0 and "DexHaNoActiveNode" in tested.stdout + tested.stderr, tested.stdout


def test_every_dashboard_query_is_valid_promql(tmp_path: Path):
    """promtool parses expressions only in rule files: check each panel query as a recording rule."""
    queries = dashboard_expressions()
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(queries.values())],
            }
        ]
    }
    (tmp_path / "dashboard_rules.yml").write_text(yaml.safe_dump(rules))
    checked = run_promtool("check", "rules", tmp_path / "dashboard_rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(queries)} rules found" in checked.stdout
