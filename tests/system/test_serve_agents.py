"""An agent loop of a published agent library against ``tsfront serve``: the OpenAI Agents SDK.

The SDK (``openai-agents``, its Chat Completions model over an ``AsyncOpenAI`` client) runs
an agent with one Python function tool against a real server (``--tool-call-parser hermes``)
on a simulated rank whose script answers the question with a call of that tool and, once the
prompt carries the tool's result, with the final answer. The SDK sends ``tools`` with
``tool_choice`` left to the server's default (``auto``), parses ``tool_calls``, runs the
function, sends the history back (the assistant's call, a ``role: "tool"`` message) and
returns the final text: run whole and streamed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agents  # openai-agents (the test extra)
import pytest
from support.serve_fixtures import ServeProcess

from tsfront.sim import SimGroup
from tsfront.sim.script import Script
from tsfront.text import TextModel
from tsfront.text.testing import make_test_model

DEADLINE = 60.0
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is 22 C and sunny in Paris."
RULES = [
    # The second turn: the tool's result is in the prompt.
    ("22 C and sunny in Paris", ANSWER),
    ("weather in Paris", CALL),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    model_dir: Path = make_test_model(
        tmp_path_factory.mktemp("agents") / "agent-model", "bytelevel"
    )
    model = TextModel.load(model_dir)
    server = ServeProcess(
        [
            "--model", str(model_dir), "--handshake", "tcp://127.0.0.1:0", "--num-engines", "1",
            "--workers", "1", "--port", "0", "--handshake-timeout", "60",
            "--tool-call-parser", "hermes",
        ]
    )  # fmt: skip
    group = None
    try:
        handshake = server.wait_line(r"^handshake: (\S+)", DEADLINE).group(1)
        group = SimGroup(
            handshake,
            1,
            script=Script(RULES, model_dir),
            vocab_size=model.tokenizer.get_vocab_size(with_added_tokens=True),
            eos_token_id=model.eos_token_ids[0],
            chunk_tokens=3,
            step_ms=0.5,
        ).start()
        url = server.wait_line(r"^listening: (http://\S+)", 90).group(1)
        calls: list[str] = []
        yield url, calls
        prompts = [
            model.decode(r.input_ids, skip_special_tokens=False)
            for r in group.engines[0].requests()
        ]
        assert any("22 C and sunny in Paris" in p for p in prompts)
    finally:
        assert server.stop() == 0
        if group is not None:
            group.stop()


def _agent(url: str, calls: list[str]) -> Any:
    from openai import AsyncOpenAI

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"22 C and sunny in {city}"

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    model = agents.OpenAIChatCompletionsModel(model="agent-model", openai_client=client)
    return agents.Agent(
        name="weather", instructions="Answer with the tools.", tools=[get_weather], model=model
    )


async def test_an_agent_calls_a_python_tool_and_answers(served: tuple[str, list[str]]) -> None:
    url, calls = served
    result = await agents.Runner.run(_agent(url, calls), "What is the weather in Paris?")
    assert result.final_output == ANSWER
    assert calls == ["Paris"]


async def test_the_streamed_agent_loop_too(served: tuple[str, list[str]]) -> None:
    url, calls = served
    calls.clear()
    run = agents.Runner.run_streamed(_agent(url, calls), "What is the weather in Paris?")
    kinds = [event.type async for event in run.stream_events()]
    assert run.final_output == ANSWER
    assert calls == ["Paris"] and "run_item_stream_event" in kinds
