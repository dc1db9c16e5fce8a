"""AnthropicModel: the mapping of a session's history, summary and tools to a Messages
request and of the answer back, streaming, summaries and error mapping, against the fake
Anthropic API (which refuses what the real API refuses, see request_problem)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import anthropic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dex_ha.models.anthropic import NO_RESULT, NOTE_PREFIX, SUMMARY_HEADING, AnthropicModel, to_messages, to_tools
from dex_ha.worker import ModelRequest, NonRetryableError, ToolCall
from harness.fake_models.anthropic_api import ApiError, FakeAnthropic, Reply, request_problem, tool_use

TOOLS = [
    {
        "name": "lookup",
        "effect": "read",
        "approval": False,
        "inline": False,
        "description": "Find an order.",
        "input_schema": {"type": "object", "properties": {"order": {"type": "string"}}},
    },
    {"name": "refund", "effect": "write", "approval": True, "inline": False},
]
USER: dict[str, Any] = {"type": "user", "text": "Where are A17 and B2?"}
TWO_CALLS: dict[str, Any] = {
    "type": "assistant",
    "content": "Let me look.",
    "tool_calls": [
        {"id": "c1", "name": "lookup", "arguments": {"order": "A17"}},
        {"id": "c2", "name": "lookup", "arguments": {"order": "B2"}},
    ],
}


def result(
    call_id: str, output: object = "found", status: str = "succeeded", error: str | None = None
) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "tool_result", "call_id": call_id, "name": "lookup", "status": status}
    item.update({"output": output} if status == "succeeded" else {"error": error})
    return item


def note(text: str) -> dict:
    return {"type": "note", "text": text}


def valid(messages: list[dict], tools: list[dict] | None = TOOLS) -> list[dict]:
    """`messages`, after checking the API would take them."""
    problem = request_problem({"model": "m", "max_tokens": 1, "messages": messages, "tools": tools})
    assert problem is None, problem
    return messages


class Sink:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def send_text(self, text: str) -> None:
        self.texts.append(text)

    def send(self, delta: dict) -> None:
        raise AssertionError("AnthropicModel streams text only")


def model_for(fake: FakeAnthropic, **kwargs: Any) -> AnthropicModel:
    return AnthropicModel("claude-test", api_key="sk-test", base_url=fake.base_url, **kwargs)


# ---------------------------------------------------------------- history → messages


def test_a_turn_with_two_calls_maps_to_alternating_messages_with_results_after_their_calls() -> None:
    history = [
        USER,
        TWO_CALLS,
        result("c1", {"eta": "today"}),
        result("c2", "lost"),
        {"type": "assistant", "content": "A17 arrives today.", "tool_calls": []},
        {"type": "user", "text": "Thanks"},
    ]
    assert valid(to_messages(history, None)) == [
        {"role": "user", "content": [{"type": "text", "text": "Where are A17 and B2?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"order": "A17"}},
                {"type": "tool_use", "id": "c2", "name": "lookup", "input": {"order": "B2"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": '{"eta": "today"}'},
                {"type": "tool_result", "tool_use_id": "c2", "content": "lost"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "A17 arrives today."}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]


def test_a_note_and_a_user_message_after_the_results_join_the_results_message_after_them() -> None:
    history = [
        USER,
        TWO_CALLS,
        result("c1"),
        result("c2"),
        note("an operator reconciled a call"),
        {"type": "user", "text": "and now?"},
    ]
    messages = valid(to_messages(history, None))
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "tool_result", "text", "text"]
    assert messages[2]["content"][2]["text"] == NOTE_PREFIX + "an operator reconciled a call"
    assert len(messages) == 3


def test_a_note_between_a_call_and_its_results_does_not_separate_them() -> None:
    history = [USER, TWO_CALLS, note("between"), result("c2"), result("c1")]
    messages = valid(to_messages(history, None))
    assert [(b["type"], b.get("tool_use_id")) for b in messages[2]["content"]] == [
        ("tool_result", "c1"),
        ("tool_result", "c2"),
        ("text", None),
    ]  # in the order of the calls


def test_the_summary_opens_the_first_user_message() -> None:
    messages = valid(to_messages([USER], "the user asked about orders before"))
    assert messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"{SUMMARY_HEADING}\nthe user asked about orders before"},
                {"type": "text", "text": "Where are A17 and B2?"},
            ],
        }
    ]
    # History that starts with the model's answer (its question was summarised): still user first.
    messages = valid(to_messages([TWO_CALLS, result("c1"), result("c2")], "earlier"))
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert valid(to_messages([TWO_CALLS, result("c1"), result("c2")], None))[0]["role"] == "user"


def test_a_call_without_a_result_gets_an_error_result_and_a_result_without_its_call_becomes_text() -> None:
    messages = valid(to_messages([USER, TWO_CALLS, result("c1")], None))
    assert messages[2]["content"][1] == {
        "type": "tool_result",
        "tool_use_id": "c2",
        "content": NO_RESULT,
        "is_error": True,
    }
    messages = valid(to_messages([result("gone"), USER], None))
    assert messages[0]["content"][0]["type"] == "text" and "found" in messages[0]["content"][0]["text"]


def test_failed_and_unknown_outcomes_are_errors_the_model_can_tell_apart() -> None:
    history = [
        USER,
        TWO_CALLS,
        result("c1", status="failed", error="no such order"),
        result("c2", status="outcome_unknown", error="the outcome is unknown: the Worker died"),
    ]
    first, second = valid(to_messages(history, None))[2]["content"]
    assert first == {"type": "tool_result", "tool_use_id": "c1", "content": "failed: no such order", "is_error": True}
    assert second["is_error"] and second["content"].startswith("outcome_unknown: the outcome is unknown")


def test_blank_text_makes_no_block_and_same_role_messages_merge() -> None:
    history = [
        USER,
        {"type": "assistant", "content": "", "tool_calls": []},
        {"type": "user", "text": "hello?"},
        {"type": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {}}]},
        result("c1"),
    ]
    messages = valid(to_messages(history, None))
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [b["text"] for b in messages[0]["content"]] == ["Where are A17 and B2?", "hello?"]
    assert messages[1]["content"] == [{"type": "tool_use", "id": "c1", "name": "lookup", "input": {}}]


def test_bad_history_is_a_value_error_naming_the_item() -> None:
    with pytest.raises(ValueError, match=r"history\[1\] has an unknown type 'system'"):
        to_messages([USER, {"type": "system"}], None)
    with pytest.raises(ValueError, match=r"history\[0\].tool_calls\[0\] needs a string id"):
        to_messages([{"type": "assistant", "content": "", "tool_calls": [{"name": "x"}]}], None)
    with pytest.raises(ValueError, match="nothing to answer"):
        to_messages([], None)


# Random histories of the shapes the engine produces, in any order, with results missing,
# repeated or orphaned: the request is always one the API takes.
history_items = st.one_of(
    st.builds(lambda t: {"type": "user", "text": t}, st.sampled_from(["hi", "", " ", "more"])),
    st.builds(note, st.sampled_from(["a note", ""])),
    st.builds(
        lambda text, ids: {
            "type": "assistant",
            "content": text,
            "tool_calls": [{"id": i, "name": "lookup", "arguments": {}} for i in ids],
        },
        st.sampled_from(["", "text"]),
        st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=3, unique=True),
    ),
    st.builds(result, st.sampled_from(["a", "b", "c", "d", "x"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(history_items, max_size=12), st.sampled_from([None, "", "a summary"]))
def test_any_history_maps_to_a_request_the_api_takes(history: list[dict], summary: str | None) -> None:
    try:
        messages = to_messages(history, summary)
    except ValueError as exc:
        assert "nothing to answer" in str(exc)
        return
    valid(messages)


def test_tools_keep_name_description_and_schema_only() -> None:
    assert to_tools(TOOLS) == [
        {
            "name": "lookup",
            "description": "Find an order.",
            "input_schema": {"type": "object", "properties": {"order": {"type": "string"}}},
        },
        {"name": "refund", "input_schema": {"type": "object", "properties": {}}},
    ]
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        to_tools([{"description": "no name"}])


# ---------------------------------------------------------------- respond and summarize


async def test_respond_streams_text_and_returns_text_calls_and_usage() -> None:
    reply = Reply.of(
        "Checking both orders.",
        tool_use("lookup", {"order": "A17"}, id="toolu_a"),
        tool_use("lookup", {"order": "B2"}, id="toolu_b"),
        usage={"input_tokens": 120, "output_tokens": 30},
    )
    async with FakeAnthropic([reply]) as fake:
        sink = Sink()
        model = model_for(fake, system="You track orders.", max_tokens=512)
        response = await model.respond(ModelRequest([USER], "old summary", TOOLS), sink)
    assert sink.texts == ["Checking ", "both ", "orders."]
    assert response.content == "Checking both orders."
    assert response.tool_calls == [
        ToolCall("toolu_a", "lookup", {"order": "A17"}),
        ToolCall("toolu_b", "lookup", {"order": "B2"}),
    ]
    assert response.usage == {"input_tokens": 120, "output_tokens": 30}
    [body] = fake.bodies()
    assert body["model"] == "claude-test" and body["max_tokens"] == 512 and body["stream"] is True
    assert body["system"] == "You track orders."
    assert body["messages"] == to_messages([USER], "old summary")
    assert [t["name"] for t in body["tools"]] == ["lookup", "refund"]


async def test_summarize_sends_a_transcript_with_the_instructions_and_returns_the_text() -> None:
    history = [USER, TWO_CALLS, result("c1", {"eta": "today"}), result("c2", status="failed", error="no B2")]
    async with FakeAnthropic([Reply.of("The user asked about A17 (arrives today) and B2 (unknown).")]) as fake:
        summary = await model_for(fake, summary_instructions="Summarise briefly.", summary_max_tokens=99).summarize(
            history, "older summary"
        )
    assert summary == "The user asked about A17 (arrives today) and B2 (unknown)."
    [body] = fake.bodies()
    assert body["system"] == "Summarise briefly." and body["max_tokens"] == 99 and "tools" not in body
    [message] = body["messages"]
    transcript = message["content"][0]["text"]
    for expected in (
        "older summary",
        "User: Where are A17 and B2?",
        'lookup (call c1) with {"order": "A17"}',
        'Result of call c1 (lookup): {"eta": "today"}',
        "Result of call c2 (lookup): failed: no B2",
    ):
        assert expected in transcript


async def test_an_empty_summary_is_an_error() -> None:
    async with FakeAnthropic([Reply.of(" ")]) as fake:
        with pytest.raises(RuntimeError, match="empty summary"):
            await model_for(fake).summarize([USER], None)


@pytest.mark.parametrize(
    "error",
    [
        ApiError.rate_limited(retry_after=0),
        ApiError.overloaded(),
        ApiError.of_type("api_error"),
        ApiError(503, "api_error", "unavailable"),
    ],
)
async def test_transient_api_errors_are_ordinary_exceptions_with_no_sdk_retry(error: ApiError) -> None:
    async with FakeAnthropic([error, Reply.of("never fetched")]) as fake:
        with pytest.raises(anthropic.APIStatusError) as raised:
            await model_for(fake).respond(ModelRequest([USER], None, TOOLS), Sink())
    assert not isinstance(raised.value, NonRetryableError) and raised.value.status_code == error.status
    assert len(fake.requests) == 1  # the SDK did not retry: the server owns retries


@pytest.mark.parametrize(
    "status, kind",
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
    ],
)
async def test_permanent_api_errors_raise_non_retryable_with_the_providers_message(status: int, kind: str) -> None:
    async with FakeAnthropic([ApiError(status, kind, f"the provider says {kind}")]) as fake:
        with pytest.raises(NonRetryableError) as raised:
            await model_for(fake).respond(ModelRequest([USER], None, TOOLS), Sink())
    assert str(raised.value).startswith(f"anthropic {status} {kind}: the provider says {kind} (request req_fake")
    assert len(fake.requests) == 1


async def test_an_error_event_mid_stream_is_judged_by_its_type() -> None:
    overloaded = Reply.of("partial text", error=ApiError.overloaded(), error_after_deltas=1)
    refused = Reply.of("partial text", error=ApiError.of_type("invalid_request_error", "bad"), error_after_deltas=1)
    async with FakeAnthropic([overloaded, refused]) as fake:
        sink = Sink()
        with pytest.raises(anthropic.APIStatusError) as raised:
            await model_for(fake).respond(ModelRequest([USER], None, TOOLS), sink)
        assert not isinstance(raised.value, NonRetryableError) and sink.texts == ["partial "]
        with pytest.raises(NonRetryableError, match="invalid_request_error: bad"):
            await model_for(fake).respond(ModelRequest([USER], None, TOOLS), sink)


async def test_a_stalled_stream_times_out_and_a_closed_port_is_a_connection_error() -> None:
    async with FakeAnthropic([Reply.of("one two three", stall_after_deltas=1)]) as fake:
        with pytest.raises(Exception) as raised:
            await model_for(fake, timeout=0.3).respond(ModelRequest([USER], None, TOOLS), Sink())
        # Mid-stream the SDK lets its HTTP library's ReadTimeout through: still an ordinary exception.
        assert any("Timeout" in cls.__name__ for cls in type(raised.value).__mro__), repr(raised.value)
        assert not isinstance(raised.value, NonRetryableError)
        closed_url = fake.base_url
    model = AnthropicModel("claude-test", api_key="sk-test", base_url=closed_url)
    with pytest.raises(anthropic.APIConnectionError):
        await model.respond(ModelRequest([USER], None, TOOLS), Sink())


async def test_a_history_the_model_cannot_take_fails_without_retry_and_without_a_request() -> None:
    async with FakeAnthropic([Reply.of("unused")]) as fake:
        with pytest.raises(NonRetryableError, match="unknown type"):
            await model_for(fake).respond(ModelRequest([{"type": "mystery"}], None, TOOLS), Sink())
    assert fake.requests == []


async def test_a_given_client_is_used_with_its_retries_off() -> None:
    async with FakeAnthropic([ApiError.overloaded(), Reply.of("unused")]) as fake:
        client = anthropic.AsyncAnthropic(api_key="sk-own", base_url=fake.base_url, max_retries=5)
        with pytest.raises(anthropic.APIStatusError):
            await AnthropicModel("claude-test", client=client).respond(ModelRequest([USER], None, TOOLS), Sink())
    assert len(fake.requests) == 1 and "sk-own" in fake.requests[0].headers.get("authorization", "") + fake.requests[
        0
    ].headers.get("x-api-key", "")


def test_the_environment_gives_the_key_and_the_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1")
    model = AnthropicModel("claude-test")
    assert str(model.client.base_url).startswith("http://127.0.0.1:1") and model.client.max_retries == 0
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(ValueError, match="api_key"):
        AnthropicModel("claude-test")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"model": ""}, ValueError, "model must be"),
        ({"max_tokens": 0}, ValueError, "max_tokens must be"),
        ({"max_tokens": True}, ValueError, "max_tokens must be"),
        ({"system": 5}, TypeError, "system must be"),
        ({"timeout": -1}, ValueError, "timeout must be"),
        ({"summary_instructions": ""}, ValueError, "summary_instructions"),
        ({"summary_max_tokens": -5}, ValueError, "summary_max_tokens"),
        ({"client": object()}, TypeError, "client must be"),
        ({"client": anthropic.AsyncAnthropic(api_key="k"), "base_url": "http://x"}, ValueError, "client"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, error: type, match: str) -> None:
    arguments = {"model": "claude-test", "api_key": "sk-test", **kwargs}
    if "client" in kwargs:
        del arguments["api_key"]
    with pytest.raises(error, match=match):
        AnthropicModel(**arguments)


def test_the_worker_sdk_and_the_models_package_do_not_import_the_anthropic_sdk() -> None:
    code = (
        "import sys, dex_ha, dex_ha.worker, dex_ha.client, dex_ha.models\n"
        "assert 'anthropic' not in sys.modules, 'anthropic was imported'\n"
        "import dex_ha.models.anthropic\n"
        "assert 'anthropic' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
