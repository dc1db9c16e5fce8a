"""Measure RaftTransport throughput over loopback: python -m bench.transport_bench.

Sends messages from one node to another over a single connection and prints messages/s
(end to end: encode, tag, batch, TCP, check, decode, callback), for a 256-byte APP (one
entry) and for a HEARTBEAT (the smallest frame, where a tag costs the most), with and
without the cluster secret, with asyncio and with uvloop when installed. Each figure is
the best of --repeat runs: the machine is shared, and the best run is the least disturbed.
Both nodes run in this one process, on one core. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from dex_ha.raft.transport import RaftTransport
from dex_ha.raft.types import Entry, Message, MessageType

SECRET = b"bench-secret-0123456789"


def messages(kind: str, n: int) -> list[Message]:
    if kind == "app":
        entry = [Entry(1, 1, data=b"e" * 256)]
        return [Message(MessageType.APP, "b", "a", term=1, index=i, entries=entry) for i in range(n)]
    return [Message(MessageType.HEARTBEAT, "b", "a", term=1, commit=i, context=i) for i in range(n)]


async def run(kind: str, n: int, secret: bytes | None) -> float:
    done = asyncio.Event()
    count = 0

    def on_message(_: Message) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    a = RaftTransport("a", ("127.0.0.1", 0), {}, lambda m: None, secret=secret)
    b = RaftTransport("b", ("127.0.0.1", 0), {}, on_message, secret=secret)
    await a.start()
    await b.start()
    assert b.port is not None  # b listens: start() bound its port
    a.set_peers({"b": ("127.0.0.1", b.port)})
    a.max_queue_messages = 1 << 30  # measure the pipe, not the drop policy
    msgs = messages(kind, n)
    t0 = time.perf_counter()
    for i in range(0, n, 1000):  # the node loop hands over messages in bursts
        for m in msgs[i : i + 1000]:
            a.send(m)
        await asyncio.sleep(0)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - t0
    await a.stop()
    await b.stop()
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=100_000, help="messages per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure; the best is printed")
    args = parser.parse_args()
    loops = [("asyncio", asyncio.new_event_loop)]
    try:
        import uvloop

        loops.append(("uvloop", uvloop.new_event_loop))
    except ImportError:
        pass
    for name, factory in loops:
        for kind in ("app", "heartbeat"):
            for secret in (None, SECRET):
                rates = []
                for _ in range(args.repeat):
                    loop = factory()
                    rates.append(loop.run_until_complete(run(kind, args.count, secret)))
                    loop.close()
                print(
                    f"{name:8} {kind:9} secret={'yes' if secret else 'no ':3}  {max(rates):9.0f} messages/s "
                    f"(best of {args.repeat}; median {sorted(rates)[len(rates) // 2]:.0f})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
