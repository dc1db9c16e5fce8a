"""The Restate side of bench/peer: a Python service whose handler runs N durable steps.

`Steps/run` takes N and runs N `ctx.run` steps one after the other. Each step is a no-op
action (it returns a small dict, like the no-op `read` tool of dex-ha's bench agent) whose
result Restate journals before `await ctx.run` returns, so one step = run + journal append
(replicated and fsynced per the server's settings) + the server's ack.

The handler answers the CLOCK_MONOTONIC time (ns) at which each step's `await` returned:
the same clock in every process of the machine, so the load generator puts the steps on
its own timeline, counts those inside its window and takes per-step gaps, the way
bench/steps_bench.py does with the Worker's completion lines. (A replayed invocation would
answer the times of its replay; none are replayed in a run without faults.)

It runs under hypercorn (HTTP/2 cleartext, so Restate streams the journal both ways):

    hypercorn --bind 127.0.0.1:9080 bench.peer.restate_service:app
"""

from __future__ import annotations

import time

import restate

steps = restate.Service("Steps")


async def no_op_step() -> dict[str, str]:
    return {"key": "k"}


@steps.handler()
async def run(ctx: restate.Context, n: int) -> list[int]:
    done_at_ns: list[int] = []
    for i in range(n):
        await ctx.run(f"step-{i}", no_op_step)
        done_at_ns.append(time.monotonic_ns())
    return done_at_ns


app = restate.app(services=[steps])
