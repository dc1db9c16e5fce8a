"""docs/architecture.md's module map is the list of every module of dex_ha and harness with
the first sentence of its docstring (scripts/module_map.py writes it)."""

from __future__ import annotations

import re

from scripts import module_map


def test_the_module_map_in_the_architecture_page_is_current() -> None:
    page = module_map.DOC.read_text()
    assert module_map.with_module_map(page, module_map.module_map()) == page, (
        "docs/architecture.md's module map is stale: run python scripts/module_map.py"
    )


def test_the_map_names_every_module_once_and_nothing_else() -> None:
    page = module_map.DOC.read_text()
    generated = page[page.index(module_map.BEGIN) : page.index(module_map.END)]
    named = re.findall(r"^\| `([^`]+\.py)` \|", generated, flags=re.M)
    on_disk = [p.as_posix() for package in module_map.PACKAGES for p in module_map.modules(package)]
    assert named == on_disk
    assert len(on_disk) > 100  # both packages were read


def test_a_summary_is_one_sentence_of_the_docstring() -> None:
    # "e.g. the" and a path with a dot do not end the sentence; a full stop before a capital does.
    assert module_map.SENTENCE_END.split("Runs e.g. the engine (docs/api.md). Then more.", maxsplit=1)[0] == (
        "Runs e.g. the engine (docs/api.md)."
    )
