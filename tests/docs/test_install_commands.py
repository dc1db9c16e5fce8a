"""The install commands the docs give work from a clone: dex-ha is not on the public package
index, so an extra is installed as `pip install -e '.[extra]'`, and every extra named exists
in pyproject.toml. The README's run command installs no extra (the server needs none)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The product's own modules too: their ImportError messages tell a user what to install.
PAGES = sorted(
    [
        REPO / "README.md",
        *(REPO / "docs").rglob("*.md"),
        *(REPO / "examples").glob("*.py"),
        *(REPO / "dex_ha").rglob("*.py"),
    ]
)
EXTRA = re.compile(r"pip install -e '\.\[([^\]]+)\]'")


def extras_declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def test_no_page_installs_dex_ha_from_the_package_index() -> None:
    offenders = [str(p.relative_to(REPO)) for p in PAGES if re.search(r"pip install ['\"]?dex-ha\b", p.read_text())]
    assert not offenders, f"dex-ha is not on the package index; install from the clone in: {offenders}"


def test_every_extra_a_page_installs_exists() -> None:
    declared = extras_declared()
    named = {
        (p.relative_to(REPO), extra)
        for p in PAGES
        for group in EXTRA.findall(p.read_text())
        for extra in group.split(",")
    }
    assert named, "no page names an extra: the pattern no longer matches the docs"
    unknown = sorted((str(page), extra) for page, extra in named if extra not in declared)
    assert not unknown, f"extras not in pyproject.toml: {unknown}"


def test_the_readme_run_command_installs_the_server_alone() -> None:
    readme = (REPO / "README.md").read_text()
    run_command = next(line.strip() for line in readme.splitlines() if line.strip().endswith("dex-ha dev"))
    assert "pip install -e ." in run_command and "[" not in run_command, run_command
