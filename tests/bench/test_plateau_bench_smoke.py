"""bench/plateau_bench.py: a very short real run (two `dex-ha dev` nodes, a Worker each,
two concurrencies at the same time), plus the ratios it reports."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from harness.processes import pid_alive
from tests.bench.run_bench import assert_exited_0, run_bench
from tests.bench.test_steps_bench_smoke import load_module

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "bench" / "plateau_bench.py"
SMOKE_DEADLINE_S = 120.0  # the run takes ~15 s; the rest is slack for a loaded machine

plateau_bench = load_module(BENCH, "plateau_bench_under_test")
steps_bench = plateau_bench.steps_bench


def test_smoke_run_measures_both_concurrencies_each_round_swapping_the_nodes(tmp_path: Path) -> None:
    out = tmp_path / "plateau.json"
    args = ["--low", "1", "--high", "4", "--rounds", "2", "--duration-s", "2", "--warmup-s", "0.5"]
    done = run_bench(
        BENCH,
        [*args, "--turns-per-session", "3", "--json", str(out)],
        SMOKE_DEADLINE_S,
    )
    assert_exited_0(done)
    assert "steps/s ratio" in done.stdout

    result = json.loads(out.read_text())
    rounds = result["rounds"]
    assert result["deployment"] == "dev"
    assert [r["deployment_of_high"] for r in rounds] == [1, 0]  # the nodes swap
    for r in rounds:
        assert (r["low"]["concurrency"], r["high"]["concurrency"]) == (1, 4)
        assert r["low"]["worker_pid"] != r["high"]["worker_pid"]
        for role in ("low", "high"):
            assert r[role]["steps"] > 0 and r[role]["failed_results"] == 0
            assert r[role]["worker_stopped_cleanly"] is True
        assert r["ratios"]["steps_per_second"] == round(r["high"]["steps_per_second"] / r["low"]["steps_per_second"], 3)
    median = statistics.median(r["ratios"]["steps_per_second"] for r in rounds)
    assert result["summary"]["steps_per_second_ratio"] == round(median, 3)
    # Two nodes and two Workers a round, all stopped by the bench before it exited.
    assert len(result["pids"]) == 2 + 2 * len(rounds)
    assert [pid for pid in result["pids"] if pid_alive(pid)] == []


def test_the_ratios_are_high_over_low_and_the_summary_takes_their_median() -> None:
    def row(steps_per_second: float, server: float | None, worker: float) -> dict[str, float | None]:
        return {
            "steps_per_second": steps_per_second,
            "server_cpu_ms_per_step": server,
            "worker_cpu_ms_per_step": worker,
        }

    one = plateau_bench.compare({"low": row(500.0, 1.0, 0.5), "high": row(450.0, 1.1, 0.6)})
    assert one == {"steps_per_second": 0.9, "server_cpu_ms_per_step": 1.1, "worker_cpu_ms_per_step": 1.2}
    two = plateau_bench.compare({"low": row(400.0, None, 0.5), "high": row(380.0, 1.0, 0.55)})
    assert two["steps_per_second"] == 0.95 and two["server_cpu_ms_per_step"] is None
    three = plateau_bench.compare({"low": row(400.0, 1.0, 0.5), "high": row(200.0, 2.0, 1.0)})
    summary = plateau_bench.summarize([{"ratios": r} for r in (one, two, three)])
    assert summary["steps_per_second_ratio"] == 0.9  # the median of 0.9, 0.95, 0.5
    assert summary["server_cpu_ms_per_step_ratio"] == round((1.1 + 2.0) / 2, 3)  # the round without it left out
    assert summary["worker_cpu_ms_per_step_ratio"] == 1.2


def test_the_concurrencies_must_rise() -> None:
    done = run_bench(
        BENCH,
        ["--low", "64", "--high", "64"],
        30,
    )
    assert done.returncode == 2 and "--low and --high" in done.stderr
