"""Whether a node is ready (its `/readyz` answers 200), and waiting until one is: the one
readiness wait of the tests and the benches, polled by `harness.waiting.eventually`.

(`harness/readiness_record.py` records readiness over time; this module only asks.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import aiohttp

from harness.waiting import eventually

# One /readyz request may take this long before the node counts as not ready this round.
REQUEST_TIMEOUT_S = 1.0


async def answers_ready(http: aiohttp.ClientSession, url: str, timeout_s: float = REQUEST_TIMEOUT_S) -> bool:
    """Whether `url` + /readyz answers 200 now (one try: unreachable or slow is not ready)."""
    try:
        async with http.get(url + "/readyz", timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            return response.status == 200
    except (aiohttp.ClientError, OSError, TimeoutError):
        return False


async def wait_ready(
    urls: Sequence[str],
    deadline_s: float,
    *,
    still_running: Callable[[], None] | None = None,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> str:
    """Poll the nodes of `urls` until one answers /readyz 200, and return its URL;
    AssertionError after `deadline_s`. `still_running` is called every round and raises
    when waiting on is pointless (the node's process exited)."""
    async with aiohttp.ClientSession() as http:

        async def first_ready() -> str | None:
            if still_running is not None:
                still_running()
            for url in urls:
                if await answers_ready(http, url, request_timeout_s):
                    return url
            return None

        ready: str = await eventually(
            first_ready, what=f"/readyz 200 from one of {', '.join(urls)}", deadline_s=deadline_s
        )
        return ready
