"""Deleting sessions on a real three-node cluster (real processes).

A node is down while sessions are deleted and the log moves on past a snapshot: when it
comes back it installs the snapshot, and its state equals the others' (the deleted
sessions gone, every row of every table equal). The state file of every node shrinks
after the deletion. A backup taken afterwards, restored into a new cluster, holds the
kept sessions and not the deleted ones.
"""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest

from dex_ha.client import DexClient, DexError
from dex_ha.engine import Engine
from harness.cluster_process import LocalCluster
from harness.waiting import eventually
from tests.e2e.conftest import cluster  # noqa: F401  (the fixture)

SNAPSHOT_EVERY_ENTRIES = 20
BIG_TEXT = "x" * 400_000  # a user message: it is stored in the messages, the history and an event
BIG_SESSIONS = 8
DEADLINE_S = 30.0


def with_snapshot_every(cluster: LocalCluster, entries: int) -> None:  # noqa: F811
    """Restart every node with `snapshot_every_entries = entries` in its file."""
    for node_id in cluster.urls:
        cluster.kill(node_id)
    for node_id in cluster.urls:
        path = cluster.dir / f"{node_id}.toml"
        text = path.read_text().replace("\n[tokens]", f"\nsnapshot_every_entries = {entries}\n\n[tokens]", 1)
        path.write_text(text)
    for node_id in cluster.urls:
        cluster.restart(node_id)


async def metric(url: str, name: str, **labels: str) -> float | None:
    """One sample of the node's /metrics, or None when the node does not answer or lacks it."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.compile(rf"^{re.escape(name)}{re.escape('{' + wanted + '}') if labels else ''} (\S+)$", re.M)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r:
                found = pattern.search(await r.text())
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    return None if found is None else float(found.group(1))


async def on_every_node(cluster: LocalCluster, name: str, **labels: str) -> dict[str, float | None]:  # noqa: F811
    return {node_id: await metric(url, name, **labels) for node_id, url in cluster.urls.items()}


async def make_ended_session(client: DexClient, session_id: str, text: str) -> None:
    await client.create_session("helper", session_id=session_id)
    await client.send_message(session_id, text)  # no Worker: the turn runs until cancelled
    await client.cancel(session_id)


@pytest.mark.timeout(240)
async def test_deletion_replicates_survives_a_snapshot_a_backup_and_a_restore_and_frees_space(
    cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    with_snapshot_every(cluster, SNAPSHOT_EVERY_ENTRIES)
    urls = list(cluster.urls.values())
    big = [f"big-{n}" for n in range(BIG_SESSIONS)]
    async with DexClient(urls, token=cluster.tokens["client"]) as client:
        await make_ended_session(client, "keep", "a session that stays")
        await make_ended_session(client, "gone", "a session to delete")
        for sid in big:
            await make_ended_session(client, sid, BIG_TEXT)

        async def every_node_holds_the_big_sessions() -> bool:
            sizes = await on_every_node(cluster, "dex_state_bytes")
            return all(size is not None and size > BIG_SESSIONS * len(BIG_TEXT) for size in sizes.values())

        await eventually(every_node_holds_the_big_sessions, "the big sessions in every node's file", DEADLINE_S)
        full = await on_every_node(cluster, "dex_state_bytes")

        active = await cluster.active_node()
        down = next(node_id for node_id in cluster.urls if node_id != active)
        cluster.kill(down)
        for sid in ("gone", *big):
            assert await client.delete(sid) == {"session_id": sid, "deleted": True}
        with pytest.raises(DexError) as gone:
            await client.get_session("gone")
        assert gone.value.status == 404
        for n in range(2 * SNAPSHOT_EVERY_ENTRIES):  # the log moves past a snapshot without `down`
            await client.create_session("helper", session_id=f"later-{n}")
        cluster.restart(down)

        deleted = float(1 + BIG_SESSIONS)

        async def every_node_deleted_them() -> bool:
            counts = await on_every_node(cluster, "dex_sessions_deleted_total", how="deleted")
            return set(counts.values()) == {deleted}

        await eventually(every_node_deleted_them, "the deletions on every node", DEADLINE_S)
        assert "installed snapshot at index" in (cluster.dir / f"{down}.log").read_text()

        async def every_file_shrank() -> bool:
            sizes = await on_every_node(cluster, "dex_state_bytes")
            return all(sizes[n] is not None and sizes[n] < full[n] / 4 for n in sizes)  # type: ignore[operator]

        await eventually(every_file_shrank, f"every node's state file to shrink from {full}", DEADLINE_S)
        kept = sorted(s.session_id for s in (await client.list_sessions(limit=1000)).sessions)
        assert kept == sorted(["keep", *(f"later-{n}" for n in range(2 * SNAPSHOT_EVERY_ENTRIES))])

    backup = tmp_path / "after-delete.dexbak"
    done = cluster.run_cli("backup", "--url", urls[0], f"--token={cluster.tokens['admin']}", "--out", str(backup))
    assert done.returncode == 0, f"backup failed:\n{done.stdout}\n{done.stderr}"
    await same_state_on_every_node(cluster)

    target = LocalCluster(tmp_path / "restored")
    for node_id in ("n1", "n2", "n3"):
        done = target.run_cli(
            "restore", str(backup), "--data-dir", str(target.dir / node_id), "--node-id", node_id,
            "--members", "n1,n2,n3", "--relaxed",
        )  # fmt: skip
        assert done.returncode == 0, f"restore {node_id} failed:\n{done.stdout}\n{done.stderr}"
    try:
        target.up()
        async with DexClient(list(target.urls.values()), token=target.tokens["client"]) as restored:
            listed = sorted(s.session_id for s in (await restored.list_sessions(limit=1000)).sessions)
            assert listed == kept
            with pytest.raises(DexError) as missing:
                await restored.get_session("gone")
            assert missing.value.status == 404
            # The restored cluster deletes too.
            assert await restored.delete("keep") == {"session_id": "keep", "deleted": True}
    finally:
        target.down()


async def same_state_on_every_node(cluster: LocalCluster) -> None:  # noqa: F811
    """Once every node applied the same index, stop them and compare every row of every table."""

    async def all_applied_alike() -> bool:
        applied = await on_every_node(cluster, "dex_raft_applied_index")
        return None not in applied.values() and len(set(applied.values())) == 1

    await eventually(all_applied_alike, "every node to apply the same index", DEADLINE_S)
    for node_id in cluster.urls:
        cluster.kill(node_id)
    dumps = {}
    for node_id in cluster.urls:
        engine = Engine(str(cluster.dir / node_id / "state.db"), durable=False)
        try:
            dumps[node_id] = engine.logical_dump()
        finally:
            engine.close()
    first = next(iter(dumps.values()))
    assert all(dump == first for dump in dumps.values())
    assert not [row for row in first["sessions"] if row[0] in ("gone", "big-0")]
