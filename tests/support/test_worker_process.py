"""harness/worker_process.py: the options a parent gives reach the child's Worker as they
were given, and an option left unset is not passed at all (an earlier release's Worker may
not know it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.worker_process import WorkerOptions, parse_args

AGENTS = "tests.e2e.streaming_worker"
OWN_ARGS = ["--agent", "streamer", "--text", "hello there"]


def test_the_options_the_parent_gives_are_the_options_the_child_parses() -> None:
    given = WorkerOptions(token="t0k", poll_wait_ms=250, drain_timeout_s=0.1, backoff_max_s=0.2, max_concurrency=3)
    module, args, parsed = parse_args([AGENTS, "--urls", "http://a,http://b", *given.flags(), *OWN_ARGS])
    assert parsed == given
    assert args.urls.split(",") == ["http://a", "http://b"]
    assert (args.agent, args.text) == ("streamer", "hello there")  # the agents module's own options
    assert module.__name__ == AGENTS


def test_an_unset_option_is_not_given_to_the_worker() -> None:
    kwargs = WorkerOptions(drain_timeout_s=2.0).worker_kwargs()
    assert kwargs == {"token": None, "poll_wait_ms": 1_000, "drain_timeout_s": 2.0}


def test_an_agents_module_is_loaded_by_its_file_path_too() -> None:
    path = str(Path(__file__).resolve().parents[1] / "e2e" / "upgrade_worker.py")
    module, _, _ = parse_args([path, "--urls", "http://a"])
    assert [agent.name for agent in module.agents(None)] == [module.AGENT]


def test_the_agents_module_refuses_an_option_it_does_not_know() -> None:
    with pytest.raises(SystemExit):
        parse_args([AGENTS, "--urls", "http://a", *OWN_ARGS, "--no-such-option", "1"])
