"""The version gate on real processes.

A node of an older state machine (played by DEX_HA_TEST_STATE_MACHINE_VERSION=1, as 0.1.0
is) that meets an entry of a newer one stops with exit code 70 and one line saying what to
do, and its state is left as it was; started again on the new code it applies the entry.
While a member runs the older state machine the cluster stays at it (the Worker channel,
whose entries are newer, answers 404), and once every member runs the new one the cluster
moves to it by itself.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path

import aiohttp
import pytest

import dex_ha
from dex_ha.engine import STATE_MACHINE_VERSION
from dex_ha.failpoints import FAILPOINT_ENV
from dex_ha.server.process import FATAL_EXIT_CODE
from dex_ha.server.versions import GATE_OFF_FAILPOINT, TEST_STATE_MACHINE_VERSION_ENV
from harness.cluster_process import LocalCluster, cluster_view
from harness.waiting import eventually

OLD = {TEST_STATE_MACHINE_VERSION_ENV: "1"}
DEADLINE_S = 30.0


async def _channel_status(url: str, token: str) -> tuple[int, str]:
    """The HTTP status (and body) a Worker's channel request gets."""
    async with aiohttp.ClientSession() as http:
        async with http.get(
            url + "/v1/worker/channel",
            params={"worker_id": "w1", "agents": "a"},
            headers={
                "Authorization": f"Bearer {token}",
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            },
        ) as resp:
            return resp.status, await resp.text()


async def _views(cluster: LocalCluster) -> dict[str, dict | None]:
    admin = cluster.tokens["admin"]
    return {node: await cluster_view(url, admin) for node, url in cluster.urls.items()}


def _state_meta(state_db: Path) -> dict[str, int]:
    conn = sqlite3.connect(state_db)
    try:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())
    finally:
        conn.close()


@pytest.mark.timeout(240)
async def test_an_older_node_stops_on_a_newer_entry_and_applies_it_once_upgraded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TEST_STATE_MACHINE_VERSION_ENV, "1")  # every node of `cluster up` plays 0.1.0
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        cluster.up()
        monkeypatch.delenv(TEST_STATE_MACHINE_VERSION_ENV)
        active = await cluster.active_node()
        status, body = await _channel_status(cluster.urls[active], cluster.tokens["worker"])
        assert status == 404 and "state machine v2" in body, (status, body)
        # n1 and n2 run the new state machine; with the gate off (a failpoint), the active one
        # moves the cluster to it without waiting for n3, which still plays the old one.
        for node in cluster.urls:
            cluster.kill(node)
        new = {"n1": {FAILPOINT_ENV: GATE_OFF_FAILPOINT}, "n2": {FAILPOINT_ENV: GATE_OFF_FAILPOINT}}
        for node in ("n1", "n2"):
            cluster.restart(node, extra_env=new[node])
        old = cluster.restart("n3", extra_env=OLD)
        active = await cluster.active_node(deadline_s=DEADLINE_S)
        if active == "n3":  # the old node leads: it would never propose the newer entry
            done = cluster.run_cli(
                "step-down", "--url", cluster.urls["n3"], "--token", cluster.tokens["admin"], "--to", "n1"
            )
            assert done.returncode == 0, done.stdout + done.stderr
        code = await asyncio.to_thread(old.wait, DEADLINE_S * 2)
        log_text = (cluster.dir / "n3.log").read_text()
        assert code == FATAL_EXIT_CODE, log_text[-3000:]
        line = re.search(
            r"upgrade this node: entry (\d+) carries SetClusterVersion of state machine v2; this node runs v1", log_text
        )
        assert line is not None, log_text[-3000:]
        entry = int(line.group(1))
        meta = _state_meta(cluster.dir / "n3" / "state.db")
        assert meta["applied_index"] < entry and "cluster_state_machine_version" not in meta
        # Upgraded (the new code), it applies the entry and runs with the others.
        cluster.restart("n3")

        async def n3_caught_up() -> bool:
            view = (await _views(cluster))["n3"]
            return view is not None and view["cluster_state_machine_version"] == 2 and view["applied_index"] >= entry

        await eventually(n3_caught_up, "n3 to apply the entry it stopped on", deadline_s=DEADLINE_S)
    finally:
        cluster.down()


@pytest.mark.timeout(180)
async def test_the_cluster_moves_to_the_new_state_machine_once_every_member_runs_it(cluster: LocalCluster) -> None:
    async def moved() -> bool:
        views = await _views(cluster)
        return all(
            v is not None and v["cluster_state_machine_version"] == STATE_MACHINE_VERSION for v in views.values()
        )

    await eventually(moved, "every node at the new state machine", deadline_s=DEADLINE_S)
    active = await cluster.active_node()
    view = await cluster_view(cluster.urls[active], cluster.tokens["admin"])
    assert view is not None
    assert {m["id"]: m["state_machine_version"] for m in view["members"]} == dict.fromkeys(
        cluster.urls, STATE_MACHINE_VERSION
    )
    assert view["version"] == dex_ha.__version__
    assert all(m["version"] == dex_ha.__version__ for m in view["members"])
    shown = cluster.run_cli("status", "--url", cluster.urls[active], "--token", cluster.tokens["admin"])
    assert f"cluster state machine: v{STATE_MACHINE_VERSION}\n" in shown.stdout, shown.stdout + shown.stderr
    assert f"{dex_ha.__version__} (sm v{STATE_MACHINE_VERSION})" in shown.stdout
    status, body = await _channel_status(cluster.urls[active], cluster.tokens["worker"])
    assert status == 101, (status, body)
