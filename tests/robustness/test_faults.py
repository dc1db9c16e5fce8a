"""The pieces of the clock_step, full_disk and replace_member faults that can be wrong
without a cluster: finding a single-attempt write that runs now in the ledger, a small disk
that fills, frees, and unmounts with its files kept, a kind this machine cannot inject,
skipped with the reason, when a cluster is healthy enough to replace a standby, and a
replaced node's files moved aside."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import small_disk
from tests.crash.ledger import Run
from tests.robustness import faults
from tests.robustness.checker import Evidence, check_all
from tests.robustness.faults import running_single_attempt_write
from tests.robustness.run import RunResult
from tests.robustness.workload import Acknowledged

NOW = 1_000.0


def run(name: str, call: str, moment: str = "started", at: float = NOW - 0.1) -> Run:
    return Run(0, "tool", name, moment, call, call, 1, {}, 1, at)


def test_a_single_attempt_write_started_and_not_finished_is_running() -> None:
    runs = [run("send_note", "s:m0-write"), run("lookup", "s:m1-read")]
    assert running_single_attempt_write(runs, NOW) == "s:m0-write"
    assert running_single_attempt_write([*runs, run("send_note", "s:m0-write", "finished")], NOW) is None


def test_reads_idempotent_writes_and_runs_a_killed_worker_left_are_not_running() -> None:
    runs = [run("lookup", "s:m0-read"), run("put_item", "s:m0-idem"), run("wire_money", "s:m1-approve", at=NOW - 30)]
    assert running_single_attempt_write(runs, NOW) is None


@pytest.fixture
def disk(tmp_path: Path):
    mount_point = tmp_path / "data"
    reason = small_disk.mount_tmpfs(mount_point, 1 << 20)
    if reason is not None:
        pytest.skip(reason)
    try:
        yield mount_point
    finally:
        small_disk.unmount(mount_point)


def test_a_small_disk_fills_frees_and_unmounts_with_its_files_kept(disk: Path) -> None:
    (disk / "state.db").write_bytes(b"x" * 1000)
    filled = small_disk.fill(disk / "ballast")
    assert shutil.disk_usage(disk).free == 0 and filled > 900_000
    with pytest.raises(OSError):
        (disk / "more").write_bytes(b"y" * 8192)
    small_disk.unmount_keeping_files(disk, leave_out=("ballast",))
    assert not disk.is_mount()
    assert (disk / "state.db").read_bytes() == b"x" * 1000
    assert not (disk / "ballast").exists()


class FakeCluster:
    """The parts of a ProxiedCluster that give_clocks and small_disks use."""

    def __init__(self, directory: Path) -> None:
        self.node_ids = ["n1", "n2"]
        self.node_env: dict[str, dict[str, str]] = {}
        self.directory = directory

    @property
    def plan(self) -> FakeCluster:
        return self

    def node(self, node_id: str) -> SimpleNamespace:
        return SimpleNamespace(data_dir=self.directory / node_id)


def test_a_kind_this_machine_cannot_inject_is_skipped_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(faults.wall_clock, "unavailable_reason", lambda: "no libfaketime here")
    monkeypatch.setattr(faults, "mount_tmpfs", lambda path, size: "cannot mount a tmpfs here: permission denied")
    env = faults.FaultEnv(FakeCluster(tmp_path), [])  # type: ignore[arg-type]
    faults.give_clocks(env, tmp_path)
    with faults.small_disks(env):
        assert env.skipped == {
            "clock_step": "no libfaketime here",
            "full_disk": "cannot mount a tmpfs here: permission denied",
        }
        assert env.clocks == {} and env.disks == {} and env.cluster.node_env == {}


def test_the_report_says_why_a_kind_was_skipped(tmp_path: Path) -> None:
    evidence = Evidence(Acknowledged(), {}, [], [], {})
    skipped = {"clock_step": "no libfaketime here"}
    result = RunResult(1, 60.0, 70.0, tmp_path, [], skipped, [], evidence, check_all(evidence))
    assert "clock_step" in result.table() and "(skipped: no libfaketime here)" in result.table()
    assert result.as_json()["faults_skipped"] == skipped


def test_a_replacement_needs_every_member_a_voter_replicated_to_lately() -> None:
    fresh = {"voter": True, "replication": "replicate", "contacted": True, "last_contact_ms_ago": 40}
    assert faults.healthy_voter({"voter": True, "replication": "self"})
    assert faults.healthy_voter(fresh)
    assert not faults.healthy_voter(None)  # not a member (removed by a replacement that stopped half way)
    assert not faults.healthy_voter({**fresh, "voter": False})  # a learner still catching up
    assert not faults.healthy_voter({**fresh, "replication": "probe"})  # the leader does not know its log
    assert not faults.healthy_voter({**fresh, "last_contact_ms_ago": 5_000})  # down or cut off


def test_a_replaced_nodes_files_are_moved_aside_and_its_data_dir_stays_empty(tmp_path: Path) -> None:
    data_dir = tmp_path / "n2"
    (data_dir / "raft").mkdir(parents=True)
    (data_dir / "state.db").write_bytes(b"rows")
    faults.move_aside(data_dir, tmp_path / "n2.replaced-1")
    assert data_dir.is_dir() and not any(data_dir.iterdir())
    assert (tmp_path / "n2.replaced-1" / "state.db").read_bytes() == b"rows"
    assert (tmp_path / "n2.replaced-1" / "raft").is_dir()
