"""Benchmarks of the tool-call and reasoning parsers per streamed token.

The deltas of one stream of 2000 tokens of mixed-script text (the byte-level test tokenizer,
one token per delta, as a worker detokenizes at one token per chunk) are fed to a fresh parser
of every format: plain text with no call, the cost the goal bounds (≤ 1 µs per token, on top
of detokenization, while no call is in progress); the same text with a ``<`` (a marker's
first character) every ~10 tokens, which takes the slow path; and the text followed by two
calls. The reasoning parser is timed inside and after its section. The server's
`tsfront.serve.core.parsing.OutputParser` (what a chat stream with tools or reasoning runs per
chunk: the parsers chained, plus the pieces it hands the response) is timed on the plain text,
over ``hermes`` alone and over ``qwen3`` reasoning then ``hermes``.

Run the table: ``.venv/bin/python tsfront/bench/micro/bench_tools.py``; under pytest-benchmark:
``.venv/bin/python -m pytest tsfront/bench/micro -k tools``.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tsfront.text import TextModel
from tsfront.text.reasoning import make_reasoning_parser
from tsfront.text.testing import make_test_model, mixed_text
from tsfront.text.tools import TOOL_PARSERS, make_tool_parser

TOKENS = 2000
ARGS = {"city": "Paris", "days": 3, "query": "a b c " * 20}
CALLS = {
    "hermes": "\n".join(
        f'<tool_call>\n{{"name": "f{i}", "arguments": {json.dumps(ARGS)}}}\n</tool_call>'
        for i in range(2)
    ),
    "qwen3_coder": "\n".join(
        f"<tool_call>\n<function=f{i}>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
        "</tool_call>"
        for i in range(2)
    ),
    "llama3_json": "<|python_tag|>"
    + "; ".join(f'{{"name": "f{i}", "parameters": {json.dumps(ARGS)}}}' for i in range(2)),
    "mistral": "".join(f"[TOOL_CALLS]f{i}[ARGS]{json.dumps(ARGS)}" for i in range(2)),
    "deepseek_v3": "<｜tool▁calls▁begin｜>"
    + "".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>f{i}\n```json\n{json.dumps(ARGS)}\n```"
        "<｜tool▁call▁end｜>"
        for i in range(2)
    )
    + "<｜tool▁calls▁end｜>",
    "deepseek_v31": "<｜tool▁calls▁begin｜>"
    + "".join(
        f"<｜tool▁call▁begin｜>f{i}<｜tool▁sep｜>{json.dumps(ARGS)}<｜tool▁call▁end｜>"
        for i in range(2)
    )
    + "<｜tool▁calls▁end｜>",
    "pythonic": "[" + ", ".join(f'f{i}(city="Paris", days=3)' for i in range(2)) + "]",
    "deepseek_v32": "<｜DSML｜function_calls>\n"
    + "".join(
        f'<｜DSML｜invoke name="f{i}">\n<｜DSML｜parameter name="query" string="true">'
        f"{ARGS['query']}</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
        for i in range(2)
    )
    + "</｜DSML｜function_calls>",
    "deepseek_v4": "<｜DSML｜tool_calls>\n"
    + "".join(
        f'<｜DSML｜invoke name="f{i}">\n<｜DSML｜parameter name="query" string="true">'
        f"{ARGS['query']}</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
        for i in range(2)
    )
    + "</｜DSML｜tool_calls>",
    "kimi_k2": "<|tool_calls_section_begin|>"
    + "".join(
        f"<|tool_call_begin|>functions.f{i}:{i}<|tool_call_argument_begin|>{json.dumps(ARGS)}"
        "<|tool_call_end|>"
        for i in range(2)
    )
    + "<|tool_calls_section_end|>",
    "kimi_k3": "<|open|>tools<|sep|>"
    + "".join(
        f'<|open|>call tool="f{i}" index="{i + 1}"<|sep|><|open|>argument key="query" '
        f'type="string"<|sep|>{ARGS["query"]}<|close|>argument<|sep|><|close|>call<|sep|>'
        for i in range(2)
    )
    + "<|close|>tools<|sep|>",
    "glm45": "".join(
        f"<tool_call>f{i}\n<arg_key>query</arg_key>\n<arg_value>{ARGS['query']}</arg_value>\n"
        "</tool_call>"
        for i in range(2)
    ),
    "glm47": "".join(
        f"<tool_call>f{i}<arg_key>query</arg_key><arg_value>{ARGS['query']}</arg_value></tool_call>"
        for i in range(2)
    ),
    "minimax_m2": "<minimax:tool_call>\n"
    + "".join(
        f'<invoke name="f{i}">\n<parameter name="query">{ARGS["query"]}</parameter>\n</invoke>\n'
        for i in range(2)
    )
    + "</minimax:tool_call>",
    "minimax_m3": "]<]minimax[>[<tool_call>\n"
    + "".join(
        f']<]minimax[>[<invoke name="f{i}">]<]minimax[>[<query>{ARGS["query"]}'
        "]<]minimax[>[</query>]<]minimax[>[</invoke>\n"
        for i in range(2)
    )
    + "]<]minimax[>[</tool_call>",
    "longcat": "\n".join(
        f'<longcat_tool_call>\n{{"name": "f{i}", "arguments": {json.dumps(ARGS)}}}\n'
        "</longcat_tool_call>"
        for i in range(2)
    ),
    "nemotron": "<TOOLCALL>"
    + json.dumps([{"name": f"f{i}", "arguments": ARGS} for i in range(2)])
    + "</TOOLCALL>",
    "inkling": "".join(
        f'<|message_model|>f{i}<|content_invoke_tool_json|>{{"name": "f{i}", "args": '
        f"{json.dumps(ARGS)}}}<|end_message|>"
        for i in range(2)
    ),
}


def text_deltas(model: TextModel, every_lt: int = 0) -> list[str]:
    """TOKENS one-token deltas of mixed-script text (a "<" inserted every ``every_lt``)."""
    ids: list[int] = []
    seed = 0
    while len(ids) < TOKENS:
        ids += model.encode(mixed_text(seed, 200), add_special_tokens=False)
        seed += 1
    detok = model.detokenizer(None)
    deltas = [detok.step([t]) for t in ids[:TOKENS]]
    if every_lt:
        deltas = [d + " <" if i % every_lt == 0 else d for i, d in enumerate(deltas)]
    return deltas


def feeder(name: str, deltas: list[str]) -> Callable[[], int]:
    def run() -> int:
        parser = make_tool_parser(name)
        feed = parser.feed
        n = 0
        for d in deltas:
            n += len(feed(d))
        return n + len(parser.finish())

    return run


def reasoning_feeder(deltas: list[str], inside: bool) -> Callable[[], int]:
    def run() -> int:
        parser = make_reasoning_parser("deepseek_r1", starts_in_reasoning=inside)
        feed = parser.feed
        for d in deltas:
            feed(d)
        return len(parser.finish()[0])

    return run


def output_feeder(deltas: list[str], reasoning: bool) -> Callable[[], int]:
    from tsfront.serve.core.parsing import OutputParser

    def run() -> int:
        parser = OutputParser(
            make_reasoning_parser("qwen3") if reasoning else None, make_tool_parser("hermes")
        )
        feed = parser.feed
        for d in deltas:
            feed(d)
        return len(parser.finish().content)

    return run


def us_per_token(run: Callable[[], int], rounds: int, tokens: int = TOKENS) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best / tokens * 1e6


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> TextModel:
    return TextModel.load(make_test_model(tmp_path_factory.mktemp("bench-tools"), "bytelevel"))


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_tool_parser_plain_text_per_token(benchmark, model: TextModel, name: str) -> None:
    deltas = text_deltas(model)
    benchmark(feeder(name, deltas))
    parsed = make_tool_parser(name).parse("".join(deltas))
    assert parsed.content == "".join(deltas) and not parsed.calls
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["us_per_token"] = benchmark.stats.stats.min / TOKENS * 1e6


def main(rounds: int = 30) -> None:
    """Print µs per token for every parser and case, best of ``rounds``."""
    with tempfile.TemporaryDirectory() as tmp:
        model = TextModel.load(make_test_model(Path(tmp), "bytelevel"))
        plain = text_deltas(model)
        angled = text_deltas(model, every_lt=10)
    print(f"{TOKENS} one-token deltas of mixed-script text, best of {rounds} rounds, µs per token")
    print(f"{'parser':<14} {'plain':>7} {'< every 10':>11} {'text + 2 calls':>15}")
    for name in sorted(TOOL_PARSERS):
        with_calls = plain + list(CALLS[name])  # the calls one character per delta
        a = us_per_token(feeder(name, plain), rounds)
        b = us_per_token(feeder(name, angled), rounds)
        c = us_per_token(feeder(name, with_calls), rounds, len(with_calls))
        print(f"{name:<14} {a:>7.2f} {b:>11.2f} {c:>15.2f}")
    inside = us_per_token(reasoning_feeder(plain, True), rounds)
    after = us_per_token(reasoning_feeder(plain, False), rounds)
    print(f"reasoning deepseek_r1: inside the section {inside:.2f}, content {after:.2f}")
    alone = us_per_token(output_feeder(plain, False), rounds)
    both = us_per_token(output_feeder(plain, True), rounds)
    print(f"serve OutputParser, plain text: hermes {alone:.2f}, qwen3 + hermes {both:.2f}")


if __name__ == "__main__":
    main()
