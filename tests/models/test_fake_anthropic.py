"""The fake Anthropic API (harness/fake_models/anthropic_api.py) against the official SDK: what
the SDK parses from it is what the fake was scripted to say."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import pytest
from anthropic.types import Message, MessageParam, ToolParam, ToolResultBlockParam

from harness.fake_models.anthropic_api import ApiError, FakeAnthropic, Reply, tool_use
from harness.waiting import eventually

MESSAGES: list[MessageParam] = [{"role": "user", "content": "hi"}]
DEADLINE_S = 10.0


def sdk(fake: FakeAnthropic) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key="sk-test", base_url=fake.base_url, max_retries=0)


def first_text(message: Message) -> str:
    """The text of the message's first content block, which the test expects to be text."""
    block = message.content[0]
    assert block.type == "text", block
    return block.text


def error_body(error: anthropic.APIStatusError) -> dict[str, Any]:
    """The JSON error body the SDK parsed (the fake always sends one)."""
    assert isinstance(error.body, dict), error.body
    return error.body


async def test_a_streamed_reply_is_parsed_by_the_sdk_with_text_and_tool_input() -> None:
    reply = Reply.of("Let me look that up.", tool_use("lookup", {"order": "A17", "deep": [1, 2]}, id="toolu_1"))
    async with FakeAnthropic([reply]) as fake:
        client = sdk(fake)
        deltas, json_pieces = [], []
        async with client.messages.stream(model="claude-x", max_tokens=100, messages=MESSAGES) as stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    deltas.append(event.delta.text)
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    json_pieces.append(event.delta.partial_json)
            message = await stream.get_final_message()
    assert "".join(deltas) == "Let me look that up." and len(deltas) == 5
    assert len(json_pieces) == 2  # the tool input really arrives in pieces
    assert first_text(message) == "Let me look that up."
    tool_block = message.content[1]
    assert tool_block.type == "tool_use", tool_block
    assert (tool_block.id, tool_block.name, tool_block.input) == (
        "toolu_1",
        "lookup",
        {"order": "A17", "deep": [1, 2]},
    )
    assert message.stop_reason == "tool_use" and message.model == "claude-x"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    [recorded] = fake.requests
    assert recorded.stream and recorded.body["messages"] == MESSAGES and recorded.body["max_tokens"] == 100
    # The key travels as x-api-key or as a bearer token, depending on the SDK version.
    assert "sk-test" in (recorded.headers.get("x-api-key", "") + recorded.headers.get("authorization", ""))


async def test_a_plain_request_gets_the_whole_message_and_tool_ids_are_made_up() -> None:
    async with FakeAnthropic(
        [Reply.of(tool_use("a"), tool_use("b"), usage={"input_tokens": 3, "output_tokens": 4})]
    ) as fake:
        message = await sdk(fake).messages.create(model="m", max_tokens=10, messages=MESSAGES)
    ids = [block.id for block in message.content if block.type == "tool_use"]
    assert len(ids) == len(message.content)  # only the two tool_use blocks
    assert len(set(ids)) == 2 and all(i.startswith("toolu_") for i in ids)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 4)
    assert not fake.requests[0].stream


@pytest.mark.parametrize(
    "error, sdk_error",
    [
        (ApiError.rate_limited(retry_after=7), anthropic.RateLimitError),
        (ApiError.overloaded(), anthropic.APIStatusError),
        (ApiError.of_type("api_error"), anthropic.InternalServerError),
        (ApiError.of_type("invalid_request_error", "max_tokens: too big"), anthropic.BadRequestError),
        (ApiError.of_type("authentication_error", "invalid x-api-key"), anthropic.AuthenticationError),
    ],
)
async def test_injected_errors_carry_status_type_and_message(
    error: ApiError, sdk_error: type[anthropic.APIStatusError]
) -> None:
    async with FakeAnthropic([error, Reply.of("after")]) as fake:
        client = sdk(fake)
        with pytest.raises(sdk_error) as raised:
            await client.messages.create(model="m", max_tokens=10, messages=MESSAGES)
        assert raised.value.status_code == error.status
        assert error_body(raised.value)["error"] == {"type": error.type, "message": error.message}
        if error.retry_after is not None:
            assert raised.value.response.headers["retry-after"] == "7"
        # The failure used its queue item: the next request gets the next one.
        assert first_text(await client.messages.create(model="m", max_tokens=10, messages=MESSAGES)) == "after"


