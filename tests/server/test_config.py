"""ServerConfig: the lease timing settings (lease_drift_margin_ms) are read, checked and
handed to the Raft node."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dex_ha.server.config import ConfigError, ServerConfig, dev_config, load_config, replace
from dex_ha.server.node import NodeServer
from dex_ha.server.versions import own_version

TOML = """
node_id = "n1"
data_dir = "{data}"
http_listen = "127.0.0.1:8801"
raft_listen = "127.0.0.1:9801"
election_timeout_min_ms = 600
election_timeout_max_ms = 1200
lease_drift_margin_ms = 80

[[peers]]
id = "n1"
raft_addr = "127.0.0.1:9801"
url = "http://127.0.0.1:8801"
"""


def _config_file(tmp_path: Path, text: str = TOML) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text.format(data=tmp_path / "data"))
    return path


def test_lease_drift_margin_from_toml_and_environment(tmp_path: Path) -> None:
    path = _config_file(tmp_path)
    assert load_config(path, env={}, insecure=True).lease_drift_margin_ms == 80
    env = {"DEX_HA_LEASE_DRIFT_MARGIN_MS": "120"}
    assert load_config(path, env=env, insecure=True).lease_drift_margin_ms == 120
    with pytest.raises(ConfigError, match="^DEX_HA_LEASE_DRIFT_MARGIN_MS: must be an integer"):
        load_config(path, env={"DEX_HA_LEASE_DRIFT_MARGIN_MS": "soon"}, insecure=True)
    with pytest.raises(ConfigError, match="^lease_drift_margin_ms: must be int"):
        load_config(_config_file(tmp_path, TOML.replace("= 80", '= "80"')), env={}, insecure=True)


def _base() -> ServerConfig:
    return load_config(
        None,
        env={
            "DEX_HA_NODE_ID": "n1",
            "DEX_HA_DATA_DIR": "/tmp/x",
            "DEX_HA_HTTP_LISTEN": "127.0.0.1:1",
            "DEX_HA_RAFT_LISTEN": "127.0.0.1:2",
            "DEX_HA_JOIN": "true",
        },
        insecure=True,
    )


@pytest.mark.parametrize(
    "changes,key",
    [
        ({"lease_drift_margin_ms": 500}, "lease_drift_margin_ms"),  # = election_timeout_min_ms
        ({"lease_drift_margin_ms": 501}, "lease_drift_margin_ms"),
        ({"lease_drift_margin_ms": -1}, "lease_drift_margin_ms"),
        ({"raft_heartbeat_interval_ms": 450}, "raft_heartbeat_interval_ms"),  # = 500 - 50
        ({"raft_heartbeat_interval_ms": 0}, "raft_heartbeat_interval_ms"),
        ({"election_timeout_min_ms": 200, "raft_heartbeat_interval_ms": 150}, "raft_heartbeat_interval_ms"),
    ],
)
def test_check_refuses_lease_timing_that_cannot_work(changes: dict, key: str) -> None:
    config = replace(_base(), **changes)
    with pytest.raises(ConfigError, match=f"^{key}: "):
        config.check()


def test_defaults_and_dev_config_pass_the_check(tmp_path: Path) -> None:
    base = _base()
    assert (base.election_timeout_min_ms, base.lease_drift_margin_ms, base.raft_heartbeat_interval_ms) == (500, 50, 50)
    base.check()
    replace(base, raft_heartbeat_interval_ms=449).check()
    dev_config(tmp_path, 8800).check()


def test_the_node_hands_the_margin_to_raft(tmp_path: Path) -> None:
    config = load_config(_config_file(tmp_path), env={}, insecure=True)
    raft = NodeServer._raft_config(SimpleNamespace(config=config, version=own_version()))  # type: ignore[arg-type]
    assert (raft.election_timeout_min_ms, raft.lease_drift_margin_ms) == (600, 80)


def test_dev_takes_its_tunable_settings_from_the_environment_and_nothing_else():
    from dex_ha.server.config import dev_overrides_from_env

    overrides = dev_overrides_from_env(
        {
            "DEX_HA_MAX_INFLIGHT_REQUESTS": "64",
            "DEX_HA_PROBE_LISTEN": "127.0.0.1:9999",
            "DEX_HA_NODE_ID": "not-for-dev",
            "DEX_HA_ELECTION_TIMEOUT_MIN_MS": "5",
        }
    )
    assert overrides == {"max_inflight_requests": 64, "probe_listen": ("127.0.0.1", 9999)}


@pytest.mark.parametrize(
    "env, named",
    [
        ({"DEX_HA_MAX_INFLIGHT_REQUESTS": "many"}, "DEX_HA_MAX_INFLIGHT_REQUESTS"),
        ({"DEX_HA_PROBE_LISTEN": "nowhere"}, "DEX_HA_PROBE_LISTEN"),
    ],
)
def test_dev_refuses_a_bad_setting_from_the_environment_naming_it(env, named):
    from dex_ha.server.config import dev_overrides_from_env

    with pytest.raises(ConfigError, match=named):
        dev_overrides_from_env(env)
