"""deploy/Dockerfile builds with podman, and the image runs `dex-ha` as a non-root user with
the data dir as a volume and /livez as its health check.

Slow (pulls the Python base image and installs the dependencies: minutes), so it runs only
with DEX_HA_LONG=1. It skips, saying what failed, when podman is missing or cannot pull the
base image (a sandbox with no route to docker.io); DEX_HA_PYTHON_IMAGE names another base
(a mirror) for such a place."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import dex_ha
from harness.long_runs import long_runs

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BASE = "docker.io/library/python:3.12-slim-bookworm"  # deploy/Dockerfile's PYTHON_IMAGE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not long_runs(), reason="builds a container image (minutes): runs with DEX_HA_LONG=1"),
]


def podman(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (Debian package `podman`; scripts/test installs it as root)")
    base = os.environ.get("DEX_HA_PYTHON_IMAGE", DEFAULT_BASE)
    pulled = podman("pull", "--quiet", base, timeout_s=300)
    if pulled.returncode != 0:
        pytest.skip(f"podman cannot pull the base image {base}: {pulled.stderr.strip()}")
    tag = f"localhost/dex-ha-test:{uuid.uuid4().hex[:12]}"
    built = podman(
        "build",
        "--format",
        "docker",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        "-f",
        str(REPO / "deploy" / "Dockerfile"),
        "-t",
        tag,
        str(REPO),
    )
    assert built.returncode == 0, f"podman build failed:\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"
    try:
        yield tag
    finally:
        podman("rmi", "--force", tag, timeout_s=120)


def test_the_image_runs_dex_ha_as_a_non_root_user(image: str):
    version = podman("run", "--rm", image, "--version", timeout_s=120)
    assert version.returncode == 0 and version.stdout.strip() == dex_ha.__version__, version.stderr
    uid = podman("run", "--rm", "--entrypoint", "id", image, "-u", timeout_s=120)
    assert uid.stdout.strip() == "10001", uid.stdout + uid.stderr  # the StatefulSet's runAsUser


def test_the_image_declares_the_data_volume_and_the_livez_health_check(image: str):
    inspected = podman("image", "inspect", image, timeout_s=60)
    assert inspected.returncode == 0, inspected.stderr
    config = json.loads(inspected.stdout)[0]["Config"]
    assert "/var/lib/dex-ha" in config["Volumes"]
    assert config["User"] == "10001:10001"
    health = podman("image", "inspect", "--format", "{{json .HealthCheck}}", image, timeout_s=60).stdout
    assert "DEX_HA_HEALTHCHECK_URL" in health, health
    assert any(e == "DEX_HA_HEALTHCHECK_URL=http://127.0.0.1:8801/livez" for e in config["Env"]), config["Env"]