async def test_a_stream_stalls_after_some_deltas_until_the_client_gives_up() -> None:
    async with FakeAnthropic([Reply.of("one two three four five", stall_after_deltas=2)]) as fake:
        received: list[str] = []

        async def read() -> None:
            async with sdk(fake).messages.stream(model="m", max_tokens=10, messages=MESSAGES) as stream:
                async for event in stream:
                    if event.type == "content_block_delta":
                        assert event.delta.type == "text_delta", event.delta
                        received.append(event.delta.text)

        reader = asyncio.create_task(read())
        await eventually(
            lambda: fake.stalls > 0, "the fake to stall the stream", deadline_s=DEADLINE_S, interval_s=0.01
        )
        await asyncio.sleep(0.2)  # a stalled stream sends nothing more (checked below)
        assert received == ["one ", "two "] and not reader.done()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_an_error_event_in_the_middle_of_a_stream_reaches_the_sdk() -> None:
    reply = Reply.of("partial answer here", error=ApiError.overloaded(), error_after_deltas=1)
    async with FakeAnthropic([reply]) as fake:
        received: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as raised:
            async with sdk(fake).messages.stream(model="m", max_tokens=10, messages=MESSAGES) as stream:
                async for event in stream:
                    if event.type == "content_block_delta":
                        assert event.delta.type == "text_delta", event.delta
                        received.append(event.delta.text)
    assert received == ["partial "]
    assert error_body(raised.value)["error"]["type"] == "overloaded_error"


async def test_a_responder_answers_from_the_request_and_nothing_scripted_is_a_500() -> None:
    def echo(body: dict) -> Reply:
        return Reply.of(f"you said {body['messages'][-1]['content']}")

    async with FakeAnthropic(responder=echo) as fake:
        message = await sdk(fake).messages.create(model="m", max_tokens=10, messages=MESSAGES)
        assert first_text(message) == "you said hi"
        fake.responder = None
        with pytest.raises(anthropic.InternalServerError, match="no reply scripted"):
            await sdk(fake).messages.create(model="m", max_tokens=10, messages=MESSAGES)
    assert len(fake.bodies()) == 2


async def test_count_tokens_answers_and_is_recorded() -> None:
    async with FakeAnthropic() as fake:
        count = await sdk(fake).messages.count_tokens(model="m", messages=MESSAGES)
    assert count.input_tokens > 0 and fake.requests[0].path == "/v1/messages/count_tokens"


def test_only_replies_and_errors_can_be_queued() -> None:
    with pytest.raises(TypeError, match="Reply or an ApiError"):
        FakeAnthropic(["hello"])  # type: ignore[list-item]


TOOLS: list[ToolParam] = [{"name": "lookup", "input_schema": {"type": "object", "properties": {}}}]
CALL: MessageParam = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}]}
RESULT: ToolResultBlockParam = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}


@pytest.mark.parametrize(
    "messages, tools, refusal",
    [
        ([{"role": "assistant", "content": "hi"}], TOOLS, "roles must alternate"),
        ([*MESSAGES, {"role": "user", "content": "again"}], TOOLS, "roles must alternate"),
        (
            [*MESSAGES, CALL, {"role": "user", "content": [{"type": "text", "text": "note"}, RESULT]}],
            TOOLS,
            "without `tool_result` blocks immediately after: t1",
        ),
        (
            [*MESSAGES, CALL, {"role": "user", "content": [{"type": "text", "text": "note"}]}],
            TOOLS,
            "without `tool_result` blocks immediately after: t1",
        ),
        ([{"role": "user", "content": [RESULT]}], TOOLS, "unexpected `tool_use_id`"),
        ([*MESSAGES, CALL, {"role": "user", "content": [RESULT]}], None, "must define tools"),
        ([{"role": "user", "content": [{"type": "text", "text": " "}]}], TOOLS, "non-whitespace text"),
    ],
)
async def test_the_fake_refuses_what_the_real_api_refuses(
    messages: list[MessageParam], tools: list[ToolParam] | None, refusal: str
) -> None:
    async with FakeAnthropic([Reply.of("unused")]) as fake:
        with pytest.raises(anthropic.BadRequestError, match=refusal):
            await sdk(fake).messages.create(
                model="m", max_tokens=10, messages=messages, tools=tools if tools else anthropic.omit
            )
        # A valid request (results first, text after them) gets the scripted answer.
        valid: list[MessageParam] = [
            *MESSAGES,
            CALL,
            {"role": "user", "content": [RESULT, {"type": "text", "text": "note"}]},
        ]
        answer = await sdk(fake).messages.create(model="m", max_tokens=10, messages=valid, tools=TOOLS)
        assert first_text(answer) == "unused"
