"""The fake OpenAI server (harness/fake_models/openai_api.py) against the real `openai` SDK: what
the SDK parses out of its answers is what was scripted, streamed or not, on both APIs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionToolParam
from openai.types.responses import FunctionToolParam

from harness.fake_models.openai_api import CHAT_PATH, RESPONSES_PATH, Call, Failure, FakeOpenAI, Reply

TOOLS_RESPONSES: list[FunctionToolParam] = [
    {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "strict": False}
]
TOOLS_CHAT: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def clients() -> AsyncIterator[list[AsyncOpenAI]]:
    """The SDK clients a test made, closed after it (their connections belong to its loop)."""
    made: list[AsyncOpenAI] = []
    yield made
    for client in made:
        await client.close()


# An AsyncOpenAI on a fake (keyword arguments: more AsyncOpenAI options).
ClientOf = Callable[..., AsyncOpenAI]


@pytest.fixture
def client_of(clients: list[AsyncOpenAI]) -> ClientOf:
    def make(fake: FakeOpenAI, **options: Any) -> AsyncOpenAI:
        client = AsyncOpenAI(api_key="sk-test", base_url=fake.base_url, max_retries=0, **options)
        clients.append(client)
        return client

    return make


async def test_a_streamed_response_gives_the_sdk_its_deltas_and_final_response(
    client_of: ClientOf, fake: FakeOpenAI
) -> None:
    fake.queue(
        Reply(
            "Let me look that up.",
            [Call("lookup", {"order": "A17"}, call_id="call_1")],
            input_tokens=12,
            output_tokens=7,
        )
    )
    deltas, names = [], []
    async with client_of(fake).responses.stream(
        model="gpt-test", input="where is A17?", tools=TOOLS_RESPONSES
    ) as stream:
        async for event in stream:
            names.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = await stream.get_final_response()
    assert deltas == ["Let ", "me ", "look ", "that ", "up."]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert final.output_text == "Let me look that up."
    [call] = [item for item in final.output if item.type == "function_call"]
    assert (call.call_id, call.name, call.arguments) == ("call_1", "lookup", '{"order": "A17"}')
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (12, 7, 19)
    [request] = fake.requests
    assert request.path == RESPONSES_PATH and request.stream and request.body["input"] == "where is A17?"
    assert request.headers["Authorization"] == "Bearer sk-test"


async def test_a_response_without_streaming(client_of: ClientOf, fake: FakeOpenAI) -> None:
    fake.queue(Reply("Done.", incomplete=True))
    response = await client_of(fake).responses.create(model="gpt-test", input="hi")
    assert response.output_text == "Done." and response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert not fake.requests[0].stream


async def test_a_streamed_chat_completion_gives_content_tool_calls_and_usage(
    client_of: ClientOf, fake: FakeOpenAI
) -> None:
    fake.queue(
        Reply(["Chec", "king"], [Call("lookup", {"order": "A17"}, call_id="call_9")], input_tokens=5, output_tokens=3)
    )
    stream = await client_of(fake).chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS_CHAT,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, arguments, ids, finish, usage = [], [], [], None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                ids += [call.id] if call.id else []
                assert call.function is not None  # every tool call chunk of the fake names its function
                arguments.append(call.function.arguments or "")
    assert "".join(content) == "Checking" and ids == ["call_9"] and "".join(arguments) == '{"order": "A17"}'
    assert finish == "tool_calls" and usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (5, 3)
    assert fake.requests[0].path == CHAT_PATH


async def test_a_chat_completion_without_streaming(client_of: ClientOf, fake: FakeOpenAI) -> None:
    fake.queue(Reply(tool_calls=[Call("lookup", {"q": 1})]))
    completion = await client_of(fake).chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}]
    )
    message = completion.choices[0].message
    assert message.content is None and completion.choices[0].finish_reason == "tool_calls"
    assert [c.type for c in message.tool_calls or []] == ["function"]
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or [] if c.type == "function"]
    assert calls == [("lookup", '{"q": 1}')]


@pytest.mark.parametrize(
    "failure, error_class",
    [
        (Failure(429, "Rate limit reached", retry_after=2), openai.RateLimitError),
        (Failure(500, "The server had an error"), openai.InternalServerError),
        (Failure(400, "Invalid value for 'input'", param="input"), openai.BadRequestError),
        (Failure(401, "Incorrect API key provided"), openai.AuthenticationError),
    ],
)
async def test_failures_reach_the_sdk_as_its_own_errors(
    client_of: ClientOf, fake: FakeOpenAI, failure: Failure, error_class: type[openai.APIStatusError]
) -> None:
    fake.queue(failure)
    with pytest.raises(error_class) as raised:
        await client_of(fake).responses.create(model="gpt-test", input="hi", stream=True)
    assert raised.value.status_code == failure.status
    assert isinstance(raised.value.body, dict) and raised.value.body["message"] == failure.message
    if failure.retry_after is not None:
        assert raised.value.response.headers["Retry-After"] == "2"


async def test_a_stalled_stream_sends_some_deltas_then_nothing(client_of: ClientOf, fake: FakeOpenAI) -> None:
    fake.queue(Reply("one two three four", stall_after=2))
    seen: list[str] = []
    stream = await client_of(fake, timeout=0.5).responses.create(model="gpt-test", input="hi", stream=True)
    with pytest.raises(openai.APITimeoutError):
        async for event in stream:
            if event.type == "response.output_text.delta":
                seen.append(event.delta)
    await fake.wait_stalled(deadline_s=1)
    assert seen == ["one ", "two "]


async def test_the_script_function_answers_after_the_queue_and_nothing_scripted_is_a_400(
    client_of: ClientOf, fake: FakeOpenAI
) -> None:
    client = client_of(fake)
    with pytest.raises(openai.BadRequestError, match="no reply scripted"):
        await client.responses.create(model="gpt-test", input="first")
    fake.queue(Reply("queued"))
    fake.script = lambda request: Reply(f"echo {request.body['input']}")
    answers = [(await client.responses.create(model="gpt-test", input=text)).output_text for text in ("a", "b")]
    assert answers == ["queued", "echo b"]
    assert [body["input"] for body in fake.bodies(RESPONSES_PATH)] == ["first", "a", "b"]


async def test_stop_ends_a_stalled_stream(client_of: ClientOf, fake: FakeOpenAI) -> None:
    fake.queue(Reply("one two", stall_after=1))
    stream = await client_of(fake).responses.create(model="gpt-test", input="hi", stream=True)
    reader = asyncio.create_task(_drain(stream))
    await fake.wait_stalled()
    await asyncio.wait_for(fake.stop(), 5)
    with pytest.raises(openai.APIConnectionError):
        await asyncio.wait_for(reader, 5)


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


async def test_an_error_in_the_middle_of_a_stream(client_of: ClientOf, fake: FakeOpenAI) -> None:
    client = client_of(fake)
    fake.queue(
        Reply("one two three", error_after=1, error_message="boom"),
        Reply("one two three", error_after=2, error_message="bang"),
    )
    events = [event async for event in await client.responses.create(model="gpt-test", input="hi", stream=True)]
    assert [e.type for e in events][-2:] == ["response.output_text.delta", "error"]
    error = events[-1]
    assert error.type == "error" and (error.message, error.code) == ("boom", "server_error")
    texts: list[str] = []
    with pytest.raises(openai.APIError, match="bang"):
        async for chunk in await client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            texts += [choice.delta.content or "" for choice in chunk.choices]
    assert "".join(texts) == "one two "
