"""OpenAIModel: the mapping of history, summary and tools to each API's request and of the
answers back, the pairing of tool calls with their results, the error mapping, and the
summary call. Requests go to the fake OpenAI server (harness/fake_models/openai_api.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from dex_ha.engine.agents import BUILTIN_TOOLS
from dex_ha.models.openai import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    MISSING_RESULT,
    OpenAIModel,
    OpenAIStreamError,
    chat_messages,
    model_order,
    responses_input,
)
from dex_ha.worker import Agent, ModelRequest, NonRetryableError, ToolCall, ToolContext
from harness.fake_models.openai_api import CHAT_PATH, RESPONSES_PATH, Call, Failure, FakeOpenAI, Reply
from harness.processes import env_with_checkout
from tests.support.doubles import TextSink

APIS = ("responses", "chat")

# A history as the engine records it: a user message, an assistant message with two calls,
# a note that arrived while they ran (recorded before the results here, as a worst case),
# the results in the other order, and the final answer.
HISTORY: list[dict[str, Any]] = [
    {"type": "user", "text": "Where is order A17?"},
    {
        "type": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"id": "c1", "name": "lookup", "arguments": {"order": "A17"}},
            {"id": "c2", "name": "put_note", "arguments": {"text": "asked about A17"}},
        ],
    },
    {"type": "note", "text": "An operator reconciled call c0."},
    {"type": "tool_result", "call_id": "c2", "name": "put_note", "status": "failed", "error": "disk full"},
    {"type": "tool_result", "call_id": "c1", "name": "lookup", "status": "succeeded", "output": {"status": "shipped"}},
    {"type": "assistant", "content": "It shipped.", "tool_calls": []},
    {"type": "user", "text": "Thanks!"},
]


def agent_tools() -> list[dict[str, Any]]:
    """The tool list a RunModel task carries: the agent's tools as the server stores them,
    then the server's built-ins."""
    agent = Agent("support")

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, order: str, verbose: bool = False) -> dict:
        """Find an order."""
        return {}

    @agent.tool(effect="write", input_schema=None)
    async def ping(ctx: ToolContext) -> str:
        return "pong"

    return [*agent.definition()["tools"], *BUILTIN_TOOLS]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def models(fake: FakeOpenAI) -> AsyncIterator[Any]:
    """make(api, **options) -> an OpenAIModel on the fake; closed after the test."""
    made: list[OpenAIModel] = []

    def make(api: str = "responses", **options: Any) -> OpenAIModel:
        model = OpenAIModel("gpt-test", api=api, api_key="sk-test", base_url=fake.base_url, **options)
        made.append(model)
        return model

    yield make
    for model in made:
        await model.aclose()


# ---------------------------------------------------------------- the mapping, without a server


def test_each_call_is_followed_by_its_result_and_a_note_that_came_between_goes_after() -> None:
    entries = model_order(HISTORY)
    assert [e["type"] for e in entries] == ["user", "assistant", "note", "assistant", "user"]
    calls = entries[1]["calls"]
    assert [(c["id"], c["output"]) for c in calls] == [
        ("c1", '{"status": "shipped"}'),
        ("c2", '{"status": "failed", "error": "disk full"}'),
    ]


def test_a_call_without_a_result_gets_one_and_a_result_without_its_call_becomes_a_note() -> None:
    history: list[dict[str, Any]] = [
        {"type": "tool_result", "call_id": "old", "name": "lookup", "status": "succeeded", "output": "x"},
        {"type": "user", "text": "hi"},
        {"type": "assistant", "content": "", "tool_calls": [{"id": "c9", "name": "ping", "arguments": {}}]},
    ]
    entries = model_order(history)
    assert entries[0] == {"type": "note", "text": "The result of an earlier call of lookup (call old): x"}
    assert entries[2]["calls"][0]["output"] == MISSING_RESULT


def test_the_responses_input_pairs_function_calls_with_their_outputs() -> None:
    items = responses_input(model_order(HISTORY), "They talked about shoes.", "developer")
    assert items == [
        {
            "type": "message",
            "role": "developer",
            "content": "Summary of the conversation before the messages below:\nThey talked about shoes.",
        },
        {"type": "message", "role": "user", "content": "Where is order A17?"},
        {"type": "message", "role": "assistant", "content": "Let me check."},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"order": "A17"}'},
        {"type": "function_call", "call_id": "c2", "name": "put_note", "arguments": '{"text": "asked about A17"}'},
        {"type": "function_call_output", "call_id": "c1", "output": '{"status": "shipped"}'},
        {"type": "function_call_output", "call_id": "c2", "output": '{"status": "failed", "error": "disk full"}'},
        {"type": "message", "role": "developer", "content": "An operator reconciled call c0."},
        {"type": "message", "role": "assistant", "content": "It shipped."},
        {"type": "message", "role": "user", "content": "Thanks!"},
    ]


