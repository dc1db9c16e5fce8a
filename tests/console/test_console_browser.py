"""The web console at /ui in a real browser (Debian's chromium, driven by Playwright).

Against real processes: a `dex-ha dev` node with a Worker process (approve a call, watch
streamed text arrive, reconcile a call whose Worker was SIGKILLed), and a three-node
`dex-ha cluster up` (the cluster view follows a step down and a SIGKILL of the active
node). The evidence comes from outside the browser too: the Worker's ledger and the API.
Screenshots go to each test's tmp_path.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dex_ha.client import DexClient, DexError
from harness.cluster_process import LocalCluster
from harness.dev_process import DevProcess, running_dev
from harness.processes import stop
from harness.waiting import eventually
from harness.worker_process import WorkerOptions, start_worker
from tests.console.console_worker import AGENT, STORY
from tests.crash.ledger import Ledger

CHROMIUM = Path("/usr/bin/chromium")
UI_TIMEOUT_MS = 15_000  # every wait on the page has this deadline

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed (the dev extra)")
if not CHROMIUM.exists():
    pytest.skip(
        f"no chromium at {CHROMIUM}: install it with `apt-get install -y chromium` "
        "(scripts/test does when it runs as root)",
        allow_module_level=True,
    )
expect = playwright_api.expect
expect.set_options(timeout=UI_TIMEOUT_MS)


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[object]:
    async with playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(UI_TIMEOUT_MS)
            yield page
        finally:
            await browser.close()


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevProcess]:
    """A `dex-ha dev` node (no tokens) whose killed Worker's attempt fails in ~2 s."""
    async with running_dev(tmp_path, extra_env={"DEX_HA_HEARTBEAT_TIMEOUT_MS": "2000"}) as node:
        yield node


