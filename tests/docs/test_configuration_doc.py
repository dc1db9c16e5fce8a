"""docs/configuration.md against the code: every field of ServerConfig has a row, each row's
environment variable is one the loader really accepts (and "—" one it really ignores), each
default is ServerConfig's, the `dex-ha dev` list is DEV_ENV_KEYS, and the example file loads."""

from __future__ import annotations

import re
import tomllib
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest

from dex_ha.server import config as config_module
from dex_ha.server.auth import ROLES
from dex_ha.server.config import DEV_ENV_KEYS, ServerConfig, load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\| `(?P<key>[a-z_]+)` \| (?P<env>[^|]+) \| (?P<default>[^|]+) \| (?P<what>.+) \|$")
# Keys the file may hold that are not fields of ServerConfig (the loader turns them into one).
FILE_ONLY_KEYS = {"cluster_secret_file"}


def doc_rows(page: str) -> dict[str, dict[str, str]]:
    rows: dict[str, dict[str, str]] = {}
    for line in page.splitlines():
        match = ROW.match(line)
        if match:
            assert match["key"] not in rows, f"{match['key']}: two rows in docs/configuration.md"
            rows[match["key"]] = {k: v.strip() for k, v in match.groupdict().items()}
    return rows


def env_names(cell: str) -> list[str]:
    return re.findall(r"`(DEX_HA_[A-Z_]+)`", cell)


def sample_value(key: str) -> str:
    """A value the loader can parse for `key` (it parses before any check)."""
    if key == "scoped_tokens":
        return "client:team-a=a-scoped-token-0123"
    kind = config_module.ENV_KEYS.get(key, str)
    return {bool: "true", int: "7", float: "0.5"}.get(kind, "x")


def accepted_keys(name: str, value: str) -> set[str]:
    """The configuration keys that the loader sets from the variable `name` alone."""
    return set(config_module._apply_env({}, {name: value}))


ROWS = doc_rows(DOC.read_text())


def test_every_field_of_server_config_has_a_row() -> None:
    names = {f.name for f in fields(ServerConfig)}
    missing = sorted(names - set(ROWS))
    extra = sorted(set(ROWS) - names - FILE_ONLY_KEYS)
    assert not missing, f"docs/configuration.md has no row for {missing}"
    assert not extra, f"docs/configuration.md documents keys ServerConfig does not have: {extra}"


@pytest.mark.parametrize("key", sorted(ROWS))
def test_the_environment_column_is_what_the_loader_accepts(key: str) -> None:
    cell = ROWS[key]["env"]
    if cell == "—":
        # Documented as file-only: the loader must really ignore DEX_HA_<KEY>.
        assert accepted_keys(f"DEX_HA_{key.upper()}", sample_value(key)) == set(), (
            f"{key}: the loader accepts DEX_HA_{key.upper()}, the page says it does not"
        )
        return
    names = env_names(cell)
    assert names, f"{key}: the environment column names no DEX_HA_ variable: {cell!r}"
    for name in names:
        assert accepted_keys(name, sample_value(key)) == {key}, f"{key}: the loader does not set it from {name}"


def test_every_variable_the_loader_accepts_is_on_the_page() -> None:
    documented = {name for row in ROWS.values() for name in env_names(row["env"])}
    accepted = {f"DEX_HA_{key.upper()}" for key in config_module.ENV_KEYS}
    accepted |= {f"DEX_HA_TOKENS_{role.upper()}" for role in ROLES}
    assert accepted - documented == set(), f"variables the loader reads but the page omits: {accepted - documented}"


@pytest.mark.parametrize("field_name", sorted(f.name for f in fields(ServerConfig)))
def test_the_default_column_is_server_configs_default(field_name: str) -> None:
    spec = next(f for f in fields(ServerConfig) if f.name == field_name)
    cell = ROWS[field_name]["default"]
    if spec.default is MISSING and spec.default_factory is MISSING:
        assert cell == "(required)" or cell.startswith("derived:"), (
            f"{field_name}: has no default in ServerConfig; the page says {cell!r}"
        )
        return
    if spec.default is not MISSING:
        default: Any = spec.default
    else:
        assert spec.default_factory is not MISSING
        default = spec.default_factory()
    if default is None or default == {} or default == ():
        assert cell == "none", f"{field_name}: the default is empty; the page says {cell!r}"
        return
    literal = re.fullmatch(r"`(.+)`", cell)
    assert literal, f"{field_name}: the default should be a TOML literal in backticks, got {cell!r}"
    assert tomllib.loads(f"v = {literal[1]}")["v"] == default, f"{field_name}: page {cell}, code {default!r}"


def test_the_dev_list_is_what_dex_ha_dev_reads() -> None:
    page = DOC.read_text()
    block = page.split("<!-- dev keys -->", 1)[1].split("<!-- end of dev keys -->", 1)[0]
    listed = set(env_names(block))
    expected = {f"DEX_HA_{key.upper()}" for key in DEV_ENV_KEYS}
    expected |= {f"DEX_HA_TOKENS_{role.upper()}" for role in ROLES}
    assert listed == expected


def test_the_complete_file_loads(tmp_path: Path) -> None:
    example = DOC.read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    secret = tmp_path / "cluster-secret"
    secret.write_text("a-cluster-secret-of-32-characters\n")
    path = tmp_path / "node.toml"
    path.write_text(example.replace("/etc/dex-ha/cluster-secret", str(secret)))
    loaded = load_config(path, env={})
    assert (loaded.node_id, len(loaded.peers), loaded.cluster_secret) == ("n1", 3, "a-cluster-secret-of-32-characters")
