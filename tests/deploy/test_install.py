"""The install deploy/README.md gives works: `python -m build` makes an sdist and a wheel from
the repo, the wheel installs into a fresh venv (dependencies from the package index), and the
`dex-ha` it installs runs, from the venv and not from this checkout. Every file under dex_ha/
that git tracks (Python or not) is in the wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import dex_ha

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 240
# What only the extras bring (dev, openai, anthropic, the adapters): never in a plain install.
EXTRAS_ONLY = {"pytest", "playwright", "claude-agent-sdk", "openai", "anthropic", "openai-agents", "hypothesis", "mypy"}
LIGHT_INSTALL_MAX_PACKAGES = 20  # aiohttp and its helpers, msgpack, prometheus-client, uvloop: 15 today


def run(*args: str | Path, cwd: Path, timeout_s: float = BUILD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run a command with this checkout off the import path: what runs is what got installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def tracked_package_files() -> set[str]:
    """dex_ha/... paths git tracks; skip when this is not a git checkout (e.g. an sdist)."""
    try:
        listed = subprocess.run(["git", "ls-files", "dex_ha"], cwd=REPO, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("git is not installed: cannot list the package's tracked files")
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    return set(listed.stdout.split())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build", reason="`build` (the dev extra) makes the wheel")
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, REPO, cwd=out)
    wheels = list(out.glob("dex_ha-*.whl"))
    assert len(wheels) == 1 and list(out.glob("dex_ha-*.tar.gz")), sorted(p.name for p in out.iterdir())
    return wheels[0]


def test_the_wheel_holds_every_file_of_the_package(wheel: Path):
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(tracked_package_files() - in_wheel)
    assert not missing, f"not in {wheel.name}: {missing}"
    assert not [n for n in in_wheel if "__pycache__" in n or n.endswith(".pyc")], "bytecode in the wheel"


def test_the_wheel_installs_into_a_fresh_venv_and_dex_ha_runs(wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)  # this pip installs into it: faster
    python, dex_ha_cli = venv / "bin" / "python", venv / "bin" / "dex-ha"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", wheel, cwd=tmp_path)
    assert run(dex_ha_cli, "--version", cwd=tmp_path).stdout.strip() == dex_ha.__version__
    # The server, the Worker and the client import with the dependencies pip installed, from the venv.
    imported = run(
        python,
        "-c",
        "import dex_ha, dex_ha.server.node, dex_ha.worker, dex_ha.client; print(dex_ha.__file__)",
        cwd=tmp_path,
    ).stdout.strip()
    assert Path(imported).is_relative_to(venv), imported
    assert "usage: dex-ha" in run(dex_ha_cli, "node", "--help", cwd=tmp_path).stdout
    # The README's run command installs the package without extras: only the server's own
    # dependencies, none of the test tools or model SDKs of the extras.
    listed = run(sys.executable, "-m", "pip", "--python", python, "list", "--format=freeze", cwd=tmp_path).stdout
    installed = {line.split("==")[0].lower().replace("_", "-") for line in listed.split()}
    assert not installed & EXTRAS_ONLY, sorted(installed & EXTRAS_ONLY)
    assert len(installed) <= LIGHT_INSTALL_MAX_PACKAGES, sorted(installed)
