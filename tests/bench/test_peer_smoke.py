"""bench/peer/run.py: a very short real run of dex-ha and Restate side by side (one node,
one concurrency, a couple of seconds each), when the peers are installed.

It proves the harness measures both systems in one run: it exits 0, writes JSON with a row
of each system whose steps/s is positive, prints the ratio line, and leaves no process
behind. Without an install (`python bench/peer/install.py`), it is skipped.

Temporal's smoke run (dex-ha and the Temporal dev server) starts a Go server and two SDK
processes and takes about half a minute more: it runs when DEX_HA_BENCH_TEMPORAL=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench.run_bench import assert_exited_0, run_bench

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench.peer.install import default_dir, load_manifest  # noqa: E402
from harness.processes import env_with_checkout, pid_alive  # noqa: E402

RUN = REPO_ROOT / "bench" / "peer" / "run.py"
SMOKE_DEADLINE_S = 55.0  # the run takes ~15 s; it must stay under a minute on a loaded machine
TEMPORAL_SMOKE_DEADLINE_S = 120.0


def run_peer_smoke(
    peer_dir: Path, args: list[str], out: Path, deadline_s: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """One short run of bench/peer/run.py (one node, concurrency 4, no failover) with the
    peer's `args`: the finished process, its JSON, its one steps phase and that phase's rows by system."""
    fixed = ["--dir", str(peer_dir), "--deployments", "one", "--concurrency", "4", "--failover-runs", "0"]
    done = run_bench(RUN, [*fixed, *args, "--json", str(out)], deadline_s, env=env_with_checkout())
    assert_exited_0(done)
    result = json.loads(out.read_text())
    [phase] = result["steps"]
    return done, result, phase, {row["system"]: row for row in phase["rows"]}


def test_one_short_run_measures_both_systems_and_stops_every_process(tmp_path: Path) -> None:
    peer_dir = default_dir()
    manifest = load_manifest(peer_dir)
    if manifest is None:
        pytest.skip(
            f"the peers are not installed in {peer_dir} (DEX_HA_PEER_DIR): run "
            f"`python bench/peer/install.py` to install Restate, its SDK and etcd there"
        )
    args = ["--peers", "restate", "--duration-s", "2", "--warmup-s", "0.5", "--turns-per-session", "3"]
    done, result, phase, rows = run_peer_smoke(peer_dir, args, tmp_path / "peer.json", SMOKE_DEADLINE_S)
    assert set(rows) == {"dex-ha", "dex-ha/http", "restate"}
    assert rows["dex-ha"]["steps_bench_row"]["transport"] == "channel"
    assert rows["dex-ha/http"]["steps_bench_row"]["transport"] == "http"
    for system, row in rows.items():
        assert row["concurrency"] == 4
        assert row["steps"] > 0 and row["steps_per_second"] > 0, f"{system}: {row}"
        assert row["server_rss_mb"] > 0 and row["sdk_rss_mb"] > 0, f"{system}: {row}"
    summary = phase["summary"]
    expected = round(rows["dex-ha"]["steps_per_second"] / rows["restate"]["steps_per_second"], 2)
    assert summary["ratio"]["best_steps_per_second"] == expected
    assert "(dex-ha / Restate)" in done.stdout
    http_ratio = round(rows["dex-ha"]["steps_per_second"] / rows["dex-ha/http"]["steps_per_second"], 2)
    assert summary["ratio_http"]["best_steps_per_second"] == http_ratio
    assert "(dex-ha / dex-ha on HTTP)" in done.stdout
    assert result["versions"]["restate_server"] == manifest["restate_version"]
    if manifest.get("etcd"):
        [etcd_row] = result["etcd"]["rows"]
        assert etcd_row["commits_per_second"] > 0
    assert [pid for pid in result["pids"] if pid_alive(pid)] == []


@pytest.mark.skipif(
    os.environ.get("DEX_HA_BENCH_TEMPORAL") != "1",
    reason="Temporal's smoke run is opt-in (DEX_HA_BENCH_TEMPORAL=1): it starts the Temporal dev server",
)
def test_one_short_run_measures_temporal_activities_and_stops_every_process(tmp_path: Path) -> None:
    peer_dir = default_dir()
    manifest = load_manifest(peer_dir)
    if manifest is None:
        pytest.skip(f"the peers are not installed in {peer_dir}: run `python bench/peer/install.py`")
    args = ["--peers", "temporal", "--duration-s", "3", "--warmup-s", "1", "--no-etcd"]
    done, result, phase, rows = run_peer_smoke(peer_dir, args, tmp_path / "peer.json", TEMPORAL_SMOKE_DEADLINE_S)
    assert set(rows) == {"dex-ha", "temporal"}
    temporal = rows["temporal"]
    # 10 turns = 30 activities per workflow: at c=4 no workflow finishes within 3 s, so
    # every step counted is an activity of a workflow still running.
    assert temporal["steps"] > 0 and temporal["steps_per_second"] > 0, temporal
    assert temporal["server_cpu_ms_per_step"] > 0, temporal
    summary = phase["summary"]
    expected = round(rows["dex-ha"]["steps_per_second"] / temporal["steps_per_second"], 2)
    assert summary["ratio_temporal"]["best_steps_per_second"] == expected
    assert "(dex-ha / Temporal)" in done.stdout
    assert result["versions"]["temporalio"] == manifest["temporalio_version"]
    assert [pid for pid in result["pids"] if pid_alive(pid)] == []
