"""ScriptedModel and the model messages: positions derived from the history, deterministic
call ids, word-sized streaming, summaries."""

from __future__ import annotations

from typing import Any

import pytest

from dex_ha.worker import ModelRequest, ModelResponse, ScriptedModel, ScriptExhausted, ToolCall


class Collect:
    """A DeltaSink that keeps what it is sent."""

    def __init__(self) -> None:
        self.deltas: list[dict[str, Any]] = []

    def send_text(self, text: str) -> None:
        self.deltas.append({"text": text})

    def send(self, delta: dict[str, Any]) -> None:
        self.deltas.append(delta)


def user(text: str) -> dict[str, Any]:
    return {"type": "user", "text": text}


def assistant(content: str) -> dict[str, Any]:
    return {"type": "assistant", "content": content, "tool_calls": []}


def request(*history: dict[str, Any], summary: str | None = None) -> ModelRequest:
    return ModelRequest(history=list(history), summary=summary, tools=[])


SCRIPT: list[ModelResponse | dict[str, Any]] = [
    {
        "content": "Let me look.",
        "tool_calls": [{"name": "lookup", "arguments": {"id": "7"}}, {"id": "mine", "name": "lookup", "arguments": {}}],
    },
    ModelResponse("Order 7 shipped.", usage={"input_tokens": 12}),
    {"content": "Anything else?"},
]


async def test_each_session_answers_from_its_own_position_in_the_script() -> None:
    model = ScriptedModel(SCRIPT)
    first = await model.respond(request(user("where is 7?")), Collect())
    other_session = await model.respond(request(user("hi")), Collect())
    second = await model.respond(request(user("where is 7?"), assistant("Let me look.")), Collect())
    assert first.content == other_session.content == "Let me look."
    assert second.content == "Order 7 shipped." and second.usage == {"input_tokens": 12}


async def test_a_repeated_attempt_gets_the_same_response_and_call_ids() -> None:
    history = [user("a"), assistant("x"), user("b")]
    again = [await ScriptedModel(SCRIPT).respond(request(*history), Collect()) for _ in range(2)]
    assert again[0] == again[1]
    history = [user("a")]
    response = await ScriptedModel(SCRIPT).respond(request(*history), Collect())
    # No id in the script: "c{position}_{index}"; an explicit id is kept.
    assert response.tool_calls == [ToolCall("c0_0", "lookup", {"id": "7"}), ToolCall("mine", "lookup", {})]


async def test_content_streams_as_word_pieces_that_join_back_exactly() -> None:
    text = "  Order 7\nshipped  on time. "
    sink = Collect()
    response = await ScriptedModel([{"content": text}]).respond(request(user("?")), sink)
    pieces = [d["text"] for d in sink.deltas]
    assert "".join(pieces) == text
    assert len(pieces) == 6 and all(p.strip().count(" ") == 0 for p in pieces)
    assert response.usage == {"input_items": 1, "output_words": 6}


async def test_running_out_of_script_is_an_error_that_names_the_position() -> None:
    model = ScriptedModel([{"content": "only"}])
    with pytest.raises(ScriptExhausted, match="#2"):
        await model.respond(request(user("a"), assistant("only"), user("b")), Collect())


async def test_a_function_script_sees_the_request_and_gets_ids_filled_in() -> None:
    seen: list[ModelRequest] = []

    def script(req: ModelRequest) -> dict[str, Any]:
        seen.append(req)
        return {"content": f"{len(req.history)} items", "tool_calls": [{"name": "t", "arguments": {}}]}

    async def async_script(req: ModelRequest) -> ModelResponse:
        return ModelResponse("async", [ToolCall(None, "t")])

    req = request(user("a"), assistant("b"), user("c"))
    response = await ScriptedModel(script).respond(req, Collect())
    assert seen == [req]
    assert response.content == "3 items" and response.tool_calls[0].id == "c1_0"
    assert (await ScriptedModel(async_script).respond(request(), Collect())).tool_calls[0].id == "c0_0"


async def test_a_function_script_that_raises_propagates() -> None:
    def overloaded(req: ModelRequest) -> dict[str, Any]:
        raise RuntimeError("429 too many requests")

    with pytest.raises(RuntimeError, match="429"):
        await ScriptedModel(overloaded).respond(request(user("a")), Collect())


async def test_default_summary_keeps_the_script_position_across_compaction() -> None:
    model = ScriptedModel(SCRIPT)
    compacted = [user("a"), assistant("Let me look."), user("b")]
    summary = await model.summarize(compacted, None)
    assert summary == "summary of 3 items (model responses so far: 1)"
    # After compaction the history holds only the newer items, yet the position is 1 + 1.
    response = await model.respond(request(assistant("Order 7 shipped."), user("c"), summary=summary), Collect())
    assert response.content == "Anything else?"
    # A second compaction adds to the count of the first summary.
    assert await model.summarize([assistant("x")], summary) == "summary of 1 items (model responses so far: 2)"


async def test_a_custom_summarizer_is_used_and_must_return_text() -> None:
    calls: list[tuple[int, str | None]] = []

    def summarizer(history: list[dict[str, Any]], summary: str | None) -> str:
        calls.append((len(history), summary))
        return "short"

    assert await ScriptedModel(SCRIPT, summarizer=summarizer).summarize([user("a")], "old") == "short"
    assert calls == [(1, "old")]
    with pytest.raises(TypeError, match="summarizer must return a string"):
        await ScriptedModel(SCRIPT, summarizer=lambda h, s: 3).summarize([], None)


@pytest.mark.parametrize(
    "responses, match",
    [
        ([{"content": 5}], r"responses\[0\]\.content"),
        ([{"content": "x"}, {"tool_calls": [{"arguments": {}}]}], r"responses\[1\]\.tool_calls\[0\]\.name"),
        ([{"tool_calls": [{"name": "t", "arguments": []}]}], r"arguments"),
        ([{"tool_calls": [{"name": "t", "id": 3}]}], r"\.id"),
        ([{"text": "x"}], "unknown field 'text'"),
        (["x"], r"responses\[0\]"),
        ("not a list", "responses"),
    ],
)
def test_bad_scripts_are_refused_when_built(responses: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        ScriptedModel(responses)


def test_model_response_as_result_is_the_run_model_result_shape() -> None:
    response = ModelResponse.coerce(
        {"content": "hi", "tool_calls": [ToolCall("a", "t", {"x": 1})], "usage": {"output_tokens": 1}}
    )
    assert response.as_result() == {
        "content": "hi",
        "usage": {"output_tokens": 1},
        "tool_calls": [{"id": "a", "name": "t", "arguments": {"x": 1}}],
    }