def test_chat_messages_put_the_tool_messages_right_after_the_assistant_message() -> None:
    messages = chat_messages(model_order(HISTORY), None, "Be brief.", "system")
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is order A17?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"order": "A17"}'}},
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "put_note", "arguments": '{"text": "asked about A17"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"status": "failed", "error": "disk full"}'},
        {"role": "system", "content": "An operator reconciled call c0."},
        {"role": "assistant", "content": "It shipped."},
        {"role": "user", "content": "Thanks!"},
    ]


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"api": "assistants"}, "api must be one of"),
        ({"note_role": "tool"}, "note_role must be one of"),
        ({"max_output_tokens": 0}, "max_output_tokens must be"),
        ({"timeout_s": -1}, "timeout_s must be"),
        ({"request_options": {"temprature": 0.2}}, "'temprature' is not a parameter"),
        ({"request_options": {"store": True}}, "'store' is set by OpenAIModel"),
    ],
)
def test_bad_arguments_are_refused_by_name(bad: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        OpenAIModel("gpt-test", api_key="sk-test", **bad)


def test_without_a_key_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="OPENAI_API_KEY is not set"):
        OpenAIModel("gpt-test")
    with pytest.raises(ValueError, match="model must be"):
        OpenAIModel("", api_key="sk-test")


# ---------------------------------------------------------------- requests and answers, on the fake


@pytest.mark.parametrize("api", APIS)
async def test_respond_sends_the_whole_input_and_streams_the_answer(fake: FakeOpenAI, models: Any, api: str) -> None:
    fake.queue(
        Reply(
            "Checking both.",
            [Call("lookup", {"order": "B2"}, call_id="call_a"), Call("ping", {}, call_id="call_b")],
            input_tokens=40,
            output_tokens=9,
        )
    )
    model = models(api, instructions="You help customers.", max_output_tokens=500, request_options={"temperature": 0.2})
    sink = TextSink()
    response = await model.respond(ModelRequest(HISTORY, "They talked about shoes.", agent_tools()), sink)

    assert sink.texts == ["Checking ", "both."]
    assert response.content == "Checking both."
    assert response.tool_calls == [ToolCall("call_a", "lookup", {"order": "B2"}), ToolCall("call_b", "ping", {})]
    assert response.usage == {"input_tokens": 40, "output_tokens": 9, "total_tokens": 49}
    [request] = fake.requests
    body = request.body
    assert body["model"] == "gpt-test" and body["stream"] is True and body["temperature"] == 0.2
    entries = model_order(HISTORY)
    if api == "responses":
        assert request.path == RESPONSES_PATH
        assert body["store"] is False and body["instructions"] == "You help customers."
        assert body["input"] == responses_input(entries, "They talked about shoes.", "developer")
        assert body["max_output_tokens"] == 500
        tools = {t["name"]: t for t in body["tools"]}
        assert tools["lookup"] == {
            "type": "function",
            "name": "lookup",
            "description": "Find an order.",
            "strict": False,
            "parameters": {
                "type": "object",
                "required": ["order"],
                "additionalProperties": False,
                "properties": {"order": {"type": "string"}, "verbose": {"type": "boolean"}},
            },
        }
    else:
        assert request.path == CHAT_PATH
        assert body["messages"] == chat_messages(
            entries, "They talked about shoes.", "You help customers.", "developer"
        )
        assert body["max_completion_tokens"] == 500 and body["stream_options"] == {"include_usage": True}
        tools = {t["function"]["name"]: t["function"] for t in body["tools"]}
        assert tools["lookup"]["parameters"]["required"] == ["order"]
    # The agent's tools, then the built-ins, each with a JSON schema for its arguments.
    assert list(tools) == ["lookup", "ping", "ask_user", "sleep"]
    params = lambda t: t["parameters"]
    assert params(tools["ask_user"])["required"] == ["question"] and params(tools["sleep"])["required"] == ["ms"]


@pytest.mark.parametrize("api", APIS)
async def test_a_reply_without_streaming_support_needs_no_tools(fake: FakeOpenAI, models: Any, api: str) -> None:
    fake.queue(Reply("Hello"))
    response = await models(api).respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), TextSink())
    assert (response.content, response.tool_calls) == ("Hello", [])
    assert "tools" not in fake.requests[0].body and "instructions" not in fake.requests[0].body


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_answers_that_would_repeat_raise_non_retryable_with_openais_message(
    fake: FakeOpenAI, models: Any, api: str, status: int
) -> None:
    fake.queue(Failure(status, f"the provider says no ({status})"))
    with pytest.raises(NonRetryableError) as raised:
        await models(api).respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), TextSink())
    assert f"the provider says no ({status})" in str(raised.value) and str(status) in str(raised.value)
    assert len(fake.requests) == 1


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    "failure, error_class",
    [
        (Failure(429, "Rate limit reached", retry_after=1), openai.RateLimitError),
        (Failure(500, "The server had an error"), openai.InternalServerError),
        (Failure(503, "Overloaded"), openai.InternalServerError),
    ],
)
async def test_rate_limits_and_server_errors_stay_retryable_and_are_not_retried_inside(
    fake: FakeOpenAI, models: Any, api: str, failure: Failure, error_class: type[Exception]
) -> None:
    fake.queue(failure)
    with pytest.raises(error_class) as raised:
        await models(api).respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), TextSink())
    assert not isinstance(raised.value, NonRetryableError)
    assert len(fake.requests) == 1  # the SDK did not retry: the server owns retries


