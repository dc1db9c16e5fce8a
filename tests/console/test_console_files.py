"""The console's files ship with the package: every file in dex_ha/server/console/static
is matched by the package-data globs of pyproject.toml (a file they miss would be absent
from an installed wheel, and /ui would break only there)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from dex_ha.server.console import CONTENT_TYPES, STATIC_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_every_static_file_is_package_data_and_has_a_content_type():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "dex_ha.server.console"]
    files = sorted(path.relative_to(STATIC_DIR.parent).as_posix() for path in STATIC_DIR.iterdir())
    assert {"static/index.html", "static/console.js", "static/console.css"} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in globs), f"{name} is not in package-data"
        assert Path(name).suffix in CONTENT_TYPES, f"{name}: /ui/static serves no content type for it"
