"""HAProxy with the shipped deploy/haproxy.cfg, pointed at a local cluster: the
readiness-following address that clients and Workers use in production."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

from harness.ports import free_ports
from harness.processes import stop

REPO = Path(__file__).resolve().parents[1]
SHIPPED_CONFIG = REPO / "deploy" / "haproxy.cfg"


def haproxy_binary() -> str | None:
    return shutil.which("haproxy")


class HAProxyProcess:
    def __init__(self, node_ports: dict[str, int], probe_ports: dict[str, int], work_dir: Path) -> None:
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = work_dir / "haproxy.cfg"
        self.log_path = work_dir / "haproxy.log"
        self.config_path.write_text(self._config(node_ports, probe_ports))
        self.proc: subprocess.Popen[bytes] | None = None

    def _config(self, node_ports: dict[str, int], probe_ports: dict[str, int]) -> str:
        """The shipped file with loopback addresses: what is tested is what we ship."""
        text = SHIPPED_CONFIG.read_text().replace("bind :8800", f"bind 127.0.0.1:{self.port}")
        for i, (node_id, port) in enumerate(sorted(node_ports.items()), start=1):
            text, n = re.subn(
                rf"server {node_id} 10\.0\.0\.{i}:8801 check port 8802",
                f"server {node_id} 127.0.0.1:{port} check port {probe_ports[node_id]}",
                text,
            )
            assert n == 2, f"deploy/haproxy.cfg has no server line for {node_id} (checks on port 8802) in both backends"
        return text

    def start(self) -> None:
        binary = haproxy_binary()
        assert binary is not None
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [binary, "-db", "-f", str(self.config_path)], stdout=log, stderr=subprocess.STDOUT
            )

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, timeout=10)


@contextlib.contextmanager
def haproxy_in_front_of(
    urls: Mapping[str, str], probe_ports: Mapping[str, int], work_dir: Path
) -> Iterator[HAProxyProcess]:
    """HAProxy running in front of the nodes of `urls` (node id -> http://127.0.0.1:PORT)
    for the body of the block, stopped by pid afterwards."""
    ports = {node_id: int(url.rsplit(":", 1)[1]) for node_id, url in urls.items()}
    proxy = HAProxyProcess(ports, dict(probe_ports), work_dir)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