@contextlib.contextmanager
def worker_process(url: str, ledger: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    options = WorkerOptions(drain_timeout_s=0.1, backoff_max_s=0.2)
    proc = start_worker("tests.console.console_worker", url, ["--ledger", str(ledger)], options=options, log=log)
    try:
        yield proc
    finally:
        stop(proc, timeout=5)


async def open_console(page, url: str, fragment: str = "", token: str | None = None) -> None:
    """Load /ui on `url`; when the node has tokens, enter the token the page asks for."""
    await page.goto(f"{url}/ui{fragment}")
    if token is not None:
        await expect(page.get_by_test_id("token-dialog")).to_be_visible()
        await page.get_by_test_id("token-input").fill(token)
        await page.get_by_test_id("token-save").click()


async def confirm(page) -> None:
    await page.get_by_test_id("confirm-yes").click()


async def call_of(client: DexClient, session_id: str, name: str) -> dict[str, Any] | None:
    """The JSON of the session's first call of tool `name` (the page shows its fields by name)."""
    snapshot = await client.get_session(session_id)
    return next((c.raw for c in snapshot.tool_calls if c.name == name), None)


# ---------------------------------------------------------------- sessions, on `dex-ha dev`


async def test_approve_stream_and_reconcile_from_the_console(dev: DevProcess, page, tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.db")
    with worker_process(dev.url, tmp_path / "ledger.db", tmp_path / "worker.log") as worker:
        async with DexClient(dev.url) as client:
            await client.create_session(AGENT, "refund-1")
            await client.send_message("refund-1", "refund order A17")
            await eventually(lambda: _pending_approval(client, "refund-1"), "the refund to wait for approval")

            # The list, filtered to sessions waiting for approval, shows it; its page approves it.
            await open_console(page, dev.url, "#/sessions?awaiting_approval=true")
            await expect(page.locator("[data-session=refund-1]")).to_be_visible()
            await page.get_by_role("link", name="refund-1").click()
            refund = await call_of(client, "refund-1", "refund")
            assert refund is not None
            await page.get_by_test_id(f"approve-{refund['call_id']}").click()
            await confirm(page)
            await expect(page.get_by_test_id(f"call-status-{refund['call_id']}")).to_have_text("succeeded")
            await expect(page.get_by_test_id("session-status")).to_contain_text("idle")
            await page.screenshot(path=str(tmp_path / "approved.png"), full_page=True)
            assert [run.key for run in ledger.runs("tool", "refund")] == ["refund-1:" + refund["call_id"]]

            # A message sent from the console: the model's words arrive live over SSE.
            await page.get_by_test_id("message-text").fill("hello")
            await page.get_by_test_id("send-message").click()
            await expect(page.get_by_test_id("live-text").last).to_have_text("Hello from the console agent.")

            # A write whose Worker is SIGKILLed mid-call ends as outcome_unknown ...
            await client.create_session(AGENT, "charge-1")
            await client.send_message("charge-1", "charge order B9")
            await eventually(lambda: ledger.count("tool", "charge") == 1, "the charge tool to start")
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
            await eventually(
                lambda: _call_status(client, "charge-1", "charge", "outcome_unknown"),
                "the killed charge call to be outcome_unknown",
                deadline_s=20,
            )

            # ... and the operator finds it by the filter and reconciles it with a note.
            await page.goto(f"{dev.url}/ui#/sessions?outcome_unknown=true")
            await expect(page.locator("[data-session]")).to_have_count(1)
            await page.get_by_role("link", name="charge-1").click()
            charge = await call_of(client, "charge-1", "charge")
            assert charge is not None
            call_id = charge["call_id"]
            assert charge["attempt_progress"] == "NOT_COMPLETED"
            await expect(page.locator(f"[data-step='{charge['steps'][0]['step_id']}'] .attempt")).to_contain_text(
                f"charge-1:{call_id}"
            )
            await page.get_by_test_id(f"reconcile-note-{call_id}").fill("charged once: seen in the PSP dashboard")
            await page.get_by_test_id(f"reconcile-{call_id}").click()
            await confirm(page)
            await expect(page.get_by_test_id(f"call-status-{call_id}")).to_have_text("succeeded")
            await page.screenshot(path=str(tmp_path / "reconciled.png"), full_page=True)
            await expect(page.locator("main")).not_to_contain_text("null")  # nothing empty rendered as text
            settled = await call_of(client, "charge-1", "charge")
            assert settled is not None
            assert settled["output"] == "charged once: seen in the PSP dashboard" and settled["reconciled_at"]
            assert ledger.count("tool", "charge") == 1  # never run again


async def _pending_approval(client: DexClient, session_id: str) -> bool:
    return bool((await client.get_session(session_id)).pending_approvals)


async def _call_status(client: DexClient, session_id: str, name: str, status: str) -> bool:
    call = await call_of(client, session_id, name)
    return call is not None and call["status"] == status


async def test_the_session_page_catches_up_with_events_that_arrive_during_a_read(dev: DevProcess, page, tmp_path: Path):
    """An event that arrives while the page reads the session must lead to another read.

    Every read of the session is held until the turn has ended, so the first answer the page
    gets says "running" while the turn's later events reach it during that read. A page that
    drops those events stays at "running" for good.
    """
    with worker_process(dev.url, tmp_path / "ledger.db", tmp_path / "worker.log"):
        async with DexClient(dev.url) as client:
            await client.create_session(AGENT, "story-1")
            await open_console(page, dev.url, "#/session/story-1")
            await expect(page.get_by_test_id("session-status")).to_contain_text("idle")
            stale_answers: list[str] = []

            async def hold_until_the_turn_ends(route) -> None:
                answer = await route.fetch()
                status = (await answer.json())["status"]
                if status != "idle":
                    stale_answers.append(status)
                    await eventually(lambda: _status_is(client, "story-1", "idle"), "the turn to end")
                await route.fulfill(response=answer)

            await page.route("**/v1/sessions/story-1", hold_until_the_turn_ends)
            await client.send_message("story-1", "story please")
            await expect(page.get_by_test_id("live-text").last).to_have_text(STORY)
            await expect(page.get_by_test_id("session-status")).to_contain_text("idle")
            assert stale_answers, "no read saw the turn running: the test did not exercise the race"


async def _status_is(client: DexClient, session_id: str, status: str) -> bool:
    return (await client.get_session(session_id)).status == status


async def test_streamed_text_of_a_failed_attempt_is_marked_dropped(dev: DevProcess, page):
    """The console's LiveText, run in the browser, keeps the rules of StreamText."""
    await open_console(page, dev.url)
    result = await page.evaluate("""() => {
        const live = new LiveText();
        live.delta("st", 1, "Hel");
        live.failed("st", 1);
        live.delta("st", 1, "late");   // a late delta of the failed attempt: ignored
        live.delta("st", 2, "Hello");
        live.delta("st", 2, " world");
        live.delta("st", 3, "again");  // a newer attempt starts afresh
        live.delta("st", 2, "old");    // overtaken: ignored
        const step = live.steps.get("st");
        return {attempt: step.attempt, text: step.pieces.join(""), dropped: step.dropped};
    }""")
    assert result == {
        "attempt": 3,
        "text": "again",
        "dropped": [{"attempt": 1, "text": "Hel"}, {"attempt": 2, "text": "Hello world"}],
    }


async def test_the_namespace_field_chooses_whose_sessions_the_page_shows(dev: DevProcess, page):
    async with DexClient(dev.url, namespace="team-x") as client:
        await client.create_session("agent-x", session_id="s-in-team-x")
    await open_console(page, dev.url, "#/sessions")
    await expect(page.get_by_test_id("sessions-table")).not_to_contain_text("s-in-team-x")
    await page.get_by_test_id("namespace-input").fill("team-x")
    await page.get_by_test_id("namespace-input").press("Enter")
    await expect(page.get_by_test_id("sessions-table")).to_contain_text("s-in-team-x")
    await page.get_by_text("s-in-team-x").click()
    await expect(page.get_by_test_id("session-status")).to_contain_text("namespace team-x")


async def test_the_page_loads_without_a_token_and_ships_no_outside_resource(dev: DevProcess):
    async with aiohttp.ClientSession() as http:
        async with http.get(dev.url + "/ui") as resp:
            html = await resp.text()
            assert resp.status == 200 and resp.content_type == "text/html"
            assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        for name in ("console.js", "console.css"):
            async with http.get(f"{dev.url}/ui/static/{name}") as resp:
                assert resp.status == 200
        async with http.get(dev.url + "/ui/static/..%2Fapp.py") as resp:
            assert resp.status == 404
    assert "http://" not in html and "https://" not in html


async def test_a_finished_sessions_page_shows_the_whole_conversation_after_a_reload(
    dev: DevProcess, page, tmp_path: Path
):
    """The page is built from the stored session, not from the stream it saw: loaded (and
    reloaded) after both turns ended, it shows what the user said, the model's answers, the
    tool's input and output, and every turn with its steps."""
    with worker_process(dev.url, tmp_path / "ledger.db", tmp_path / "worker.log"):
        async with DexClient(dev.url) as client:
            await client.create_session(AGENT, "whole-1")
            await client.send_message("whole-1", "refund order A17")
            await eventually(lambda: _pending_approval(client, "whole-1"), "the refund to wait for approval")
            refund = await call_of(client, "whole-1", "refund")
            assert refund is not None
            await client.approve("whole-1", refund["call_id"])
            await client.wait_until_idle("whole-1", timeout_s=20)
            await client.send_message("whole-1", "hello there")
            await client.wait_until_idle("whole-1", timeout_s=20)

    await open_console(page, dev.url, "#/session/whole-1")
    await page.reload()
    conversation = page.get_by_test_id("conversation")
    users = conversation.get_by_test_id("msg-user").locator(".text")
    await expect(users).to_have_text(["refund order A17", "hello there"])
    answers = conversation.get_by_test_id("msg-assistant")
    await expect(answers).to_have_count(3)
    await expect(answers.nth(0)).to_contain_text("I will refund order A17 once you approve.")
    await expect(answers.nth(0).get_by_test_id("msg-tool-call")).to_contain_text(
        'refund({"cents":500,"order_id":"A17"})'
    )
    await expect(conversation.get_by_test_id("msg-tool_result")).to_contain_text("refunded 500 cents on A17")
    await expect(answers.nth(1)).to_contain_text("The refund call ended: succeeded.")
    await expect(answers.nth(2)).to_contain_text("Hello from the console agent.")
    # Every turn, each with its steps and their attempts (not only the latest turn).
    await expect(page.locator("[data-turn]")).to_have_count(2)
    first_turn_steps = page.locator("[data-turn]").nth(0).locator("[data-step] > div:first-child strong")
    await expect(first_turn_steps).to_have_text(["RunModel", "AwaitToolApproval", "CallSingleAttemptTool", "RunModel"])
    await expect(page.locator("[data-turn]").nth(1).locator("[data-attempt]")).to_have_count(1)
    await expect(page.get_by_test_id("live-text")).to_have_count(0)  # nothing came from a stream
    await expect(page.locator("main")).not_to_contain_text("null")
    await page.screenshot(path=str(tmp_path / "conversation.png"), full_page=True)


async def test_a_long_sessions_page_shows_the_latest_first_and_pages_back(dev: DevProcess, page, tmp_path: Path):
    """31 turns of one message and one answer each: 62 items, past a page of history (50), and
    past a page of turns (20). The page shows the latest of each, and pages back on demand."""
    turns = 31
    with worker_process(dev.url, tmp_path / "ledger.db", tmp_path / "worker.log"):
        async with DexClient(dev.url) as client:
            await client.create_session(AGENT, "long-1")
            for n in range(turns):
                await client.send_message("long-1", f"message {n}")
                await client.wait_until_idle("long-1", timeout_s=20)

    await open_console(page, dev.url, "#/session/long-1")
    users = page.get_by_test_id("msg-user").locator(".text")
    await expect(page.locator("[data-turn]")).to_have_count(20)
    await expect(page.locator("[data-turn]").last).to_contain_text(f"Turn {turns}")
    await expect(users).to_have_count(25)  # the latest 50 items: messages 6 to 30 and their answers
    await expect(users.first).to_have_text("message 6")
    await expect(users.last).to_have_text(f"message {turns - 1}")

    await page.get_by_test_id("history-earlier").click()
    await expect(users).to_have_count(turns)
    await expect(users.first).to_have_text("message 0")
    await expect(page.get_by_test_id("history-earlier")).to_have_count(0)
    await page.get_by_test_id("turns-earlier").click()
    await expect(page.locator("[data-turn]")).to_have_count(turns)
    await expect(page.get_by_test_id("turns-earlier")).to_have_count(0)


async def test_sessions_list_searches_sorts_and_refreshes_itself(dev: DevProcess, page):
    async with DexClient(dev.url) as client:
        await client.create_session("alpha", "alpha-1", metadata={"customer": "acme"})
        await client.create_session("beta", "beta-2", metadata={"customer": "globex"})
        await client.create_session("alpha", "alpha-3", metadata={"customer": "globex"})
        await open_console(page, dev.url, "#/sessions")
        rows = page.locator("[data-session]")
        await expect(rows).to_have_count(3)
        assert await _listed(page) == ["alpha-3", "beta-2", "alpha-1"]  # newest first
        await expect(page.get_by_test_id("created").first).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d .* UTC$"))

        # Filters apply as they change: no Apply button, no Enter.
        await expect(page.get_by_role("button", name="Apply")).to_have_count(0)
        await page.get_by_test_id("filter-q").fill("alpha")
        await expect(rows).to_have_count(2)
        await page.get_by_test_id("filter-metadata").fill("customer=acme")
        await expect(rows).to_have_count(1)
        await expect(rows).to_have_attribute("data-session", "alpha-1")
        assert "q=alpha" in await page.evaluate("location.hash")  # the filters are in the URL
        await page.get_by_test_id("filter-metadata").fill("")
        await page.get_by_test_id("filter-q").fill("")
        await page.get_by_test_id("filter-agent").fill("beta")
        # (The list on show already has one row, alpha-1: wait for beta's, not for a count.)
        await expect(rows).to_have_count(1)
        await expect(rows).to_have_attribute("data-session", "beta-2")
        await page.get_by_test_id("filter-agent").fill("")
        await page.get_by_test_id("filter-order").select_option("id")
        await expect(rows).to_have_count(3)  # the unfiltered list, not a stale filtered one
        await expect(rows.first).to_have_attribute("data-session", "alpha-1")
        assert await _listed(page) == ["alpha-1", "alpha-3", "beta-2"]
        await page.get_by_test_id("filter-status").select_option("running")
        await expect(page.get_by_test_id("sessions-table")).to_contain_text("No sessions match.")
        await page.get_by_test_id("filter-status").select_option("")

        # A session created meanwhile shows up without a reload.
        await client.create_session("alpha", "alpha-4")
        await expect(page.locator("[data-session=alpha-4]")).to_be_visible()


async def _listed(page) -> list[str]:
    return await page.locator("[data-session]").evaluate_all("rows => rows.map(r => r.dataset.session)")


async def test_the_bare_address_leads_to_the_console_which_has_an_icon(dev: DevProcess, page):
    async with aiohttp.ClientSession() as http:
        async with http.get(dev.url + "/", allow_redirects=False) as resp:
            assert resp.status == 302 and resp.headers["Location"] == "/ui"
        async with http.get(dev.url + "/ui/static/favicon.svg") as resp:
            assert resp.status == 200 and resp.content_type == "image/svg+xml"
            assert (await resp.text()).startswith("<svg")
    await page.goto(dev.url + "/")
    assert page.url == dev.url + "/ui"
    icon = await page.locator("link[rel=icon]").get_attribute("href")
    async with aiohttp.ClientSession() as http, http.get(dev.url + icon) as resp:
        assert resp.status == 200


# ---------------------------------------------------------------- the cluster view


async def test_cluster_view_follows_a_step_down_and_a_sigkill(tmp_path: Path, page):
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        cluster.up()
        token = cluster.tokens["admin"]
        first = await cluster.active_node()
        standby = next(n for n in cluster.urls if n != first)

        # A standby's console shows the cluster and links to the active node.
        await open_console(page, cluster.urls[standby], token=token)
        await expect(page.get_by_test_id(f"role-{first}")).to_have_text("active")
        await expect(page.get_by_test_id(f"role-{standby}")).to_have_text("standby")
        await expect(page.get_by_test_id("active-link")).to_have_attribute("href", f"{cluster.urls[first]}/ui")
        # Catch-up progress as the leader sees it.
        await expect(page.get_by_test_id(f"progress-{first}")).to_have_text("leader")
        await expect(page.get_by_test_id(f"progress-{standby}")).to_have_text("caught up")

        # On the active node's console: step down to a chosen node.
        await open_console(page, cluster.urls[first], token=token)
        await expect(page.get_by_test_id(f"role-{first}")).to_have_text("active")
        await page.get_by_test_id("step-down-to").select_option(standby)
        await page.get_by_test_id("step-down").click()
        await confirm(page)
        await expect(page.get_by_test_id(f"role-{standby}")).to_have_text("active")
        await expect(page.get_by_test_id(f"role-{first}")).to_have_text("standby")
        await page.screenshot(path=str(tmp_path / "after-step-down.png"), full_page=True)
        assert await cluster.active_node() == standby

        # SIGKILL the active node: the view shows it unreachable and another node active.
        cluster.kill(standby)
        await expect(page.locator(f"tr[data-node={standby}]")).to_have_attribute("data-role", "unreachable")
        third = await cluster.active_node(not_=standby)
        await expect(page.get_by_test_id(f"role-{third}")).to_have_text("active")
        await page.screenshot(path=str(tmp_path / "after-sigkill.png"), full_page=True)
    finally:
        cluster.down()


async def test_a_standbys_console_shows_the_active_nodes_sessions_with_one_token(tmp_path: Path, page):
    """Opened on a standby's address with one token: the sessions of the active node, their
    pages, and the Cancel and Delete buttons all work through the standby (the page never
    leaves it)."""
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        cluster.up()
        token = cluster.tokens["admin"]
        active = await cluster.active_node()
        standby = next(n for n in cluster.urls if n != active)
        async with DexClient(cluster.urls[active], token) as client:
            await client.create_session("nobody-serves-it", "on-active-1")
            await client.send_message("on-active-1", "start a turn no Worker takes")
            await client.send_message("on-active-1", "then this one")  # waits for the running turn

        await open_console(page, cluster.urls[standby], "#/sessions", token=token)
        await expect(page.locator("[data-session=on-active-1]")).to_be_visible()
        await expect(page.get_by_test_id("this-node")).to_contain_text(f"node {standby} (standby)")
        await expect(page.get_by_test_id("active-link")).to_have_attribute("href", f"{cluster.urls[active]}/ui")
        await expect(page.get_by_test_id("error-banner")).to_be_hidden()
        await page.get_by_role("link", name="on-active-1").click()
        await expect(page.get_by_test_id("session-status")).to_contain_text("running")
        await expect(page.get_by_test_id("msg-user").locator(".text")).to_have_text("start a turn no Worker takes")
        await expect(page.get_by_test_id("msg-waiting").locator(".text")).to_have_text("then this one")

        # Cancel the running turn, from the standby: the waiting message starts the next one,
        # which is cancelled too.
        await page.get_by_test_id("cancel-turn").click()
        await confirm(page)
        await expect(page.locator("[data-turn]").first).to_contain_text("Turn 1 cancelled")
        await expect(page.get_by_test_id("msg-user").locator(".text")).to_have_text(
            ["start a turn no Worker takes", "then this one"]
        )
        await expect(page.get_by_test_id("msg-waiting")).to_have_count(0)
        await page.get_by_test_id("cancel-turn").click()
        await confirm(page)
        await expect(page.get_by_test_id("session-status")).to_contain_text("idle")
        await expect(page.get_by_test_id("cancel-turn")).to_have_count(0)
        async with DexClient(cluster.urls[active], token) as client:
            assert (await client.get_session("on-active-1")).status == "idle"
        await page.screenshot(path=str(tmp_path / "standby-session.png"), full_page=True)

        # Delete the ended session, from the standby: back to the list, and gone on the active node.
        await page.get_by_test_id("delete-session").click()
        await confirm(page)
        await expect(page.get_by_test_id("sessions-table")).to_be_visible()
        await expect(page.locator("[data-session=on-active-1]")).to_have_count(0)
        await expect(page.get_by_test_id("error-banner")).to_be_hidden()
        async with DexClient(cluster.urls[active], token) as client:
            with pytest.raises(DexError) as gone:
                await client.get_session("on-active-1")
        assert gone.value.status == 404
        assert page.url.startswith(cluster.urls[standby])  # never sent to the other node
    finally:
        cluster.down()
