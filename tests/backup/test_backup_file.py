"""The backup file and `dex-ha restore`, in one process: what the file holds, what restore
refuses (and that it then writes nothing), and a node seeded from a backup serving the same
sessions as the node it came from."""

from __future__ import annotations

import asyncio
import hashlib
import json
import stat
from pathlib import Path

import aiohttp
import pytest

from dex_ha import cli
from dex_ha.raft.snapshot_file import verify_file
from dex_ha.server.backup import (
    FORMAT_VERSION,
    MAGIC,
    BackupError,
    backup_bytes,
    make_header,
    parse_backup,
    parse_members,
    read_backup,
    restore_data_dir,
    restored_cluster_id,
)
from dex_ha.server.node import NodeServer
from tests.server.node_fixture import HttpApi, expect, single_node_config, start_node

PAYLOAD = b"SQLite format 3\x00" + bytes(range(256)) * 8


def backup_file(tmp_path: Path, payload: bytes = PAYLOAD, **header_changes: object) -> Path:
    header = make_header(index=42, term=7, node_id="n1", payload=payload)
    raw = json.loads(header.encode())
    raw.update(header_changes)
    path = tmp_path / "backup.dexbak"
    path.write_bytes(MAGIC + json.dumps(raw).encode() + b"\n" + payload)
    return path


# ---------------------------------------------------------------- the file


def test_a_backup_file_reads_back_with_its_header():
    header = make_header(index=42, term=7, node_id="n1", payload=PAYLOAD, now_s=0)
    read, payload = parse_backup(b"".join(backup_bytes(header, PAYLOAD)))
    assert read == header and payload == PAYLOAD
    assert (read.format, read.index, read.term, read.node_id) == (FORMAT_VERSION, 42, 7, "n1")
    assert read.created_at == "1970-01-01T00:00:00.000Z"
    assert read.sha256 == hashlib.sha256(PAYLOAD).hexdigest() and read.payload_bytes == len(PAYLOAD)


def test_a_damaged_payload_fails_the_checksum(tmp_path: Path):
    path = backup_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # one flipped byte, same length
    path.write_bytes(bytes(data))
    with pytest.raises(BackupError, match="checksum mismatch"):
        read_backup(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": 2}, "unknown backup format version 2"),
        ({"format": None}, "unknown backup format version None"),
        ({"index": "42"}, "header field 'index'"),
        ({"term": 0}, "must be at least 1"),
    ],
)
def test_a_header_this_version_cannot_read_is_refused(tmp_path: Path, changes: dict, message: str):
    with pytest.raises(BackupError, match=message):
        read_backup(backup_file(tmp_path, **changes))


def test_a_file_cut_short_or_not_a_backup_is_refused(tmp_path: Path):
    path = backup_file(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(BackupError, match="cut short"):
        read_backup(path)
    path.write_bytes(b"SQLite format 3\x00 and so on")
    with pytest.raises(BackupError, match="not a dex-ha backup"):
        read_backup(path)
    with pytest.raises(BackupError, match="no such file"):
        read_backup(tmp_path / "missing.dexbak")


@pytest.mark.parametrize(
    ("members", "node_id", "message"),
    [
        ("n1,n2", "n3", "does not include this node"),
        ("n1,n1,n2", "n1", "names a node twice"),
        ("n1,,n2", "n1", "is not a node id"),
        (None, "bad id!", "node_id"),
    ],
)
def test_members_are_checked(members: str | None, node_id: str, message: str):
    with pytest.raises(ValueError, match=message):
        parse_members(members, node_id)
    assert parse_members("n3,n1,n2", "n2") == ("n1", "n2", "n3")
    assert parse_members(None, "dev") == ("dev",)


# ---------------------------------------------------------------- restore refuses, writing nothing


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_restore_refuses_a_data_dir_that_is_not_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    (data_dir / "state.db").write_bytes(b"a node's state")
    code, _, err = run_cli(
        capsys, "restore", str(backup_file(tmp_path)), "--data-dir", str(data_dir), "--node-id", "n1"
    )
    assert code == 2
    assert err.strip() == (
        f"dex-ha restore: data dir {data_dir} is not empty (state.db): restore seeds a new "
        f"node only; give it an empty or new directory"
    )
    assert [p.name for p in data_dir.iterdir()] == ["state.db"]
    assert (data_dir / "state.db").read_bytes() == b"a node's state"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("checksum", "checksum mismatch"),
        ("format", "unknown backup format version 9"),
    ],
)
def test_restore_refuses_a_bad_file_before_it_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, message: str
):
    path = backup_file(tmp_path, sha256="0" * 64) if damage == "checksum" else backup_file(tmp_path, format=9)
    data_dir = tmp_path / "new-node"
    code, _, err = run_cli(capsys, "restore", str(path), "--data-dir", str(data_dir), "--node-id", "n1")
    assert code == 2
    assert err.startswith(f"dex-ha restore: {path}: ") and message in err and err.count("\n") == 1
    assert not data_dir.exists()


def test_restore_refuses_a_payload_that_is_not_an_engine_state_and_leaves_nothing(tmp_path: Path):
    with pytest.raises(BackupError, match="the backup's state cannot be restored: not an engine snapshot"):
        restore_data_dir(backup_file(tmp_path), tmp_path / "n1", "n1", ("n1",))
    assert not (tmp_path / "n1").exists()
    (tmp_path / "n2").mkdir()  # an empty directory given: it stays, empty
    with pytest.raises(BackupError, match="not an engine snapshot"):
        restore_data_dir(backup_file(tmp_path), tmp_path / "n2", "n2", ("n2",))
    assert list((tmp_path / "n2").iterdir()) == []


