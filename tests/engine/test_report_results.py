"""ReportResults: a Worker channel frame's reports in one entry, each fenced and refused on
its own, then the frame's credit handed out in the same entry."""

from __future__ import annotations

from pathlib import Path

from dex_ha.engine import ReportItem, ReportResults
from dex_ha.engine.commands import decode_command, encode_command
from tests.engine.driver import AGENT, Driver


def two_running_models(path: Path) -> tuple[Driver, str, str]:
    d = Driver(str(path))
    d.register()
    for sid in ("s1", "s2"):
        d.create(sid)
        d.send(session_id=sid)
    return d, d.hand_out("RunModel"), d.hand_out("RunModel")


def item(d: Driver, step_id: str, outcome: str = "complete", **kw: object) -> ReportItem:
    a = d.running(step_id)
    fields = {"term": a.term, **kw}
    if outcome == "complete" and "result" not in kw:
        fields["result"] = {"content": "done", "tool_calls": []}
    return ReportItem(step_id=step_id, attempt=a.attempt, outcome=outcome, **fields)  # type: ignore[arg-type]


def test_reports_apply_in_order_and_a_stale_one_is_refused_alone(tmp_path: Path) -> None:
    d, s1, s2 = two_running_models(tmp_path / "e.db")
    stale = item(d, s1, term=d.term + 5)  # not the attempt's term: fenced, 409
    reports = [item(d, s1), stale, item(d, s2, "fail", error="boom", retryable=False)]
    value = d.ok(ReportResults(at=d.at, reports=reports)).accepted_value()
    assert [a.status for a in value.reports] == [200, 409, 200]
    assert value.reports[1].error == "stale_attempt"
    assert d.engine.running_attempts() == []
    assert d.snap("s1")["status"] == "idle"  # the model answered: the turn is over
    assert d.turn_status("s2") == "failed"  # no retry left


def test_a_report_that_wrote_before_it_was_refused_leaves_nothing_and_the_others_stand(tmp_path: Path) -> None:
    """The result of a RunModel that does not fit is refused after its attempt was marked
    completed: the fast path cannot undo that alone, so the entry is applied again with a
    savepoint around each report. Without it the refused report's attempt stayed completed."""
    d, s1, s2 = two_running_models(tmp_path / "e.db")
    bad = item(d, s1, result={"content": 7, "tool_calls": "no"})
    value = d.ok(ReportResults(at=d.at, reports=[bad, item(d, s2)])).accepted_value()
    assert [a.status for a in value.reports] == [400, 200]
    assert [a.step_id for a in d.engine.running_attempts()] == [s1]  # still running, as before
    assert d.snap("s2")["status"] == "idle"


def test_the_frame_credit_hands_out_queued_steps_in_the_same_entry(tmp_path: Path) -> None:
    d, s1, _ = two_running_models(tmp_path / "e.db")
    d.create("s3")
    d.send(session_id="s3")  # s3's RunModel waits in the queue
    result = {"content": "", "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {}}]}
    value = d.ok(
        ReportResults(
            at=d.at,
            reports=[item(d, s1, result=result)],
            next_worker_id="w2",
            next_term=d.term,
            next_agents=[AGENT],
            next_token_secrets=["x1", "x2", "x3"],
        )
    ).accepted_value()
    started = [(s.session_id, s.kind, s.worker_id) for s in value.started]
    assert started == [("s3", "RunModel", "w2"), ("s1", "CallTool", "w2")]  # queue order, then no more queued
    assert d.queued() == []


def test_it_survives_the_log_encoding(tmp_path: Path) -> None:
    cmd = ReportResults(
        at=1, reports=[ReportItem(step_id="st", attempt=1, term=2, outcome="fail", error="e", not_started=True)]
    )
    assert decode_command(encode_command(cmd)) == cmd


def test_an_empty_frame_is_refused(tmp_path: Path) -> None:
    d = Driver(str(tmp_path / "e.db"))
    assert d.apply(ReportResults(at=d.at, reports=[])).code == "invalid"
