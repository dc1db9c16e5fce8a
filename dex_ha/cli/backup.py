"""`dex-ha backup` and `dex-ha restore` (the file format and the restore itself are in
dex_ha/server/backup.py; docs/operations.md, "Backup and restore", says how to use them).

    dex-ha backup --url URL [--url URL ...] --out FILE [--token T]
    dex-ha restore FILE --data-dir DIR --node-id ID [--members n1,n2,n3] [--cluster-token T]

`backup` finds the active node like the other commands, downloads `GET /v1/cluster/backup`
into a temp file beside FILE, checks its header and sha256, and only then renames it to
FILE: a FILE that exists is always a whole, verified backup.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from dex_ha.cli.common import (
    EXIT_NO_NODE,
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandFailed,
    Subparsers,
)
from dex_ha.cli.remote import find_active, refusal, token_of, urls_of
from dex_ha.client import Connection, DexError, DexUnavailable
from dex_ha.raft.storage import fsync_dir
from dex_ha.server.backup import (
    BackupError,
    describe,
    parse_members,
    read_backup,
    restore_data_dir,
)
from dex_ha.server.data_dir import private_files

BACKUP_PATH = "/v1/cluster/backup"
DEFAULT_TIMEOUT_S = 600.0
READ_CHUNK_BYTES = 1 << 20


def add_parsers(sub: Subparsers, remote: argparse.ArgumentParser) -> None:
    backup = sub.add_parser("backup", parents=[remote], help="write a consistent backup of a running cluster")
    backup.add_argument("--out", required=True, metavar="FILE", help="the backup file to write (atomically)")
    backup.add_argument("--force", action="store_true", help="replace --out if it exists (default: refuse)")
    backup.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds for the whole download (default {DEFAULT_TIMEOUT_S:.0f})",
    )

    restore = sub.add_parser("restore", help="seed a node of a NEW cluster from a backup file")
    restore.add_argument("file", metavar="FILE", help="a file written by `dex-ha backup`")
    restore.add_argument("--data-dir", required=True, help="the new node's data dir (must be empty or absent)")
    restore.add_argument("--node-id", required=True, help="the new node's id (its config's node_id)")
    restore.add_argument(
        "--members",
        metavar="ID,ID,...",
        help="the voting members of the new cluster, this node included; restore every "
        "node from the same file with the same list (default: this node alone)",
    )
    restore.add_argument(
        "--cluster-token",
        default="",
        metavar="TEXT",
        help="part of the new cluster's id: give the same to every member of one restore, and a "
        "different one to restore the same backup as a second cluster (default: none)",
    )
    restore.add_argument("--relaxed", action="store_true", help="do not fsync the restored files (tests)")


# ---------------------------------------------------------------- backup


async def download_backup(
    urls: list[str], token: str | None, out: Path, timeout_s: float, replace: bool = False
) -> dict[str, Any]:
    """Download a backup from the active node into `out`; what it covers (see describe).
    An existing `out` is replaced only with `replace`: a backup is often the one copy of a
    cluster's data, and the same command run again must not overwrite the last one."""
    if timeout_s <= 0:
        raise ValueError(f"--timeout must be > 0, got {timeout_s}")
    out = out.resolve()
    if not out.parent.is_dir():
        raise ValueError(f"--out: the directory {out.parent} does not exist")
    _refuse_to_overwrite(out, replace)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
    try:
        async with asyncio.timeout(timeout_s):
            with os.fdopen(fd, "wb") as f:
                await _stream_into(urls, token, f, timeout_s)
                f.flush()
                os.fsync(f.fileno())
        header, _ = read_backup(Path(tmp))  # the header and sha256 hold, or nothing is renamed
        _refuse_to_overwrite(out, replace)  # a file that appeared during the download too
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(out.parent)
    return describe(header)


def _refuse_to_overwrite(out: Path, replace: bool) -> None:
    if out.exists() and not replace:
        raise ValueError(f"--out: {out} exists; choose another name, or pass --force to replace it")


async def _stream_into(urls: list[str], token: str | None, f: BinaryIO, timeout_s: float) -> None:
    async with Connection(urls, token, give_up_after_s=min(timeout_s, 30.0)) as conn:
        response = await conn.open_stream(BACKUP_PATH)
        try:
            async for chunk in response.content.iter_chunked(READ_CHUNK_BYTES):
                f.write(chunk)
        finally:
            response.release()


def backup_line(out: str, info: dict[str, Any]) -> str:
    """What `dex-ha backup` prints once the file is in place."""
    return (
        f"backup written to {out}: index {info['index']}, term {info['term']}, schema {info['schema_version']}, "
        f"{info['bytes']} bytes, sha256 {info['sha256']}, taken on {info['node_id']} at {info['created_at']}"
        + (f" (cluster {info['cluster_id']})" if info.get("cluster_id") else "")
    )


# ---------------------------------------------------------------- restore


def run_restore(
    file: str, data_dir: str, node_id: str, members_text: str | None, relaxed: bool, cluster_token: str = ""
) -> str:
    """The `dex-ha restore` command's work; returns what it prints. ValueError (BackupError
    among them) when the file, its checksum, its format or the data dir refuse it."""
    members = parse_members(members_text, node_id)
    header, cluster_id = restore_data_dir(
        Path(file),
        Path(data_dir),
        node_id,
        members,
        durability="relaxed" if relaxed else "strict",
        cluster_token=cluster_token,
    )
    others = [m for m in members if m != node_id]
    then = (
        f"restore the other members ({', '.join(others)}) from the same file with the same --members "
        f"(and --cluster-token), then start all of them"
        if others
        else "start it"
    )
    return (
        f"restored {file} into {data_dir}: node {node_id} of a new cluster {cluster_id} of {', '.join(members)}, "
        f"at index {header.index} (backup term {header.term}, taken on {header.node_id} at {header.created_at}).\n"
        f"Next: {then}. Each node's config must use this data_dir and list exactly these members as peers. "
        f"The new cluster never joins a running one: members of another cluster refuse it."
    )


# ---------------------------------------------------------------- the commands


def cmd_backup(args: argparse.Namespace) -> int:
    async def backup() -> dict[str, Any]:
        url = await find_active(urls_of(args), token_of(args))
        return await download_backup([url], token_of(args), Path(args.out), args.timeout, replace=args.force)

    try:
        info = asyncio.run(backup())
    except BackupError as exc:  # the download's header or checksum is wrong: nothing written
        raise CommandFailed(str(exc), EXIT_REFUSED) from None
    except ValueError as exc:  # a bad argument
        raise CommandFailed(str(exc), EXIT_USAGE) from None
    except TimeoutError:
        raise CommandFailed(f"the download took longer than --timeout {args.timeout:g} s", EXIT_NO_NODE) from None
    except DexUnavailable as exc:
        raise CommandFailed(f"no active node served the backup: {exc.message}", EXIT_NO_NODE) from None
    except DexError as exc:
        raise CommandFailed(refusal(exc), EXIT_REFUSED) from None
    print(backup_line(args.out, info))
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    try:
        with private_files():  # the restored state is the node's only, as a running node's is
            print(run_restore(args.file, args.data_dir, args.node_id, args.members, args.relaxed, args.cluster_token))
    except ValueError as exc:  # the file, its checksum or format, the data dir or an argument
        raise CommandFailed(str(exc), EXIT_USAGE) from None
    return 0


__all__ = ["BackupError", "add_parsers", "backup_line", "cmd_backup", "cmd_restore", "download_backup", "run_restore"]
