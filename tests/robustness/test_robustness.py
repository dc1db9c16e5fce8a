"""The robustness suite (tests/robustness/README.md): random faults from a seed on a real
three-node cluster with Workers and clients, then the invariants checked from outside.

- the default suite runs one seed, drawn at random and printed, with ~60 s of faults;
- `DEX_HA_ROBUSTNESS_SEED=<seed>` replays one seed (`-k replay`);
- `DEX_HA_LONG=1` runs seed after seed for 30 minutes.

Every run prints its table (faults by kind, operations checked, violations) and writes it
as JSON next to the logs, in the test's tmp dir.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness.long_runs import long_runs
from tests.robustness.run import SEED_ENV, RunResult, replay_command, run_seed

LONG = long_runs()
DEFAULT_FAULT_S = 60.0
LONG_FAULT_S = 60.0  # each seed of the long run
LONG_RUN_S = 30 * 60.0


def fresh_seed() -> int:
    # Not `random`: the test run seeds it, and every run would repeat one schedule.
    return int.from_bytes(os.urandom(4), "big")


async def run_and_report(seed: int, tmp_path: Path, fault_s: float) -> RunResult:
    print(f"\nrobustness seed {seed} (replay: {replay_command(seed)})")
    directory = tmp_path / f"seed-{seed}"
    try:
        result = await run_seed(seed, directory, fault_s)
    except Exception as exc:
        raise AssertionError(
            f"robustness seed {seed} did not finish: {exc!r}\nlogs: {directory}\nreplay: {replay_command(seed)}"
        ) from exc
    result.write_json(tmp_path / f"robustness-{seed}.json")
    print(result.table())
    print(f"  report: {tmp_path / f'robustness-{seed}.json'}")
    return result


def assert_clean(result: RunResult) -> None:
    assert result.violation_count == 0, (
        f"{result.violation_count} violations with seed {result.seed}:\n{result.table()}"
    )
    assert result.injected, "no fault was injected: the run proves nothing"
    assert result.evidence.acked.messages, "no message was acknowledged: the run proves nothing"


@pytest.mark.timeout(400)
@pytest.mark.skipif(LONG, reason="DEX_HA_LONG=1 runs the long loop instead")
async def test_random_faults_lose_nothing(tmp_path: Path) -> None:
    assert_clean(await run_and_report(fresh_seed(), tmp_path, DEFAULT_FAULT_S))


@pytest.mark.timeout(400)
@pytest.mark.skipif(not os.environ.get(SEED_ENV), reason=f"replays the seed {SEED_ENV} names")
async def test_replay(tmp_path: Path) -> None:
    assert_clean(await run_and_report(int(os.environ[SEED_ENV]), tmp_path, DEFAULT_FAULT_S))


@pytest.mark.slow
@pytest.mark.timeout(LONG_RUN_S + 900)
@pytest.mark.skipif(not LONG, reason="the 30-minute loop of seeds runs with DEX_HA_LONG=1")
async def test_long_loop_of_seeds(tmp_path: Path) -> None:
    ends = time.monotonic() + LONG_RUN_S
    runs = 0
    while time.monotonic() < ends:
        assert_clean(await run_and_report(fresh_seed(), tmp_path, LONG_FAULT_S))
        runs += 1
    print(f"\nrobustness long run: {runs} seeds, 0 violations")
