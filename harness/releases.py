"""Earlier releases' code, taken from this checkout's git history, for upgrade tests: a
release's tree is written out with `git archive` into a directory of the test's, and a
process runs it with PYTHONPATH pointing there (`release_env`)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

from harness.processes import REPO_ROOT

# The commit that is release 0.1.0 (the first release; the CHANGELOG's "## 0.1.0").
RELEASE_0_1_0_COMMIT = "4629d31d1bfadaef68b622c16b50f6e00c4a178c"
RELEASE_0_1_0 = "0.1.0"


def checkout_release(commit: str, dest: Path) -> Path | None:
    """The tree of `commit` written into `dest` (made if needed); None when this checkout
    has no git history holding it (a source archive, a shallow clone): the caller skips."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", commit],
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(dest, filter="data")
    return dest


def release_env(tree: Path) -> dict[str, str]:
    """The environment that runs `python -m dex_ha.cli` from `tree` instead of this code.
    Run it in another working directory than this checkout: `python -m` puts the working
    directory first on the path, before PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": str(tree)}