def test_a_restore_makes_one_new_cluster_id_for_its_members():
    header = make_header(index=42, term=7, node_id="n1", payload=PAYLOAD, cluster_id="old")
    members = ("n1", "n2", "n3")
    same = restored_cluster_id(header, members)
    assert same == restored_cluster_id(header, ("n3", "n2", "n1"))  # every member restored alike agrees
    others = {
        restored_cluster_id(header, ("n1", "n2")),
        restored_cluster_id(header, members, cluster_token="second copy"),
        restored_cluster_id(make_header(index=42, term=7, node_id="n1", payload=PAYLOAD + b"x"), members),
    }
    assert same not in others | {"old"} and len(others) == 3


# ---------------------------------------------------------------- a node seeded from a backup


async def test_a_node_restored_from_a_backup_serves_the_same_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    source = await start_node(single_node_config(tmp_path / "source"))
    restored: NodeServer | None = None
    try:
        async with aiohttp.ClientSession() as http:
            api = HttpApi(f"http://127.0.0.1:{source.http_port}", http)
            for n in range(3):
                await api.create_session("helper", f"s{n}")
                await api.send_message(f"s{n}", f"hello {n}")
            before = {f"s{n}": await api.snapshot(f"s{n}") for n in range(3)}
            status, body, _ = await api.get_bytes("/v1/cluster/backup", role="admin")
            assert status == 200
            header, _ = parse_backup(body)
            path = tmp_path / "b.dexbak"
            path.write_bytes(body)

            code, out, err = run_cli(
                capsys, "restore", str(path), "--data-dir", str(tmp_path / "copy"), "--node-id", "dev", "--relaxed"
            )
            assert code == 0, err
            assert f"at index {header.index} (backup term {header.term}" in out
            # The snapshot file a later member would be sent carries its checksum trailer.
            verify_file(tmp_path / "copy" / "snapshots" / f"snapshot-{header.index:020d}.bin", header.index)
            source_cluster = expect(await api.get("/v1/cluster"), 200)["cluster_id"]
            assert source_cluster and header.cluster_id == source_cluster  # the backup says where it came from
            copy_dir = tmp_path / "copy"
            shared = [p for p in [copy_dir, *copy_dir.rglob("*")] if stat.S_IMODE(p.stat().st_mode) & 0o077]
            assert shared == [], "a restored data directory is private: 0700, files 0600"

            restored = await start_node(single_node_config(tmp_path / "copy"))
            copy = HttpApi(f"http://127.0.0.1:{restored.http_port}", http)
            for sid, snapshot in before.items():
                assert await copy.snapshot(sid) == snapshot
            view = expect(await copy.get("/v1/cluster"), 200)
            # A new cluster: its own first term is above the backup's (attempts keep their terms),
            # and its own id, the one restore printed.
            assert view["term"] > header.term and view["applied_index"] > header.index
            assert view["cluster_id"] not in (None, source_cluster) and f"new cluster {view['cluster_id']} " in out
            await copy.send_message("s0", "after the restore")  # it takes new work
            assert len((await copy.snapshot("s0"))["waiting_messages"]) == 1
    finally:
        for node in (restored, source):
            if node is not None:
                await node.stop()


# ---------------------------------------------------------------- dex-ha backup


async def test_dex_ha_backup_writes_a_verified_file_and_refuses_a_non_admin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from tests.server.node_fixture import ADMIN_TOKEN, CLIENT_TOKEN

    node = await start_node(single_node_config(tmp_path / "node"))
    url = f"http://127.0.0.1:{node.http_port}"
    out = tmp_path / "b.dexbak"
    try:
        # cli.main runs its own event loop: in a thread, as a separate command would.
        code = await asyncio.to_thread(cli.main, ["backup", "--url", url, f"--token={CLIENT_TOKEN}", "--out", str(out)])
        _, err = capsys.readouterr()
        assert code == 1 and "refused (403 forbidden)" in err
        assert not out.exists() and list(tmp_path.glob("*.part")) == []

        missing_dir = tmp_path / "nowhere" / "b.dexbak"
        code = await asyncio.to_thread(
            cli.main, ["backup", "--url", url, f"--token={ADMIN_TOKEN}", "--out", str(missing_dir)]
        )
        _, err = capsys.readouterr()
        assert code == 2 and "--out: the directory" in err and "does not exist" in err

        code = await asyncio.to_thread(cli.main, ["backup", "--url", url, f"--token={ADMIN_TOKEN}", "--out", str(out)])
        printed, err = capsys.readouterr()
        assert code == 0, err
        header, _ = read_backup(out)
        assert f"index {header.index}, term {header.term}" in printed and header.sha256 in printed
        assert stat.S_IMODE(out.stat().st_mode) == 0o600  # the backup holds every session: private
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left

        # The same command again must not replace the backup it wrote (it may be the only copy).
        written = out.read_bytes()
        code = await asyncio.to_thread(cli.main, ["backup", "--url", url, f"--token={ADMIN_TOKEN}", "--out", str(out)])
        _, err = capsys.readouterr()
        assert code == 2 and "exists" in err and "--force" in err
        assert out.read_bytes() == written
        code = await asyncio.to_thread(
            cli.main, ["backup", "--url", url, f"--token={ADMIN_TOKEN}", "--out", str(out), "--force"]
        )
        _, err = capsys.readouterr()
        assert code == 0, err
        read_backup(out)  # replaced by a whole, verified backup
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    finally:
        await node.stop()
