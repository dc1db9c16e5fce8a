"""Backups of a running cluster, and new clusters seeded from them (`dex-ha backup`,
`dex-ha restore`, `GET /v1/cluster/backup`).

A backup file is three parts, in this order:

    DEXHA-BACKUP\\n        the magic line: "this is a dex-ha backup"
    {...}\\n               one line of JSON, the header (see BackupHeader)
    <payload>             the engine's state: one self-contained SQLite database

The header says what the payload covers: the Raft index and term of the last entry applied
to it, the engine schema version, when and where it was taken, and the payload's length and
sha256. `read_backup` checks all of it before anything is restored.

Consistency. The active node copies its state while it goes on serving: the copy reads
through a SQLite connection of its own in ONE read transaction (WAL mode), so it sees one
committed state — a prefix of the log up to one index — while the Raft thread goes on
applying newer entries on the engine's connection; neither blocks the other. The index is
read from the copy itself, and its term from the Raft log (a committed entry's term never
changes).

Restore seeds a NEW cluster: a fresh Raft log whose first record is a snapshot at the
backup's index, with the members given to restore as its voters. Nothing of the old
cluster's membership carries over. Its term numbers continue from the backup's term (the
new cluster's first election is one above it): the state records the term of every attempt
and fences hand-outs of older terms, so a cluster that started again at term 1 would refuse
every hand-out, and its takeover would not fail the attempts the backup caught running.

The new cluster gets a new cluster id (raft/identity.py), the same on every member restored
from the same file with the same member list (and cluster token): the backup's id says
where it came from, never where it goes. Members of the backed-up cluster, or of any other,
refuse a restored node, so a restore never joins or overwrites a running cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dex_ha.engine import Engine, copy_to_bytes
from dex_ha.engine.schema import SCHEMA_VERSION
from dex_ha.raft.identity import IDENTITY_FILE, IdentityFile, derived_cluster_id, new_id
from dex_ha.raft.snapshot_file import seal_bytes
from dex_ha.raft.storage import RaftStorage, fsync_dir
from dex_ha.raft.types import ConfState, HardState, SnapshotMeta
from dex_ha.server.data_dir import open_data_dir

MAGIC = b"DEXHA-BACKUP\n"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 64 << 10  # the header is a few hundred bytes; more is not a backup
MEMBER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Where the node keeps things in its data dir (see server/node.py and raft/node.py).
STATE_DB = "state.db"
RAFT_DIR = "raft"
SNAPSHOT_DIR = "snapshots"

if TYPE_CHECKING:
    from dex_ha.server.node import NodeServer


class BackupError(ValueError):
    """A backup file that cannot be restored, or a restore that must not run; the message
    says which and why."""


class BackupNotPossible(Exception):
    """The node cannot take a backup right now (the message says why; retry later)."""


@dataclass(frozen=True)
class BackupHeader:
    format: int  # FORMAT_VERSION when written
    index: int  # the Raft index of the last entry applied to the payload
    term: int  # that entry's term
    schema_version: int  # the engine schema of the payload
    created_at: str  # ISO 8601, UTC
    node_id: str  # the node that took it
    payload_bytes: int
    sha256: str  # of the payload, hex
    cluster_id: str = ""  # the cluster it was taken from ("" in backups from before ids)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode() + b"\n"


def make_header(
    index: int, term: int, node_id: str, payload: bytes, now_s: float | None = None, cluster_id: str = ""
) -> BackupHeader:
    created = datetime.fromtimestamp(time.time() if now_s is None else now_s, UTC)
    return BackupHeader(
        format=FORMAT_VERSION,
        index=index,
        term=term,
        schema_version=SCHEMA_VERSION,
        created_at=created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        node_id=node_id,
        payload_bytes=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
        cluster_id=cluster_id,
    )


def backup_bytes(header: BackupHeader, payload: bytes) -> Iterable[bytes]:
    """The parts of a backup file, in order (the server streams them)."""
    yield MAGIC
    yield header.encode()
    yield payload


# ---------------------------------------------------------------- taking one


async def take_backup(node: NodeServer) -> tuple[BackupHeader, bytes]:
    """A consistent copy of the node's state, taken while it serves: (header, payload).

    The copy runs in a worker thread through a connection of its own, in one read
    transaction, so the HTTP loop and the Raft thread both go on meanwhile (see the module
    docstring). BackupNotPossible when the index has left the log in the meantime.
    """
    index, payload = await asyncio.to_thread(copy_to_bytes, node.replica.snapshot_copier())
    try:
        term = await node.raft.entry_term(index)
    except ValueError as exc:  # compacted away while the copy ran: only under very heavy load
        raise BackupNotPossible(f"the copy's index {index} left the Raft log meanwhile ({exc}); try again") from None
    return make_header(index, term, node.config.node_id, payload, cluster_id=node.raft.cluster_id), payload


# ---------------------------------------------------------------- reading


def parse_backup(data: bytes, where: str = "backup") -> tuple[BackupHeader, bytes]:
    """The header and payload of a backup file's bytes, checked: magic, format version,
    length and sha256. BackupError (naming `where`) otherwise."""
    if not data.startswith(MAGIC):
        raise BackupError(f"{where}: not a dex-ha backup (it does not start with {MAGIC.strip().decode()})")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER_BYTES)
    if end < 0:
        raise BackupError(f"{where}: the header line is missing or cut short")
    header = _decode_header(data[len(MAGIC) : end], where)
    payload = data[end + 1 :]
    if len(payload) != header.payload_bytes:
        raise BackupError(
            f"{where}: the payload has {len(payload)} bytes, the header says {header.payload_bytes} "
            f"(the file is cut short or has something appended)"
        )
    digest = hashlib.sha256(payload).hexdigest()
    if digest != header.sha256:
        raise BackupError(
            f"{where}: checksum mismatch: the payload's sha256 is {digest}, the header says "
            f"{header.sha256} (the file is damaged)"
        )
    return header, payload


def read_backup(path: Path) -> tuple[BackupHeader, bytes]:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise BackupError(f"{path}: no such file") from None
    except OSError as exc:
        raise BackupError(f"{path}: cannot read it ({exc.strerror})") from None
    return parse_backup(data, str(path))


def _decode_header(line: bytes, where: str) -> BackupHeader:
    try:
        raw = json.loads(line)
    except ValueError:
        raise BackupError(f"{where}: the header is not JSON (the file is damaged)") from None
    if not isinstance(raw, dict):
        raise BackupError(f"{where}: the header is not a JSON object")
    version = raw.get("format")
    if version != FORMAT_VERSION:
        raise BackupError(
            f"{where}: unknown backup format version {version!r}; this dex-ha reads version "
            f"{FORMAT_VERSION} (restore it with the dex-ha version that wrote it, or a newer one)"
        )
    types = {
        "index": int,
        "term": int,
        "schema_version": int,
        "created_at": str,
        "node_id": str,
        "payload_bytes": int,
        "sha256": str,
    }
    for name, kind in types.items():
        if not isinstance(raw.get(name), kind) or isinstance(raw.get(name), bool):
            raise BackupError(f"{where}: header field {name!r} is missing or not a {kind.__name__}")
    if raw["index"] < 1 or raw["term"] < 1:
        raise BackupError(f"{where}: header index {raw['index']} / term {raw['term']} must be at least 1")
    cluster_id = raw.get("cluster_id", "")
    if not isinstance(cluster_id, str):
        raise BackupError(f"{where}: header field 'cluster_id' is not a str")
    return BackupHeader(**{name: raw[name] for name in ("format", *types)}, cluster_id=cluster_id)


# ---------------------------------------------------------------- writing a file


def write_atomically(path: Path, parts: Iterable[bytes]) -> None:
    """Write `path` whole or not at all: a temp file beside it, fsynced, then renamed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


