"""deploy/Dockerfile and the Kubernetes manifests agree, without building anything (the build
itself: test_container_image.py, DEX_HA_LONG=1): the image's user is the pods' runAsUser and
fsGroup, its data volume is where the pods mount theirs and where the node config keeps
data_dir, and its health check asks /livez on a port the node listens on."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def instructions() -> dict[str, list[str]]:
    """Dockerfile instruction -> its arguments, for every occurrence (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.setdefault(word.upper(), []).append(rest.strip())
    return found


def statefulset() -> dict:
    return next(
        d for d in yaml.safe_load_all((DEPLOY / "k8s" / "statefulset.yaml").read_text()) if d["kind"] == "StatefulSet"
    )


def test_the_image_user_is_the_pods_user_and_not_root():
    user = instructions()["USER"][-1]
    uid, gid = (int(part) for part in user.split(":"))
    assert uid != 0 and gid != 0
    security = statefulset()["spec"]["template"]["spec"]["securityContext"]
    assert (security["runAsUser"], security["fsGroup"], security["runAsNonRoot"]) == (uid, gid, True)


def test_the_data_volume_is_where_the_pods_mount_theirs_and_keep_data_dir():
    (volume,) = json.loads(instructions()["VOLUME"][-1])
    container = statefulset()["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "data", "mountPath": volume} in container["volumeMounts"]
    config = next(
        d for d in yaml.safe_load_all((DEPLOY / "k8s" / "config.yaml").read_text()) if d["kind"] == "ConfigMap"
    )
    data_dir = Path(tomllib.loads(config["data"]["node.toml"])["data_dir"])
    assert data_dir.is_relative_to(volume)


def test_the_health_check_asks_livez_on_the_api_port_the_node_listens_on():
    found = instructions()
    env = " ".join(found["ENV"])
    url = re.search(r"DEX_HA_HEALTHCHECK_URL=(\S+)", env).group(1)
    assert url.endswith("/livez")
    assert "DEX_HA_HEALTHCHECK_URL" in found["HEALTHCHECK"][-1]
    port = int(re.search(r":(\d+)/", url).group(1))
    config = next(
        d for d in yaml.safe_load_all((DEPLOY / "k8s" / "config.yaml").read_text()) if d["kind"] == "ConfigMap"
    )
    assert tomllib.loads(config["data"]["node.toml"])["http_listen"].endswith(f":{port}")
    assert json.loads(found["CMD"][-1]) == ["node", "--config", "/etc/dex-ha/node.toml"]
    assert json.loads(found["ENTRYPOINT"][-1]) == ["dex-ha"]
