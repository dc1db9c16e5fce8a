"""bench/failover_bench.py: one short real run (one run per fault, one session per lane):
it exits 0, prints its table and the targets, writes JSON with one kill, one partition and
one step down, each measured, and leaves no process behind (restarted nodes and HAProxy
included). What the numbers are is the full bench's business; here only that they are
measured (a failover takes time, and never shows two ready nodes)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.processes import env_with_checkout, pid_alive
from tests.bench.run_bench import assert_exited_0, run_bench

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "bench" / "failover_bench.py"
SMOKE_DEADLINE_S = 180.0  # the run takes ~15 s; the rest is slack for a loaded machine


def test_smoke_run_measures_each_fault_prints_the_table_and_stops_everything(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    done = run_bench(
        BENCH,
        ["--runs", "1", "--sessions", "1", "--relaxed", "--json", str(out)],
        SMOKE_DEADLINE_S,
        env=env_with_checkout(),
    )
    assert_exited_0(done)

    assert "failed attempts" in done.stdout and "readiness gap" in done.stdout
    assert "kill -> another node ready, median" in done.stdout and "probe rounds with two ready nodes" in done.stdout
    result = json.loads(out.read_text())
    assert [r["fault"] for r in result["failovers"]] == ["kill", "partition"]
    for run in result["failovers"]:
        assert run["new"] != run["old"] and run["overlap_rounds"] == 0
        assert 0 < run["ready_s"] < 30 and run["failed_attempts"] >= 0
        assert set(run["first_step_s"]) == set(result["lanes"])
        assert all(v is not None and v >= run["ready_s"] for v in run["first_step_s"].values())
    [down] = result["step_downs"]
    assert down["new"] != down["old"] and down["gap_s"] is not None and down["overlap_rounds"] == 0
    assert result["measured"]["overlap_rounds"] == 0
    assert len(result["pids"]) >= 4  # three nodes and the killed one's restart (HAProxy too, when installed)
    assert not [pid for pid in result["pids"] if pid_alive(pid)]
