"""bench/overload_bench.py: a very short real run (one `dex-ha dev` node, a few clients):
it exits 0, prints its table and targets, writes JSON whose row counted the answers, and
leaves no process behind. (What the node does under real overload is the e2e test's and
the full bench's business.)"""

from __future__ import annotations

import json
from pathlib import Path

from harness.processes import env_with_checkout, pid_alive
from tests.bench.run_bench import assert_exited_0, run_bench

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "bench" / "overload_bench.py"
SMOKE_DEADLINE_S = 90.0  # the run takes ~5 s; the rest is slack for a loaded machine


def test_smoke_run_counts_answers_prints_the_table_and_stops_the_node(tmp_path: Path) -> None:
    out = tmp_path / "overload.json"
    done = run_bench(
        BENCH,
        [
            *("--only", "dev", "--relaxed", "--clients", "20", "--duration-s", "1", "--json", str(out)),
            *("--idle-streams", "20", "--stream-rounds", "1"),
        ],
        SMOKE_DEADLINE_S,
        env=env_with_checkout(),
    )
    assert_exited_0(done)

    assert "ans/s" in done.stdout and "not_active" in done.stdout and "gap ms" in done.stdout
    assert "term_changes" in done.stdout and "follower_leader_contact_gap" in done.stdout
    result = json.loads(out.read_text())
    assert result["durability"] == "relaxed" and result["clients"] == [20]
    [row] = result["rows"]
    load = row["load"]
    assert any(line.split()[:3] == ["dev", "20", str(load["answers"])] for line in done.stdout.splitlines())
    assert load["answers"] > 0 and load["answers"] == sum(load["by_answer"].values())
    assert load["clients_answered"] == 20
    assert row["term_changes"] is not None and len(row["before"]) == len(row["after"]) == 1
    assert row["follower_gap_max_s"] is None  # dev has no follower: "n/a"
    assert row["node_pids"] and not [pid for pid in row["node_pids"] if pid_alive(pid)]

    [streams] = result["idle_streams"]
    assert streams["idle_streams"] == 20 and len(streams["rounds"]) == 1
    assert streams["p50_without_ms"] is not None and streams["p50_with_ms"] is not None
    assert streams["term_changes"] == 0 and "idle_streams_write_p50" in done.stdout
