"""bench/steps_bench.py: a very short real run (one `dex-ha dev` node, a Worker process),
plus the arithmetic it reports (gaps between completions, percentiles).

The smoke run proves the bench works end to end: it exits 0, prints its table, writes JSON
whose every row counted committed steps, and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

from harness.processes import pid_alive
from tests.bench.run_bench import assert_exited_0, run_bench

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "bench" / "steps_bench.py"
WORKER = REPO_ROOT / "bench" / "steps_worker.py"
SMOKE_DEADLINE_S = 90.0  # the run takes ~15 s; the rest is slack for a loaded machine


def load_module(path: Path, name: str) -> ModuleType:
    """Import a bench script by path (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


steps_bench = load_module(BENCH, "steps_bench_under_test")
steps_worker = load_module(WORKER, "steps_worker_under_test")


def test_smoke_run_counts_steps_prints_the_table_and_stops_every_process(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    done = run_bench(
        BENCH,
        [
            "--only",
            "dev",
            "--duration-s",
            "2",
            "--warmup-s",
            "0.5",
            "--concurrency",
            "1,4",
            "--turns-per-session",
            "3",
            "--json",
            str(out),
        ],
        SMOKE_DEADLINE_S,
    )
    assert_exited_0(done)

    assert "steps/s" in done.stdout and "p50 ms" in done.stdout
    assert "dev_steps_per_second" in done.stdout
    assert "reference" not in done.stdout.lower()  # no figure of another system that this run did not measure
    result = json.loads(out.read_text())
    all_rows = result["dev"]["rows"]
    # The channel and HTTP, interleaved at each concurrency; the targets judge the channel.
    assert [(r["concurrency"], r["transport"]) for r in all_rows] == [
        (1, "channel"),
        (1, "http"),
        (4, "channel"),
        (4, "http"),
    ]
    rows = [r for r in all_rows if r["transport"] == "channel"]
    assert "channel / HTTP, same run" in done.stdout
    assert result["summary"]["dev_channel_vs_http_server_cpu_ms_per_step_ratio"] > 0
    kill = result["worker_kill"]
    assert kill["next_attempt_on_the_other_worker"] is True
    assert 0 < kill["kill_to_next_attempt_ms"] < 10_000  # far below the 30 s heartbeat timeout
    assert "Worker kill -> next attempt" in done.stdout
    for row in all_rows:
        table_line = [
            line
            for line in done.stdout.splitlines()
            if line.split()[:4] == ["dev", row["transport"], str(row["concurrency"]), str(row["steps"])]
        ]
        assert table_line, f"no table line for concurrency {row['concurrency']}"
        assert row["steps"] > 0
        assert row["steps_per_second"] > 0
        assert row["failed_results"] == 0
        # Over the whole row the server handed out what the Worker completed (a session a
        # lane gave up on may leave a few hand-outs without a result).
        assert row["row_steps"] >= row["steps"]
        assert row["row_attempts_started"] is not None
        assert abs(row["row_attempts_started"] - row["row_steps"]) <= max(3, 0.01 * row["row_steps"])
        assert row["p50_ms"] is not None and 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["server_cpu_ms_per_step"] > 0
        assert row["worker_stopped_cleanly"] is True
        assert row["warmup_s"] >= 0.49  # --warmup-s 0.5 (asyncio timers may fire a ms early)
        assert len(row["cpu_probe_ms"]) == 2 and all(p > 0 for p in row["cpu_probe_ms"])  # before, after
    assert result["summary"]["dev_steps_per_second"] == max(r["steps_per_second"] for r in rows)
    assert result["summary"]["dev_p50_ms_c1"] == rows[0]["p50_ms"]

    # One node and one Worker per row, and a node and two Workers for the kill timing, all
    # stopped by the bench before it exited.
    pids = result["pids"]
    assert len(pids) == 1 + len(all_rows) + 3
    assert set(result["dev"]["node_pids"]) <= set(pids)
    assert {r["worker_pid"] for r in all_rows} <= set(pids)
    assert [pid for pid in pids if pid_alive(pid)] == []


def completion(session: str, kind: str, at_ms: float) -> object:
    return steps_bench.Completion(session, kind, int(at_ms * 1_000_000), True)


def test_gaps_are_between_completions_of_the_same_session_inside_the_window() -> None:
    completions = [
        completion("a", "RunModel", 10),
        completion("b", "RunModel", 11),
        completion("a", "CallTool", 13),
        completion("b", "CallTool", 17),
        completion("a", "RunModel", 14),
        completion("b", "RunModel", 30),  # b's last is after the window
    ]
    gaps = steps_bench.completion_gaps(completions, start_ns=12_000_000, end_ns=20_000_000)
    # a: 10 -> 13 (CallTool, 3 ms), 13 -> 14 (RunModel, 1 ms); b: 11 -> 17 (CallTool, 6 ms).
    # The first completion of a session has no gap; b's 17 -> 30 ends outside the window.
    assert sorted(gaps["CallTool"]) == [0.003, 0.006]
    assert gaps["RunModel"] == [0.001]


def test_failed_results_are_neither_steps_nor_gap_ends() -> None:
    failed = steps_bench.Completion("a", "CallTool", 12_000_000, False)
    completions = [completion("a", "RunModel", 10), failed, completion("a", "CallTool", 15)]
    gaps = steps_bench.completion_gaps(completions, start_ns=0, end_ns=100_000_000)
    assert gaps == {"CallTool": [0.005]}


def test_percentiles_pick_the_nearest_rank() -> None:
    values = [i / 1000 for i in range(1, 101)]  # 1 ms .. 100 ms
    assert steps_bench.percentile_ms(values, 50) == 50.0
    assert steps_bench.percentile_ms(values, 99) == 99.0
    assert steps_bench.percentile_ms([0.004], 99) == 4.0
    assert steps_bench.percentile_ms([], 50) is None


def test_tracker_wakes_the_lane_when_its_session_has_all_its_steps() -> None:
    tracker = steps_bench.CompletionTracker()
    done = tracker.expect("s1", 2)
    tracker.on_line("c s1 RunModel 100 1\n")
    tracker.on_line("c s1 CallTool 200 0\n")  # a failed result: the step is not done yet
    assert not done.is_set()
    tracker.on_line("c s2 RunModel 250 1\n")  # another session's step
    assert not done.is_set()
    tracker.on_line("c s1 CallTool 300 1\n")
    assert done.is_set()
    assert [c.ok for c in tracker.completions] == [True, False, True, True]


def test_the_scripted_model_calls_the_read_tool_then_answers() -> None:
    request = steps_worker.ModelRequest
    first = steps_worker.bench_script(request(history=[{"type": "user", "text": "hi"}], summary=None, tools=[]))
    assert [c["name"] for c in first["tool_calls"]] == ["read"]
    after_tool = steps_worker.bench_script(
        request(
            history=[
                {"type": "user", "text": "hi"},
                {"type": "assistant", "content": "", "tool_calls": []},
                {"type": "tool_result", "call_id": "c0_0", "name": "read", "status": "succeeded"},
            ],
            summary=None,
            tools=[],
        )
    )
    assert after_tool["tool_calls"] == []
    agent = steps_worker.bench_agent("bench-x")
    tool = agent.definition()["tools"][0]
    assert tool["name"] == "read" and tool["effect"] == "read" and tool["inline"] is False


def test_the_lanes_first_sessions_have_every_length_so_they_do_not_end_together() -> None:
    """1024 lanes of 10-turn sessions: first sessions of 1..10 turns, about as many lanes of
    each length, so the lanes start their next sessions at different moments."""
    lengths = [steps_bench.first_session_turns(lane, 10) for lane in range(1024)]
    counts = {n: lengths.count(n) for n in set(lengths)}
    assert sorted(counts) == list(range(1, 11))
    assert max(counts.values()) - min(counts.values()) <= 1
    assert steps_bench.first_session_turns(0, 1) == 1  # one turn per session: nothing to stagger


def test_the_warm_up_lasts_until_every_lane_has_queued_its_first_session() -> None:
    """The window must not open on the start-up burst: with one lane slow to get under way
    (its messages shed and retried, say), the warm-up waits for it past its minimum."""
    late_lane_s = 0.6

    async def scenario() -> float:
        stats = steps_bench.LaneStats()

        async def lane(delay_s: float) -> None:
            await asyncio.sleep(delay_s)
            stats.lanes_under_way += 1
            await asyncio.Event().wait()  # a lane never ends on its own

        reader = asyncio.create_task(asyncio.Event().wait())
        worker = SimpleNamespace(reader=reader, proc=SimpleNamespace(returncode=None), log_path="worker.log")
        lanes = [asyncio.create_task(lane(0.0)), asyncio.create_task(lane(late_lane_s))]
        started = time.monotonic()
        try:
            reported = await steps_bench.warm_up(worker, lanes, stats, min_s=0.1)
            waited = time.monotonic() - started
            assert stats.lanes_under_way == 2
            assert abs(reported - waited) < 0.05
            return waited
        finally:
            for task in [reader, *lanes]:
                task.cancel()
            await asyncio.gather(reader, *lanes, return_exceptions=True)

    assert asyncio.run(scenario()) >= late_lane_s


def test_an_error_about_a_process_carries_the_end_of_its_log(tmp_path: Path) -> None:
    """The bench deletes its temp dir on exit, so its errors quote the log, not its path."""
    log = tmp_path / "worker.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    tail = steps_bench.log_tail(log)
    assert tail.splitlines()[1:] == [f"  line {i}" for i in range(10, 30)]
    assert "cannot be read" in steps_bench.log_tail(tmp_path / "missing.log")


async def test_a_session_is_abandoned_only_when_its_steps_stop_coming() -> None:
    """A long session that keeps making progress is waited for; one with no step for the
    stall time is given up."""
    tracker = steps_bench.CompletionTracker()
    slow = tracker.expect("slow", 3)
    stalled = tracker.expect("stalled", 3)

    async def one_step_every(seconds: float, n: int) -> None:
        for at in range(n):
            await asyncio.sleep(seconds)
            tracker.on_line(f"c slow RunModel {at} 1\n")

    feeder = asyncio.create_task(one_step_every(0.15, 3))  # 0.45 s in all, each gap under 0.25 s
    assert await tracker.wait_until_done_or_stalled("slow", slow, stall_s=0.25)
    await feeder
    tracker.on_line("c stalled RunModel 1 1\n")
    assert not await tracker.wait_until_done_or_stalled("stalled", stalled, stall_s=0.25)


def test_rounds_alternate_the_order_of_the_concurrencies() -> None:
    assert [steps_bench.round_order([1, 64, 1024], r) for r in range(3)] == [
        [1, 64, 1024],
        [1024, 64, 1],
        [1, 64, 1024],
    ]


def test_the_summary_takes_the_median_of_the_rounds_per_concurrency() -> None:
    rows = [{"concurrency": 256, "steps_per_second": v, "p50_ms": None} for v in (900.0, 1000.0, 700.0)] + [
        {"concurrency": 1024, "steps_per_second": v, "p50_ms": None} for v in (950.0, 600.0, 850.0)
    ]
    assert steps_bench.median_steps_per_second(rows) == {256: 900.0, 1024: 850.0}
    summary = steps_bench.summary_of({"dev": {"rows": rows}})
    assert summary["dev_steps_per_second"] == 900.0  # not the best single row (1000)
    assert summary["dev_past_peak_ratio"] == round(850 / 900, 3)
    assert summary["cluster_past_peak_ratio"] is None  # not measured


def test_the_past_peak_ratio_is_the_lowest_median_above_the_peak() -> None:
    ratio = steps_bench.past_peak_ratio
    assert ratio({1: 300.0, 64: 1000.0, 256: 950.0, 1024: 800.0}) == 0.8
    assert ratio({1: 300.0, 64: 1000.0, 256: 950.0, 1024: 960.0}) == 0.95
    assert ratio({1: 300.0, 64: 500.0, 1024: 1000.0}) == 1.0  # the peak at the top: nothing fell
    assert ratio({64: 1000.0}) is None
