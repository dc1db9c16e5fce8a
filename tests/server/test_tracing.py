"""Tracing's switches and ids, without a server: when a node exports traces, the ids a
task's traceparent carries, and the Task field on the wire."""

from __future__ import annotations

import logging

import pytest

from dex_ha.engine import StartedAttempt
from dex_ha.server import tracing
from dex_ha.server.tracing import attempt_log_fields, span_sink_from_environment, tracing_wanted
from dex_ha.worker_protocol import Task

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        (ENDPOINT, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_traces_are_wanted_only_with_an_endpoint_and_not_turned_off(environ: dict[str, str], wanted: bool) -> None:
    assert tracing_wanted(environ) is wanted


def test_no_endpoint_no_sink() -> None:
    assert span_sink_from_environment("n1", {}) is None


def test_an_endpoint_without_the_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tracing, "OTLPSpanExporter", None)  # as where the extra is not installed
    with caplog.at_level(logging.WARNING, "dex_ha.server.tracing"):
        assert span_sink_from_environment("n1", ENDPOINT) is None
    assert "pip install -e '.[otel]'" in caplog.text


def test_the_traceparent_names_the_attempts_span_in_the_turns_trace() -> None:
    started = StartedAttempt(
        step_id="st1",
        attempt=2,
        term=1,
        worker_id="w1",
        session_id="s1",
        turn_id="t1",
        agent="helper",
        kind="CallTool",
        idempotency_key="s1:c1",
        deadline_at=None,
        queued_at=None,
        token_secret="secret",
        input={},
    )
    version, trace, span, flags = tracing.traceparent(started).split("-")
    assert (version, flags) == ("00", "01")
    assert trace == attempt_log_fields("s1", "t1", "st1", 2)["trace_id"] == f"{tracing.trace_id('s1', 't1'):032x}"
    assert span == f"{tracing.attempt_span_id('s1', 'st1', 2):016x}"
    assert span != f"{tracing.attempt_span_id('s1', 'st1', 1):016x}"  # each attempt its own span


def test_a_task_carries_a_traceparent_only_when_it_has_one() -> None:
    raw = {"task_token": "tok", "session_id": "s1", "turn_id": "t1", "step_id": "st1", "kind": "CallTool", "input": {}}
    task = Task.from_json(raw)
    assert task.traceparent is None and "traceparent" not in task.as_json()
    traced = Task.from_json({**raw, "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert traced.as_json()["traceparent"] == traced.traceparent
    with pytest.raises(ValueError, match="task.traceparent"):
        Task.from_json({**raw, "traceparent": 7})