# ---------------------------------------------------------------- restore


def parse_members(text: str | None, node_id: str) -> tuple[str, ...]:
    """`--members n1,n2,n3` as a sorted tuple of ids (default: the node alone); ValueError
    naming the argument when an id is malformed, repeated, or the node is not among them."""
    if not MEMBER_ID_RE.match(node_id or ""):
        raise ValueError(f"node_id: {node_id!r} is not a node id (letters, digits, . _ -; at most 64)")
    if text is None:
        return (node_id,)
    ids = [part.strip() for part in text.split(",")]
    for member in ids:
        if not MEMBER_ID_RE.match(member):
            raise ValueError(f"members: {member!r} is not a node id (letters, digits, . _ -; at most 64)")
    if len(set(ids)) != len(ids):
        raise ValueError(f"members: {text!r} names a node twice")
    if node_id not in ids:
        raise ValueError(f"members: {text!r} does not include this node ({node_id!r})")
    return tuple(sorted(ids))


def check_empty_data_dir(data_dir: Path) -> None:
    """Restore only seeds a new node: it never writes over a node's state."""
    if data_dir.exists() and not data_dir.is_dir():
        raise BackupError(f"data dir {data_dir} is a file, not a directory")
    if data_dir.is_dir():
        found = sorted(p.name for p in data_dir.iterdir())
        if found:
            shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
            raise BackupError(
                f"data dir {data_dir} is not empty ({shown}): restore seeds a new node only; "
                f"give it an empty or new directory"
            )


