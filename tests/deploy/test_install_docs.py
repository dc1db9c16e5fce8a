"""deploy/README.md's install steps stay true: they install dex-ha from the repository (it is
not on PyPI), and they install every file the systemd unit's Documentation= names."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "deploy" / "README.md"
UNIT = REPO / "deploy" / "dex-ha.service"
DOC_DIR = "/usr/share/doc/dex-ha"


class CaseKeepingParser(configparser.ConfigParser):
    """systemd keys are case-sensitive (Documentation=), so keep them as written."""

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def documentation_paths() -> list[str]:
    unit = CaseKeepingParser(strict=False, interpolation=None)
    unit.read(UNIT)
    urls = unit["Unit"]["Documentation"].split()
    assert urls and all(u.startswith(("file://", "https://", "http://", "man:")) for u in urls), urls
    return [u.removeprefix("file://") for u in urls if u.startswith("file://")]


def installed_docs() -> dict[str, Path]:
    """Target path -> repo source, from the README's `install -m 0644 <sources> <target>` steps into DOC_DIR."""
    installed: dict[str, Path] = {}
    for command in re.findall(rf"install -m 0644 ([^&\n]+?) ({re.escape(DOC_DIR)}/\S*)", README.read_text()):
        sources, target = command[0].split(), command[1]
        for pattern in sources:
            matches = sorted(REPO.glob(pattern))
            assert matches, f"the README installs {pattern}, which matches nothing in the repo"
            for source in matches:
                path = f"{target.rstrip('/')}/{source.name}" if target.endswith("/") else target
                installed[path] = source
    return installed


def test_the_units_documentation_is_installed_by_the_readme_steps():
    docs = installed_docs()
    for path in documentation_paths():
        assert path in docs, f"Documentation={path}: no README step installs it (it installs {sorted(docs)})"


def test_the_readme_installs_from_the_repository_not_from_pypi():
    text = README.read_text()
    assert not re.search(r"pip install dex-ha\b", text), "dex-ha is not published on PyPI"
    assert "python3 -m build --wheel" in text and "pip install dist/dex_ha-" in text
