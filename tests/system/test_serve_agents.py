"""An agent loop of a published agent library against ``tsfront serve``: the OpenAI Agents SDK.

The SDK (``openai-agents``, its Chat Completions model over an ``AsyncOpenAI`` client) runs
an agent with one Python function tool against a real server on a simulated rank whose script
answers the question with a call of that tool and, once the prompt carries the tool's result,
with the final answer. One server per format shape: JSON arguments (``--tool-call-parser
hermes``) and XML parameters (``glm47``, GLM-4.7's key/value tags, the tags special tokens as
in GLM's tokenizer). The SDK sends ``tools`` with ``tool_choice`` left to the server's default
(``auto``), parses ``tool_calls``, runs the function, sends the history back (the assistant's
call, a ``role: "tool"`` message) and returns the final text: run whole and streamed.

A call the model breaks after its start went out (docs/TEXT.md: it stays a call whose
arguments are the unclosed object written so far) is what an agent loop can recover from: the
SDK cannot parse the arguments, never runs the function with them, and hands the error back to
the model as the tool's output; the model calls again, and the run ends with the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import agents  # openai-agents (the test extra)
import pytest
from support.serve_fixtures import ScriptedServe, weather_agent

from tsfront.sim.script import Script
from tsfront.text.testing import make_test_model

DEADLINE = 60.0
ANSWER = "It is 22 C and sunny in Paris."
LYON = "It is 22 C and sunny in Lyon."
# The SDK's default tool error, sent back as the tool's output.
TOOL_ERROR = "An error occurred while running the tool"

# Each format: a call of get_weather(city), and one the model breaks after its start.
CALLS = {
    "hermes": (
        lambda city: (
            f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}'
            "\n</tool_call>"
        ),
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": NaN}}\n</tool_call>',
    ),
    "glm47": (
        lambda city: (
            f"<tool_call>get_weather<arg_key>city</arg_key><arg_value>{city}"
            "</arg_value></tool_call>"
        ),
        "<tool_call>get_weather<arg_key>city</arg_key>Lyon</tool_call>",
    ),
}
GLM_TAGS = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
            "</arg_value>"]  # fmt: skip


def rules(parser: str) -> list[tuple[str, str]]:
    call, broken = CALLS[parser]
    return [
        # The last turn: the tool's result is in the prompt.
        ("22 C and sunny in Paris", ANSWER),
        ("22 C and sunny in Lyon", LYON),
        # After the broken call: its error came back as the tool's output.
        (TOOL_ERROR, call("Lyon")),
        ("weather in Lyon", broken),
        ("weather in Paris", call("Paris")),
    ]


#: The served URL, the tool's calls (each test clears it), the prompts the rank was sent.
Served = tuple[str, list[str], Callable[[], list[str]]]


@pytest.fixture(scope="module", params=sorted(CALLS))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    parser = request.param
    model_dir: Path = make_test_model(
        tmp_path_factory.mktemp("agents") / "agent-model",
        "bytelevel",
        special_tokens=GLM_TAGS if parser == "glm47" else (),
    )
    s = ScriptedServe.start(
        model_dir,
        Script(rules(parser), model_dir),
        args=["--tool-call-parser", parser],
        chunk_tokens=3,
    )

    def prompts() -> list[str]:
        """The prompts the rank was sent so far, as text."""
        return [
            s.model.decode(r.input_ids, skip_special_tokens=False)
            for r in s.group.engines[0].requests()
        ]

    try:
        yield s.url, [], prompts
    finally:
        s.close()


def _agent(url: str, calls: list[str]) -> Any:
    return weather_agent(url, "agent-model", calls)


async def test_an_agent_calls_a_python_tool_and_answers(served: Served) -> None:
    url, calls, prompts = served
    calls.clear()
    result = await agents.Runner.run(_agent(url, calls), "What is the weather in Paris?")
    assert result.final_output == ANSWER
    assert calls == ["Paris"]
    # The tool's result went back to the model in the last turn's prompt.
    assert any("22 C and sunny in Paris" in p for p in prompts())


async def test_the_streamed_agent_loop_too(served: Served) -> None:
    url, calls, _ = served
    calls.clear()
    run = agents.Runner.run_streamed(_agent(url, calls), "What is the weather in Paris?")
    kinds = [event.type async for event in run.stream_events()]
    assert run.final_output == ANSWER
    assert calls == ["Paris"] and "run_item_stream_event" in kinds


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_call_the_model_breaks_goes_back_to_it_and_the_run_recovers(
    served: Served, streamed: bool
) -> None:
    # The first answer's call is broken after its start went out: the SDK cannot parse its
    # arguments (an unclosed object), does not run the function, and sends its error back;
    # the model calls again, correctly, and answers. The function ran once, with "Lyon".
    url, calls, _ = served
    calls.clear()
    agent = _agent(url, calls)
    if streamed:
        run = agents.Runner.run_streamed(agent, "What is the weather in Lyon?")
        async for _ in run.stream_events():
            pass
        output = run.final_output
    else:
        output = (await agents.Runner.run(agent, "What is the weather in Lyon?")).final_output
    assert output == LYON
    assert calls == ["Lyon"]