def restore_data_dir(
    backup: Path,
    data_dir: Path,
    node_id: str,
    members: tuple[str, ...],
    durability: str = "strict",
    cluster_token: str = "",
) -> tuple[BackupHeader, str]:
    """Seed `data_dir` as member `node_id` of a new cluster of `members` from `backup`.

    Checks everything first (the file, its checksum and format, the state inside it, an
    empty data dir); then writes the engine state, the snapshot file and a fresh Raft log
    whose first record is a snapshot at the backup's index with `members` as its voters.
    A node started on `data_dir` serves the backed-up state once a quorum of `members` runs.
    Returns the header and the new cluster's id (see the module docstring).
    """
    if node_id not in members:
        raise ValueError(f"members: {members!r} does not include node_id {node_id!r}")
    header, payload = read_backup(backup)
    check_empty_data_dir(data_dir)
    created = not data_dir.exists()
    open_data_dir(data_dir)
    try:
        _restore_engine(data_dir / STATE_DB, payload, header)
        _write_snapshot_file(data_dir / SNAPSHOT_DIR, header.index, payload, durability)
        _write_raft_log(data_dir / RAFT_DIR, header, members, durability)
        cluster_id = restored_cluster_id(header, members, cluster_token)
        IdentityFile(data_dir / IDENTITY_FILE, new_id(), cluster_id).save(durability == "strict")
    except BaseException:
        # It was empty: leave it so, or a second try would be refused as "not empty".
        if created:
            shutil.rmtree(data_dir)
        else:
            _remove_contents(data_dir)
        raise
    return header, cluster_id


def restored_cluster_id(header: BackupHeader, members: tuple[str, ...], cluster_token: str = "") -> str:
    """The id of the new cluster restored from `header`'s backup with `members`: the same
    for each of its members, new against the backed-up cluster and any other restore."""
    return derived_cluster_id(header.sha256, header.cluster_id, ",".join(sorted(members)), cluster_token)


def _remove_contents(directory: Path) -> None:
    for child in directory.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


def _restore_engine(path: Path, payload: bytes, header: BackupHeader) -> None:
    engine = Engine(str(path), durable=True)
    try:
        engine.restore(payload, header.index)  # checks the schema and that the state is at header.index
    except ValueError as exc:
        raise BackupError(f"the backup's state cannot be restored: {exc}") from None
    finally:
        engine.close()


def _write_snapshot_file(snap_dir: Path, index: int, payload: bytes, durability: str) -> None:
    """The snapshot the node sends a member that joins later or falls behind the log,
    with its checksum trailer (raft/snapshot_file.py)."""
    snap_dir.mkdir()
    path = snap_dir / f"snapshot-{index:020d}.bin"  # the name raft/node.py looks for
    sealed = seal_bytes(payload, index)
    if durability == "strict":
        write_atomically(path, [sealed])
    else:
        path.write_bytes(sealed)


def _write_raft_log(raft_dir: Path, header: BackupHeader, members: tuple[str, ...], durability: str) -> None:
    meta = SnapshotMeta(header.index, header.term, ConfState(voters=members))
    storage = RaftStorage.open(raft_dir, durability=durability)
    try:
        storage.save(HardState(term=header.term, commit=header.index), [])
        storage.save_snapshot(meta)
    finally:
        storage.close()


def describe(header: BackupHeader) -> dict[str, Any]:
    """What `dex-ha backup` and `dex-ha restore` print about a backup."""
    return {
        "index": header.index,
        "term": header.term,
        "schema_version": header.schema_version,
        "created_at": header.created_at,
        "node_id": header.node_id,
        "bytes": header.payload_bytes,
        "sha256": header.sha256,
        "cluster_id": header.cluster_id or None,
    }
