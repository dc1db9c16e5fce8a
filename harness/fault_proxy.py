"""A fault-injecting TCP proxy for the Raft links of a local cluster: one proxy per
directed link, so a test can cut A→B and B→A independently.

Why per directed link: the Raft transport (dex_ha/raft/transport.py) has each node dial
every peer once and send on that connection only; it receives on the connections its
peers dialed. A's messages to B travel on the connection A dialed to B's address, which
in A's config is the proxy of the link A→B. (The handshake answers of B travel back on
that same connection, so a cut link carries nothing either way, as a real path loss would.)

A cut link behaves like a black hole, not like a refused port:
- a new connection is accepted and then held: nothing is forwarded, nothing answered
  (the dialer's handshake times out, as it would when SYNs vanish);
- an open connection stops forwarding: the bytes read from either side are dropped.
Healing the link closes every connection it held (their byte streams have holes, so the
frames' MACs would fail anyway) and forwards new connections again: the nodes redial.
`cut(..., close=True)` instead closes the open connections at once (a reset).

A delayed link (`delay(pairs, seconds)`) forwards what it reads `seconds` later, in order
and without loss: a slow path, not a lossy one. Bytes that arrive while a chunk waits go
out with the next chunk, so a byte is delayed by between one and two times `seconds`.
`delay(pairs, 0)` makes the links fast again; a cut and a delay are independent.

All links of a mesh run on one event loop on a thread of its own (LoopThread, as the
node's Raft loop does), so a busy test loop cannot delay Raft heartbeats through the
proxy. The listening sockets are bound when the mesh is made, so their ports can be
written into the nodes' configs before anything starts.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from dex_ha.raft.loop_thread import LoopThread

HOST = "127.0.0.1"
READ_BYTES = 64 << 10
CONNECT_TIMEOUT_S = 2.0


@dataclass(eq=False)
class _Conn:
    """One proxied connection: the dialer's side and (while forwarding) the target's side."""

    downstream: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    held: bool = False  # true once the link was cut while it lived: forwards nothing more
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for writer in (self.downstream, self.upstream):
            if writer is not None:
                writer.close()
        for task in self.tasks:
            task.cancel()


class LinkProxy:
    """The proxy of one directed link: listens on `port`, forwards to `target`."""

    def __init__(self, name: str, target: tuple[str, int]) -> None:
        self.name = name
        self.target = target
        self.cut = False
        self.delay_s = 0.0  # how long each chunk read waits before it is forwarded
        self._sock = socket.create_server((HOST, 0))
        self.port: int = self._sock.getsockname()[1]
        self._conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None
        self.connections_accepted = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, sock=self._sock)

    async def stop(self) -> None:
        for conn in list(self._conns):
            conn.close()
        if self._server is not None:
            self._server.close()

    def close_socket(self) -> None:
        self._sock.close()

    def set_cut(self, cut: bool, close: bool = False) -> None:
        """Cut or heal the link (see the module docstring); on this proxy's loop only."""
        self.cut = cut
        for conn in list(self._conns):
            if cut and close or not cut and conn.held:
                conn.close()
                self._conns.discard(conn)
            elif cut:
                conn.held = True

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        conn = _Conn(writer, held=self.cut)
        self._conns.add(conn)
        try:
            if conn.held:
                await self._drain_until_closed(reader, conn)  # a black hole: read, drop, answer nothing
                return
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    up_reader, conn.upstream = await asyncio.open_connection(*self.target)
            except (OSError, TimeoutError):
                return  # the target is down: the dialer sees its connection close, as with a refused port
            conn.tasks = [
                asyncio.create_task(self._pipe(reader, conn.upstream, conn)),
                asyncio.create_task(self._pipe(up_reader, writer, conn)),
            ]
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        finally:
            conn.close()
            self._conns.discard(conn)

    async def _drain_until_closed(self, reader: asyncio.StreamReader, conn: _Conn) -> None:
        try:
            while await reader.read(READ_BYTES):
                pass
        except OSError:
            pass

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn) -> None:
        """Copy until either side closes; once the connection is held, drop what is read."""
        try:
            while data := await reader.read(READ_BYTES):
                if self.delay_s and not conn.held:
                    await asyncio.sleep(self.delay_s)
                if conn.held:
                    continue
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            if not conn.held:
                conn.close()  # one side closed: close the other, as TCP would


class ProxyMesh:
    """A proxy for every directed link between the nodes of `raft_ports` (node id -> port)."""

    def __init__(self, raft_ports: Mapping[str, int]) -> None:
        self.nodes = list(raft_ports)
        self.links = {
            (src, dst): LinkProxy(f"{src}->{dst}", (HOST, raft_ports[dst]))
            for src in self.nodes
            for dst in self.nodes
            if src != dst
        }
        self._thread = LoopThread("fault-proxy")

    def address(self, src: str, dst: str) -> str:
        """The Raft address `src` must dial to reach `dst` through the link's proxy."""
        return f"{HOST}:{self.links[(src, dst)].port}"

    async def start(self) -> None:
        async def start_links() -> None:
            for link in self.links.values():
                await link.start()

        await self._thread.start(start_links)

    async def stop(self) -> None:
        if not self._thread.running:  # never started: only the bound sockets to let go
            for link in self.links.values():
                link.close_socket()
            return

        async def stop_links() -> None:
            for link in self.links.values():
                await link.stop()
            # The connections' tasks end once cancelled; let them, before the loop closes.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        await self._thread.stop(stop_links())

    async def _each_link(self, pairs: Iterable[tuple[str, str]], change: Callable[[LinkProxy], None]) -> None:
        links = [self.links[pair] for pair in pairs]

        def apply() -> None:
            for link in links:
                change(link)

        await self._thread.call(apply)  # one loop turn: every link changes at the same instant

    async def _set(self, pairs: Iterable[tuple[str, str]], cut: bool, close: bool = False) -> None:
        await self._each_link(pairs, lambda link: link.set_cut(cut, close))

    async def cut(self, pairs: Iterable[tuple[str, str]], close: bool = False) -> None:
        await self._set(pairs, True, close)

    async def heal(self, pairs: Iterable[tuple[str, str]] | None = None) -> None:
        await self._set(self.links if pairs is None else pairs, False)

    async def delay(self, pairs: Iterable[tuple[str, str]], seconds: float) -> None:
        """Forward what the links carry `seconds` late (0: without delay again)."""

        def set_delay(link: LinkProxy) -> None:
            link.delay_s = seconds

        await self._each_link(pairs, set_delay)

    def outbound(self, node: str) -> list[tuple[str, str]]:
        """The links `node` sends on."""
        return [(node, other) for other in self.nodes if other != node]

    def inbound(self, node: str) -> list[tuple[str, str]]:
        """The links `node` receives on."""
        return [(other, node) for other in self.nodes if other != node]

    async def isolate(self, node: str, close: bool = False) -> None:
        """Cut `node` off from every peer, both ways (`close`: reset its open connections
        rather than hold them)."""
        await self.cut(self.outbound(node) + self.inbound(node), close)
