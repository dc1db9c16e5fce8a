"""deploy/ is true to the code: the configs load and pass check(), and the balancer, systemd,
Kubernetes and Prometheus files name the addresses, routes and timings those configs set."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dex_ha.server.auth import ROLES
from dex_ha.server.config import ConfigError, ServerConfig, load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NODE_TOMLS = sorted(DEPLOY.glob("*.toml"))
SECRETS_ENV = {
    "DEX_HA_CLUSTER_SECRET": "a-cluster-secret-of-32-characters",
    **{f"DEX_HA_TOKENS_{role.upper()}": f"{role}-token-0123456789abcdef" for role in ROLES},
}


def _stop_budget_s(config: ServerConfig) -> float:
    """Seconds a stopping node may need: the drain, then the leadership transfer (≤ 2 × election max)."""
    return (config.drain_timeout_ms + 2 * config.election_timeout_max_ms) / 1000


def _configs() -> list[ServerConfig]:
    return [load_config(path, env=SECRETS_ENV) for path in NODE_TOMLS]


def _host_port(url: str) -> str:
    return urlsplit(url).netloc


# ---------------------------------------------------------------- node configs


def test_there_are_three_node_configs() -> None:
    assert [p.name for p in NODE_TOMLS] == ["node1.toml", "node2.toml", "node3.toml"]


@pytest.mark.parametrize("path", NODE_TOMLS, ids=lambda p: p.name)
def test_node_config_loads_and_passes_check_with_the_secrets_from_the_environment(path: Path) -> None:
    config = load_config(path, env=SECRETS_ENV)  # load_config runs check()
    config.check()
    assert config.durability == "strict" and not config.insecure and config.auth_enabled
    assert config.cluster_secret == SECRETS_ENV["DEX_HA_CLUSTER_SECRET"]
    own = next(p for p in config.peers if p.id == config.node_id)
    assert own.url == config.url  # the address peers and clients are given is this node's own
    assert config.raft_listen is not None  # a cluster node listens for its peers
    assert own.raft_addr[1] == config.raft_listen[1] and config.http_listen[1] == urlsplit(config.url).port


@pytest.mark.parametrize("path", NODE_TOMLS, ids=lambda p: p.name)
def test_node_config_holds_no_secret_so_it_refuses_to_start_without_the_environment(path: Path) -> None:
    with pytest.raises(ConfigError, match="tokens"):
        load_config(path, env={})


def test_the_three_configs_describe_one_cluster() -> None:
    configs = _configs()
    assert len({c.peers for c in configs}) == 1  # the same peer list everywhere
    assert sorted(c.node_id for c in configs) == sorted(p.id for p in configs[0].peers)
    assert len({c.data_dir for c in configs}) == 3 and len({c.url for c in configs}) == 3


# ---------------------------------------------------------------- HAProxy


def _haproxy_servers(text: str, backend: str) -> list[tuple[str, int]]:
    """(address, check port) of each server line of a backend."""
    found = re.search(rf"^backend {backend}\n(.*?)(?=^\S|\Z)", text, re.MULTILINE | re.DOTALL)
    assert found is not None, f"no backend {backend} in haproxy.cfg"
    section = found.group(1)
    return [
        (address, int(port))
        for address, port in re.findall(r"^\s+server \S+ (\S+) check port (\d+)", section, re.MULTILINE)
    ]


def test_haproxy_routes_to_the_node_that_answers_readyz_200_on_its_probe_port() -> None:
    text = (DEPLOY / "haproxy.cfg").read_text()
    assert "option httpchk GET /readyz" in text
    assert "http-check expect status 200" in text
    # Traffic to the API port, checks to the probe port (answered on a thread of its own).
    nodes = sorted((_host_port(c.url), _probe_port(c)) for c in _configs())
    assert sorted(_haproxy_servers(text, "dex_ha_active")) == nodes
    assert sorted(_haproxy_servers(text, "dex_ha_leader")) == nodes


def _probe_port(config: ServerConfig) -> int:
    assert config.probe_listen is not None, f"{config.node_id} has no probe listener"
    return config.probe_listen[1]


def test_haproxy_timeouts_outlast_a_long_poll_and_an_sse_keepalive() -> None:
    from dex_ha.server.api_spec import ROUTES_BY_NAME
    from dex_ha.server.app import SSE_KEEPALIVE_S

    text = (DEPLOY / "haproxy.cfg").read_text()
    poll_body = ROUTES_BY_NAME["worker_poll"].body
    assert poll_body is not None
    max_wait_ms = next(f.max for f in poll_body if f.name == "wait_ms")
    assert max_wait_ms is not None
    max_wait_s = max_wait_ms / 1000
    for name in ("client", "server"):
        timeout = re.search(rf"^\s+timeout {name} (\d+)s$", text, re.MULTILINE)
        assert timeout is not None, f"haproxy.cfg sets no timeout {name}"
        seconds = int(timeout.group(1))
        assert seconds > max_wait_s and seconds > SSE_KEEPALIVE_S


def test_haproxy_accepts_the_config() -> None:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("the haproxy binary is not installed; the syntax check `haproxy -c` needs it")
    result = subprocess.run(
        [haproxy, "-c", "-f", str(DEPLOY / "haproxy.cfg")], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- systemd


class _CaseSensitiveParser(configparser.ConfigParser):
    """Keys are case-sensitive in systemd (ConfigParser lowercases them by default)."""

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def test_systemd_unit_runs_dex_ha_node_and_waits_longer_than_the_drain() -> None:
    unit = _CaseSensitiveParser(strict=False, interpolation=None)
    unit.read(DEPLOY / "dex-ha.service")
    service = unit["Service"]
    assert re.search(r"\bdex-ha node --config /etc/dex-ha/node\.toml$", service["ExecStart"])
    assert service["KillSignal"] == "SIGTERM"
    assert float(service["TimeoutStopSec"]) > max(_stop_budget_s(c) for c in _configs())
    for config in _configs():  # the data dir lies under the unit's writable StateDirectory
        assert config.data_dir.is_relative_to(Path("/var/lib") / service["StateDirectory"])


# ---------------------------------------------------------------- Kubernetes


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict]:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the Kubernetes manifests")
    objects = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def _container(k8s: dict) -> dict:
    return k8s[("StatefulSet", "dex-ha")]["spec"]["template"]["spec"]["containers"][0]


def _pod_env(k8s: dict, pod_name: str) -> dict[str, str]:
    """The DEX_HA_* environment of one pod: plain values with $(POD_NAME) filled in, secrets from SECRETS_ENV."""
    env = {}
    for var in _container(k8s)["env"]:
        if not var["name"].startswith("DEX_HA_"):
            continue
        if "value" in var:
            env[var["name"]] = var["value"].replace("$(POD_NAME)", pod_name)
        else:
            env[var["name"]] = SECRETS_ENV[var["name"]]
    return env


def test_k8s_config_loads_for_every_pod_of_the_statefulset(k8s: dict, tmp_path: Path) -> None:
    statefulset = k8s[("StatefulSet", "dex-ha")]
    toml_text = k8s[("ConfigMap", "dex-ha-config")]["data"]["node.toml"]
    config_path = tmp_path / "node.toml"
    config_path.write_text(toml_text)
    replicas = statefulset["spec"]["replicas"]
    assert replicas == 3
    for ordinal in range(replicas):
        pod = f"dex-ha-{ordinal}"
        config = load_config(config_path, env=_pod_env(k8s, pod))  # runs check()
        assert config.node_id == pod
        assert next(p.url for p in config.peers if p.id == pod) == config.url
    # Every secret the pods read is one the config uses (a typo would be silently ignored).
    secret_names = {v["name"] for v in _container(k8s)["env"] if "valueFrom" in v and "secretKeyRef" in v["valueFrom"]}
    assert secret_names == set(SECRETS_ENV)
    assert set(tomllib.loads(toml_text)) >= {"data_dir", "http_listen", "raft_listen", "peers"}


def test_k8s_probes_and_grace_period_match_the_node(k8s: dict, tmp_path: Path) -> None:
    container = _container(k8s)
    pod_spec = k8s[("StatefulSet", "dex-ha")]["spec"]["template"]["spec"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "probes"}
    config_path = tmp_path / "node.toml"
    config_path.write_text(k8s[("ConfigMap", "dex-ha-config")]["data"]["node.toml"])
    config = load_config(config_path, env=_pod_env(k8s, "dex-ha-0"))
    assert pod_spec["terminationGracePeriodSeconds"] > _stop_budget_s(config)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert config.probe_listen is not None and config.raft_listen is not None
    assert ports == {"http": config.http_listen[1], "raft": config.raft_listen[1], "probes": config.probe_listen[1]}
    assert any(config.data_dir.is_relative_to(m["mountPath"]) for m in container["volumeMounts"] if m["name"] == "data")


def test_k8s_services_route_clients_to_ready_pods_and_peers_to_every_pod(k8s: dict) -> None:
    statefulset = k8s[("StatefulSet", "dex-ha")]
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    client_service = k8s[("Service", "dex-ha")]["spec"]
    peer_service = k8s[("Service", "dex-ha-peers")]["spec"]
    for service in (client_service, peer_service):
        assert service["selector"].items() <= pod_labels.items()
    # Clients: ready pods only, i.e. the active node (/readyz is the readiness probe).
    assert not client_service.get("publishNotReadyAddresses", False)
    # Peers: standbys are never ready, yet must resolve each other.
    assert peer_service["clusterIP"] == "None" and peer_service["publishNotReadyAddresses"] is True
    assert statefulset["spec"]["serviceName"] == "dex-ha-peers"
    # A node is ready only with a quorum: the pods must start together.
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    peers = tomllib.loads(k8s[("ConfigMap", "dex-ha-config")]["data"]["node.toml"])["peers"]
    namespace = statefulset["metadata"]["namespace"]
    for peer in peers:
        assert peer["raft_addr"].startswith(f"{peer['id']}.dex-ha-peers.{namespace}.svc")


# ---------------------------------------------------------------- Prometheus


def test_prometheus_scrapes_metrics_on_every_node() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads prometheus.yml")
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "dex-ha")
    assert job["metrics_path"] == "/metrics"
    targets = sorted(t for group in job["static_configs"] for t in group["targets"])
    assert targets == sorted(_host_port(c.url) for c in _configs())
