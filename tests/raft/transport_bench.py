"""Measure RaftTransport throughput over loopback: python -m tests.raft.transport_bench.

Sends APP messages carrying one 256-byte entry from one node to another over a single
connection and prints messages/s (end to end: encode, batch, TCP, decode, callback),
with and without the cluster secret, and with uvloop when installed. Not a test.
"""

from __future__ import annotations

import asyncio
import sys
import time

from dex_ha.raft.transport import RaftTransport
from dex_ha.raft.types import Entry, Message, MessageType

N = 200_000
SECRET = b"bench-secret-0123456789"


async def run(secret: bytes | None) -> float:
    done = asyncio.Event()
    count = 0

    def on_message(_: Message) -> None:
        nonlocal count
        count += 1
        if count == N:
            done.set()

    a = RaftTransport("a", ("127.0.0.1", 0), {}, lambda m: None, secret=secret)
    b = RaftTransport("b", ("127.0.0.1", 0), {}, on_message, secret=secret)
    await a.start()
    await b.start()
    a.set_peers({"b": ("127.0.0.1", b.port)})
    a.max_queue_messages = 1 << 30  # measure the pipe, not the drop policy
    entry = [Entry(1, 1, data=b"e" * 256)]
    msgs = [Message(MessageType.APP, "b", "a", term=1, index=i, entries=entry) for i in range(N)]
    t0 = time.perf_counter()
    for i in range(0, N, 1000):  # the node loop hands over messages in bursts
        for m in msgs[i:i + 1000]:
            a.send(m)
        await asyncio.sleep(0)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - t0
    stats = a.stats
    await a.stop()
    await b.stop()
    print(f"  frames/write {stats.frames_sent / max(stats.writes, 1):.0f}, "
          f"{stats.bytes_sent / elapsed / 1e6:.1f} MB/s", file=sys.stderr)
    return N / elapsed


def main() -> None:
    loops = [("asyncio", asyncio.new_event_loop)]
    try:
        import uvloop
        loops.append(("uvloop", uvloop.new_event_loop))
    except ImportError:
        pass
    for name, factory in loops:
        for secret in (None, SECRET):
            loop = factory()
            rate = loop.run_until_complete(run(secret))
            loop.close()
            print(f"{name:8} secret={'yes' if secret else 'no ':3}  {rate:10.0f} messages/s (256-byte APP)")


if __name__ == "__main__":
    main()
