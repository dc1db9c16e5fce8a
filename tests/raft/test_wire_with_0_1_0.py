"""What this release sends on the Raft wire, 0.1.0 reads: the version slot a message now
carries is one that 0.1.0's decoder ignores (so a rolling upgrade can mix the two)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dex_ha.raft.types import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    NodeVersion,
    SnapshotMeta,
    encode_message,
)
from harness.releases import RELEASE_0_1_0_COMMIT, checkout_release, release_env

DECODE_WITH_0_1_0 = """
import json, sys
from dex_ha.raft.types import decode_message
out = []
for line in sys.stdin:
    m = decode_message(bytes.fromhex(line.strip()))
    out.append([m.type.name, m.frm, m.term, len(m.entries), m.cluster_id])
print(json.dumps(out))
"""


def test_0_1_0_decodes_the_messages_of_this_release(tmp_path: Path) -> None:
    tree = checkout_release(RELEASE_0_1_0_COMMIT, tmp_path / "0.1.0")
    if tree is None:
        pytest.skip("this checkout has no git history with release 0.1.0 (a source archive or a shallow clone)")
    version = NodeVersion("0.2.0", 2)
    messages = [
        Message(MessageType.APP, "n2", "n1", term=3, entries=[Entry(3, 5, EntryType.NORMAL, b"x")], version=version),
        Message(MessageType.HEARTBEAT_RESP, "n2", "n1", term=3, applied=4, version=version),
        Message(
            MessageType.SNAP,
            "n2",
            "n1",
            term=3,
            snapshot=SnapshotMeta(9, 3, ConfState(("n1", "n2"), ())),
            cluster_id="c1",
            version=version,
        ),
        Message(
            MessageType.SNAP, "n2", "n1", term=3, snapshot=SnapshotMeta(9, 3, ConfState(("n1",), ())), version=version
        ),
    ]
    done = subprocess.run(
        [sys.executable, "-c", DECODE_WITH_0_1_0],
        input="".join(encode_message(m).hex() + "\n" for m in messages),
        capture_output=True,
        text=True,
        env=release_env(tree),
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        ["APP", "n1", 3, 1, ""],
        ["HEARTBEAT_RESP", "n1", 3, 0, ""],
        ["SNAP", "n1", 3, 0, "c1"],
        ["SNAP", "n1", 3, 0, ""],
    ]