async def test_a_client_passed_in_gets_its_retries_turned_off(fake: FakeOpenAI) -> None:
    client = AsyncOpenAI(api_key="sk-test", base_url=fake.base_url)  # the SDK's default: 2 retries
    fake.queue(Failure(429, "Rate limit reached", retry_after=0))
    model = OpenAIModel("gpt-test", client=client)
    with pytest.raises(openai.RateLimitError):
        await model.respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), TextSink())
    assert len(fake.requests) == 1
    await client.close()
    with pytest.raises(ValueError, match="either a client or api_key"):
        OpenAIModel("gpt-test", client=client, api_key="sk-other")


@pytest.mark.parametrize("api", APIS)
async def test_a_stream_that_stalls_times_out_as_retryable(fake: FakeOpenAI, models: Any, api: str) -> None:
    fake.queue(Reply("one two three", stall_after=1))
    sink = TextSink()
    with pytest.raises(openai.APITimeoutError):
        await models(api, timeout_s=0.5).respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), sink)
    assert sink.texts == ["one "]


async def test_a_server_that_is_not_there_is_a_retryable_connection_error(models: Any, fake: FakeOpenAI) -> None:
    model = models()
    await fake.stop()
    with pytest.raises(openai.APIConnectionError):
        await model.respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), TextSink())


@pytest.mark.parametrize("api", APIS)
async def test_arguments_that_are_not_a_json_object(fake: FakeOpenAI, models: Any, api: str) -> None:
    request = ModelRequest([{"type": "user", "text": "hi"}], None, [])
    fake.queue(Reply(tool_calls=[Call("lookup", '{"order": ')]))
    with pytest.raises(OpenAIStreamError, match="not a JSON object"):  # retryable: the model may do better
        await models(api).respond(request, TextSink())
    fake.queue(Reply(tool_calls=[Call("lookup", '{"order": ')], incomplete=True))
    with pytest.raises(NonRetryableError, match="output token limit"):  # the same request would be cut again
        await models(api).respond(request, TextSink())


@pytest.mark.parametrize("api", APIS)
async def test_summarize_asks_the_model_for_a_summary_of_the_transcript(
    fake: FakeOpenAI, models: Any, api: str
) -> None:
    fake.queue(Reply("A17 shipped; a note failed."))
    summary = await models(api).summarize(HISTORY, "Earlier: shoes.")
    assert summary == "A17 shipped; a note failed."
    [request] = fake.requests
    body = request.body
    if api == "responses":
        assert body["instructions"] == DEFAULT_SUMMARY_INSTRUCTIONS and body["store"] is False
        [message] = body["input"]
    else:
        system, message = body["messages"]
        assert system == {"role": "system", "content": DEFAULT_SUMMARY_INSTRUCTIONS}
    assert not body.get("stream") and "tools" not in body
    text = message["content"]
    assert message["role"] == "user" and text.startswith(
        "Summary of the conversation before this part:\nEarlier: shoes."
    )
    for line in (
        "User: Where is order A17?",
        'Assistant called lookup (call c1) with {"order": "A17"}',
        'Result of call c1: {"status": "shipped"}',
        "Note: An operator reconciled call c0.",
        "Assistant: It shipped.",
    ):
        assert line in text


async def test_summarize_maps_errors_too(fake: FakeOpenAI, models: Any) -> None:
    fake.queue(Failure(401, "Incorrect API key provided"))
    with pytest.raises(NonRetryableError, match="Incorrect API key provided"):
        await models().summarize(HISTORY, None)


async def test_the_key_and_address_come_from_the_environment(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    fake.queue(Reply("hi"))
    model = OpenAIModel("gpt-test")
    await model.respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), TextSink())
    await model.aclose()
    assert fake.requests[0].headers["Authorization"] == "Bearer sk-from-env"
    assert json.loads(json.dumps(fake.requests[0].body))["input"] == [
        {"type": "message", "role": "user", "content": "hi"}
    ]


def test_the_worker_sdk_does_not_import_openai() -> None:
    """The extra stays optional: only dex_ha.models.openai imports the SDK."""
    code = "import sys, dex_ha.worker, dex_ha.client, dex_ha.models; sys.exit(1 if 'openai' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], env=env_with_checkout(), timeout=60).returncode == 0


@pytest.mark.parametrize("api", APIS)
async def test_an_error_in_the_middle_of_the_stream_is_retryable(fake: FakeOpenAI, models: Any, api: str) -> None:
    fake.queue(Reply("one two three", error_after=2, error_message="The server had an error"))
    sink = TextSink()
    with pytest.raises(Exception, match="The server had an error") as raised:
        await models(api).respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), sink)
    assert not isinstance(raised.value, NonRetryableError)
    assert sink.texts == ["one ", "two "]
