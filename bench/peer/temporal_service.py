"""The Temporal side of bench/peer: a workflow of N activities, its Worker, and the load.

It runs in the peer venv (install.py puts `temporalio` there), in two separate processes:

    python temporal_service.py worker --address 127.0.0.1:7233 --task-queue Q --log STARTS
    python temporal_service.py load --address ... --task-queue Q --concurrency C --steps N --out OUT

- The workflow `Steps` runs N activities one after the other; each is a no-op (it returns a
  small dict, like the no-op `read` tool of dex-ha's bench agent) dispatched by the server
  to the Worker process. A dex-ha step is a task handed out to a Worker, run there and its
  result committed: an activity is the same thing in Temporal.
- When an activity starts, the Worker writes `<workflow id> <index> <CLOCK_MONOTONIC ns>`
  to its log. Activity i starting means the result of activity i-1 is in the workflow's
  history (durable) and the workflow went on: that moment counts as step i-1 completed. The
  last step of a workflow completes when the load sees the workflow's result. So steps are
  counted while workflows are still running: at high concurrency a workflow of 30
  activities outlasts the measured window.
- The load keeps C workflows in flight from the moment it prints `started` until a line
  comes on its stdin; then it terminates the workflows still running (so that they cost
  nothing in the next row) and writes `OUT`: the end time of every finished workflow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

ACTIVITY_TIMEOUT = timedelta(seconds=60)
TERMINATE_PARALLEL = 64
CACHED_WORKFLOWS = 4096  # above the largest concurrency, so no running workflow is evicted and replayed


@workflow.defn(name="Steps")
class Steps:
    @workflow.run
    async def run(self, n: int) -> int:
        for i in range(n):
            await workflow.execute_activity("no_op_step", i, start_to_close_timeout=ACTIVITY_TIMEOUT)
        return n


class StepLog:
    """The activity, bound to the file where it notes when each activity starts."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    @activity.defn(name="no_op_step")
    async def no_op_step(self, index: int) -> dict[str, str]:
        self.out.write(f"{activity.info().workflow_id} {index} {time.monotonic_ns()}\n")
        return {"key": "k"}


async def run_worker(args: argparse.Namespace) -> None:
    client = await Client.connect(args.address)
    with open(args.log, "a", buffering=1) as out:  # line-buffered: the bench reads it after each row
        worker = Worker(
            client,
            task_queue=args.task_queue,
            workflows=[Steps],
            activities=[StepLog(out).no_op_step],
            max_cached_workflows=CACHED_WORKFLOWS,
        )
        print("ready", flush=True)
        await worker.run()


async def run_load(args: argparse.Namespace) -> None:
    """C lanes, each one workflow in flight at a time, until a line comes on stdin."""
    client = await Client.connect(args.address)
    prefix = uuid.uuid4().hex[:8]
    running: dict[str, WorkflowHandle[Any, Any]] = {}
    ends: list[tuple[str, int]] = []
    failed = 0

    async def lane(index: int) -> None:
        nonlocal failed
        turn = 0
        while True:
            workflow_id = f"steps-{prefix}-{index}-{turn}"
            turn += 1
            try:
                handle = await client.start_workflow("Steps", args.steps, id=workflow_id, task_queue=args.task_queue)
                running[workflow_id] = handle
                await handle.result()
                ends.append((workflow_id, time.monotonic_ns()))
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed workflow counts; the lane goes on
                failed += 1
            running.pop(workflow_id, None)

    lanes = [asyncio.create_task(lane(i)) for i in range(args.concurrency)]
    print("started", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for task in lanes:
        task.cancel()
    await asyncio.gather(*lanes, return_exceptions=True)
    await terminate_all(list(running.values()))
    Path(args.out).write_text(json.dumps({"ends": ends, "failed": failed, "terminated": len(running)}))


async def terminate_all(handles: list[WorkflowHandle[Any, Any]]) -> None:
    gate = asyncio.Semaphore(TERMINATE_PARALLEL)

    async def terminate(handle: WorkflowHandle[Any, Any]) -> None:
        async with gate:
            try:
                await handle.terminate("bench window over")
            except Exception:  # it finished meanwhile
                pass

    await asyncio.gather(*(terminate(h) for h in handles))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("worker", "load"):
        p = sub.add_parser(role)
        p.add_argument("--address", required=True)
        p.add_argument("--task-queue", required=True)
    sub.choices["worker"].add_argument("--log", required=True)
    load = sub.choices["load"]
    load.add_argument("--concurrency", type=int, required=True)
    load.add_argument("--steps", type=int, required=True)
    load.add_argument("--out", required=True)
    args = parser.parse_args()
    asyncio.run(run_worker(args) if args.role == "worker" else run_load(args))


if __name__ == "__main__":
    main()
