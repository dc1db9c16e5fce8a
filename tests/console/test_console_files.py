"""The console's files can all be served: /ui/static has a content type for each of them.
(That they ship in the wheel is checked for every file under dex_ha/ by
tests/deploy/test_install.py.)"""

from __future__ import annotations

from pathlib import Path

from dex_ha.server.console import CONTENT_TYPES, STATIC_DIR


def test_every_static_file_has_a_content_type():
    files = sorted(path.relative_to(STATIC_DIR.parent).as_posix() for path in STATIC_DIR.iterdir())
    assert {"static/index.html", "static/console.js", "static/console.css"} <= set(files)
    for name in files:
        assert Path(name).suffix in CONTENT_TYPES, f"{name}: /ui/static serves no content type for it"
