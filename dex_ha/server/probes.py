"""The probe listener: `/livez` and `/readyz` on a port and a thread of their own.

Why: a load balancer (HAProxy checks every 200 ms with a short timeout) or a kubelet takes
a node out of service when its probe does not answer in time. On the API port a probe waits
in the same event loop as every other request; under a flood of clients it waits behind
all of them, times out, and the balancer drops the active node: an outage caused by load.
Here probes are answered by a small HTTP server on its own thread and event loop, from the
Raft view and a few plain attributes (`NodeServer.readiness`), never behind API requests.
(etcd separates its health and metrics endpoints onto another listener for the same
reason.) The API port still serves `/livez` and `/readyz` too.

Set `probe_listen` (e.g. "0.0.0.0:8802") and point the balancer's checks and the kubelet's
probes at it; `deploy/` does.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from dex_ha.raft.loop_thread import LoopThread
from dex_ha.server.http_limits import PROBE_LISTENER_LIMITS, GuardedSite, name_the_server
from dex_ha.server.readiness import Readiness

log = logging.getLogger("dex_ha.server.probes")

Liveness = Callable[[], dict[str, Any]]


class ProbeServer:
    """Serves GET /livez and GET /readyz on `sock` from a thread of its own."""

    def __init__(self, sock: socket.socket, liveness: Liveness, readiness: Callable[[], Readiness]) -> None:
        self._sock = sock
        self._liveness = liveness
        self._readiness = readiness
        self._thread = LoopThread("probes")
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    async def start(self) -> None:
        await self._thread.start(self._serve)

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/livez", self._livez)
        app.router.add_get("/readyz", self._readyz)
        app.on_response_prepare.append(name_the_server)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, **PROBE_LISTENER_LIMITS.handler_args())
        await self._runner.setup()
        # Capped, with a short header timeout: clients of this port cannot take the node's descriptors.
        await GuardedSite(self._runner, self._sock, PROBE_LISTENER_LIMITS, metrics=None).start()

    async def stop(self) -> None:
        await self._thread.stop(self._runner.cleanup() if self._runner is not None else None)

    async def _livez(self, request: web.Request) -> web.Response:
        return _json(200, self._liveness())

    async def _readyz(self, request: web.Request) -> web.Response:
        readiness = self._readiness()
        return _json(readiness.http_status, readiness.body())


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, text=json.dumps(body, separators=(",", ":")), content_type="application/json")
