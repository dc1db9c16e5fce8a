"""bench/tracing_cost_bench.py: its quick mode end to end (three `dex-ha dev` nodes one after
another: without the otel extra, with it and tracing off, with it exporting), plus the
ratios it reports.

The smoke run proves the bench compares what it says: the first node ran in a venv without
OpenTelemetry, only the third sent traces, every row committed steps, the ratios are to the
first row, and no process is left behind. It needs the venv without the extra: cached, or
built now from the package index; without either it is skipped.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
from pathlib import Path

import pytest

from harness.processes import pid_alive
from tests.bench.run_bench import assert_exited_0, run_bench
from tests.bench.test_steps_bench_smoke import load_module

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed (pip install -e '.[otel]')")
pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto is not installed")

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "bench" / "tracing_cost_bench.py"
SMOKE_DEADLINE_S = 180.0  # the quick run takes ~45 s; the rest is slack for a loaded machine

tracing_cost_bench = load_module(BENCH, "tracing_cost_bench_under_test")


@pytest.mark.timeout(900)  # building the venv on the first run may take minutes
def test_quick_run_compares_no_extra_extra_and_exporting_and_stops_every_process(tmp_path: Path) -> None:
    try:
        tracing_cost_bench.plain_venv()
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.skip(
            f"the venv without the otel extra is not cached in {tracing_cost_bench.CACHE_DIR} and could not "
            f"be built (is the package index reachable?): {exc}"
        )
    out = tmp_path / "tracing_cost.json"
    done = run_bench(BENCH, ["--quick", "--json", str(out)], SMOKE_DEADLINE_S)
    assert_exited_0(done)
    assert "steps/s vs A" in done.stdout and "srv CPU vs A" in done.stdout

    result = json.loads(out.read_text())
    assert (result["concurrency"], result["duration_s"], result["rounds"]) == (16, 5.0, 1)
    rows = result["rows"]
    assert [r["config"] for r in rows] == ["A", "B", "C"]
    plain = result["interpreters"]
    assert plain["plain"]["opentelemetry"] is False and plain["extra"]["exporter"] is True
    assert rows[0]["python"] == plain["plain_python"] != rows[1]["python"] == rows[2]["python"]
    assert [r["otlp_exports"] > 0 for r in rows] == [False, False, True]  # only C exported
    for row in rows:
        assert row["concurrency"] == 16
        assert row["steps"] > 0 and row["failed_results"] == 0
        assert row["server_cpu_ms_per_step"] > 0
        assert row["worker_stopped_cleanly"] is True
    summary = result["summary"]
    assert summary["A"]["steps_per_second_vs_A"] == 1.0
    for name, row in zip("BC", rows[1:]):
        assert summary[name]["steps_per_second_vs_A"] == round(row["steps_per_second"] / rows[0]["steps_per_second"], 3)
        assert summary[name]["server_cpu_ms_per_step_vs_A"] == round(
            row["server_cpu_ms_per_step"] / rows[0]["server_cpu_ms_per_step"], 3
        )
    # A node and a Worker per row, all stopped by the bench before it exited.
    assert len(result["pids"]) == 2 * len(rows)
    assert [pid for pid in result["pids"] if pid_alive(pid)] == []


def row(config: str, round_index: int, steps_per_second: float, cpu: float | None) -> dict[str, object]:
    return {
        "config": config,
        "round": round_index,
        "steps_per_second": steps_per_second,
        "p50_ms": 10.0,
        "server_cpu_ms_per_step": cpu,
        "worker_cpu_ms_per_step": 0.1,
    }


def test_the_ratios_to_a_are_taken_per_round_and_summarised_by_their_median() -> None:
    """The machine's speed drifts between rounds: B at 900 in a slow round against A at 1000 in
    a fast one is not a 10% cost. Each round's ratio uses that round's A."""
    rows = [
        row("A", 0, 1000.0, 0.5),
        row("B", 0, 1000.0, 0.5),
        row("A", 1, 500.0, 1.0),
        row("B", 1, 450.0, None),
        row("A", 2, 800.0, 0.5),
        row("B", 2, 880.0, 0.6),
    ]
    summary = tracing_cost_bench.summarize(rows)
    assert summary["A"]["steps_per_second_vs_A"] == 1.0
    assert summary["B"]["steps_per_second"] == 880.0  # the median of 1000, 450, 880
    assert summary["B"]["steps_per_second_vs_A"] == 1.0  # the median of 1.0, 0.9, 1.1
    assert summary["B"]["server_cpu_ms_per_step_vs_A"] == 1.1  # the round without it left out: 1.0, 1.2


def test_the_venv_gets_the_versions_this_interpreter_runs() -> None:
    """A differs from B by the extra alone: the same aiohttp, msgpack, ... (transitively)."""
    pins = tracing_cost_bench.installed_pins()
    assert f"aiohttp=={importlib.metadata.version('aiohttp')}" in pins
    assert f"yarl=={importlib.metadata.version('yarl')}" in pins  # aiohttp's own dependency
    assert not any(p.startswith("opentelemetry") for p in pins)
    names = [p.split("==")[0] for p in pins]
    assert len(names) == len(set(names))
