"""Fake model APIs on 127.0.0.1, for tests of anything that calls a model provider: one
server (`server.FakeModelServer`) with two faces that speak the real wire formats, so the
official SDKs talk to them as to the real APIs, offline.

- `openai_api.FakeOpenAI`: the Responses API and Chat Completions (`openai` SDK).
- `anthropic_api.FakeAnthropic`: the Messages API (`anthropic` SDK, the Claude Code CLI).

The server holds what the faces share: start and stop on a free port, the recorded
requests, the queue of scripted answers, streaming as server-sent events with a stall or a
mid-stream error after some deltas. Each face adds its routes, its reply and error types
and the JSON and event sequence of its API.
"""
