"""A stream's parsing costs CPU time linear in its output, whatever the output (issue 36, item 10).

The outputs are the ones a hostile (or stuck) model writes to make a parser hold text back and
re-read it: a long run of blanks or of a marker's prefix inside a call, before a call, before
``<think>``; a name or an id that never ends; thousands of tiny calls or markers in one
non-streamed output. Each case is fed to the parser objects directly, ``n`` deltas and then
``4 n``; the CPU time (``time.process_time``, best of three) of the second may be at most
``RATIO`` times the first: linear work gives about 4, work quadratic in the output about 16.
A case whose first run alone takes over ``GUARD`` seconds (a few milliseconds when linear)
fails at once, naming the time, instead of running for minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tsfront.serve.core.parsing import OutputParser, Pieces
from tsfront.serve.responses.endpoints import ResponsesFormat, ResponsesRequest
from tsfront.text.reasoning import make_reasoning_parser
from tsfront.text.tools import make_tool_parser
from tsfront.text.tools.constrained import NamedToolParser, RequiredToolParser

N = 1000
RATIO = 8.0
GUARD = 1.5
BLANK = " " * 127 + "\n"  # a 128-character token of blanks
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"


def cpu(run: Callable[[int], object], n: int) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        run(n)
        best = min(best, time.process_time() - t0)
    return best


def assert_linear(run: Callable[[int], object]) -> None:
    small = cpu(run, N)
    assert small < GUARD, f"{N} deltas took {small:.2f} s of CPU: quadratic"
    large = cpu(run, 4 * N)
    assert large <= RATIO * max(small, 1e-4), (
        f"{N} deltas: {small * 1e3:.1f} ms, {4 * N}: {large * 1e3:.1f} ms "
        f"(x{large / small:.1f}; linear is ~4, quadratic ~16)"
    )


def tool_parser(name: str):  # type: ignore[no-untyped-def]
    if name == "required":
        return RequiredToolParser(None)
    if name == "named":
        return NamedToolParser(None, "f")
    return make_tool_parser(name)


# (parser, what comes first, the delta repeated n times)
STREAMED = [
    ("hermes", "<tool_call>", BLANK),
    ("hermes", "<tool_call>", "<" * 128),
    ("hermes", "", "<tool_cal" * 14),
    ("qwen3_coder", "<tool_call>", BLANK),
    ("qwen3_coder", "<function=f>", BLANK),
    ("qwen3_coder", "<tool_call>", "</tool_cal" * 12),
    ("llama3_json", "<|python_tag|>", BLANK),
    ("llama3_json", "", BLANK),
    ("llama3_json", '{"name": "f", "parameters": {"a": "', "a" * 128),
    ("mistral", "[TOOL_CALLS]", BLANK),
    ("mistral", "[TOOL_CALLS]", "a" * 128),
    ("mistral", "[TOOL_CALLS]f[ARGS]", BLANK),
    ("mistral", "[TOOL_CALLS]f[CALL_ID]", "a" * 128),
    ("mistral", "[TOOL_CALLS][", BLANK),
    ("deepseek_v3", DS_CALLS_BEGIN + DS_CALL_BEGIN, BLANK),
    ("deepseek_v31", DS_CALLS_BEGIN + DS_CALL_BEGIN, "<｜tool▁call▁en" * 9),
    ("pythonic", "", BLANK),
    ("pythonic", "[", BLANK),
    ("pythonic", "<|python_start|>", BLANK),
    ("required", "", BLANK),
    ("required", "[", BLANK),
    ("named", "{", BLANK),
    ("deepseek_v32", "<｜DSML｜function_calls>", BLANK),
    ("deepseek_v32", '<｜DSML｜function_calls><｜DSML｜invoke name="f">', "<" * 128),
    ("deepseek_v4", '<｜DSML｜tool_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="k" '
     'string="false">', "</｜DSML｜para" * 10),
    ("kimi_k2", "<|tool_calls_section_begin|>", BLANK),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>", "a" * 128),
    ("glm45", "<tool_call>", "a" * 128),
    ("glm45", "<tool_call>f\n<arg_key>k</arg_key><arg_value>", "</arg_valu" * 12),
    ("minimax_m2", '<minimax:tool_call><invoke name="f"><parameter name="k">', "<" * 128),
    ("minimax_m2", "<minimax:tool_call><invoke ", "a" * 128),
    ("longcat", "<longcat_tool_call>", BLANK),
    ("nemotron", "<TOOLCALL>[", BLANK),
    ("kimi_k3", '<|open|>tools<|sep|><|open|>call tool="f"<|sep|><|open|>argument key="k" '
     'type="string"<|sep|>', "<|close|>argumen" * 8),
    ("kimi_k3", '<|open|>tools<|sep|><|open|>call tool="', "a" * 128),
    ("minimax_m3", ']<]minimax[>[<tool_call>]<]minimax[>[<invoke name="f">]<]minimax[>[<k>',
     "]<]minimax[>" * 10),
    ("inkling", "<|message_model|>", "a" * 128),
    ("inkling", "<|content_invoke_tool_json|>", BLANK),
]  # fmt: skip


@pytest.mark.parametrize(("name", "first", "delta"), STREAMED)
def test_a_held_run_costs_linear_time(name: str, first: str, delta: str) -> None:
    def run(n: int) -> None:
        parser = tool_parser(name)
        parser.feed(first)
        for _ in range(n):
            parser.feed(delta)
        parser.finish()

    assert_linear(run)


# (parser, a whole output made of n repetitions)
WHOLE = [
    ("hermes", lambda n: '<tool_call>{"name": "f"}</tool_call>' * n * 4),
    ("deepseek_v3", lambda n: DS_CALLS_END * n * 4),
    ("deepseek_v31", lambda n: (DS_CALLS_BEGIN + DS_CALLS_END) * n * 2),
    ("qwen3_coder", lambda n: "<tool_call>" + "<function=" * n * 4 + "</tool_call>"),
    ("qwen3_coder", lambda n: "<tool_call><function=f>" + "<parameter=" * n * 4 + "</function>"),
    ("pythonic", lambda n: "[f()]" + "[]" * n * 8),
    ("mistral", lambda n: "[TOOL_CALLS]f[ARGS]{}" * n * 2),
    ("llama3_json", lambda n: '{"name": "f"};' * n * 4),
    ("glm45", lambda n: "<tool_call>f</tool_call>" * n * 4),
    ("deepseek_v32", lambda n: "<｜DSML｜function_calls>"
     + '<｜DSML｜invoke name="f"></｜DSML｜invoke>' * n * 4 + "</｜DSML｜function_calls>"),
    ("kimi_k2", lambda n: ("<|tool_calls_section_begin|><|tool_calls_section_end|>") * n * 2),
    ("minimax_m2", lambda n: "<minimax:tool_call>" + '<invoke name="f"></invoke>' * n * 4
     + "</minimax:tool_call>"),
    ("kimi_k3", lambda n: "<|open|>response<|sep|>x" * n * 4),
    ("inkling", lambda n: "<|end_message|>" * n * 4),
    ("minimax_m3", lambda n: "]<]minimax[>[<tool_call>"
     + ']<]minimax[>[<invoke name="f">]<]minimax[>[</invoke>' * n * 2
     + "]<]minimax[>[</tool_call>"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "make"), WHOLE, ids=[f"{n}-{i}" for i, (n, _) in enumerate(WHOLE)]
)
def test_a_whole_output_of_many_small_pieces_costs_linear_time(
    name: str, make: Callable[[int], str]
) -> None:
    texts = {n: make(n) for n in (N, 4 * N)}
    assert_linear(lambda n: tool_parser(name).parse(texts[n]))


@pytest.mark.parametrize(
    ("name", "inside", "delta"),
    [
        ("deepseek_r1", False, BLANK),
        ("deepseek_r1", True, "<" * 128),
        ("deepseek_r1", True, "</think" * 18),
        ("kimi_k3", False, "<|close|>respons" * 8),
        ("inkling", False, "<|content_thinkin" * 7),
        ("inkling", True, "<|end_messag" * 10),
    ],
)
def test_the_reasoning_parser_costs_linear_time(name: str, inside: bool, delta: str) -> None:
    def run(n: int) -> None:
        parser = make_reasoning_parser(name, starts_in_reasoning=inside)
        for _ in range(n):
            parser.feed(delta)
        parser.finish()

    assert_linear(run)


def test_blank_content_held_by_the_server_costs_linear_time() -> None:
    def run(n: int) -> None:
        parser = OutputParser(None, make_tool_parser("hermes"))
        for _ in range(n):
            parser.feed(BLANK)
        parser.finish()
        parser.message()

    assert_linear(run)


def test_a_responses_stream_of_text_costs_linear_time() -> None:
    class Text:  # what ResponsesFormat reads of the model: nothing on this path
        pass

    def run(n: int) -> None:
        fmt = ResponsesFormat("m", Text(), ResponsesRequest())
        fmt.opening(0)
        for _ in range(n):
            fmt.pieces(0, Pieces(content="a" * 128))
        fmt.pieces(0, Pieces(reasoning="b"))  # closes the message item

    assert_linear(run)


def test_a_responses_stream_of_call_arguments_costs_linear_time() -> None:
    # A long call's arguments stream in many fragments (one per token): the function_call
    # item's arguments are joined once, not re-copied per fragment.
    from tsfront.text.tools import CallArgs, CallStart

    class Text:
        pass

    def run(n: int) -> None:
        fmt = ResponsesFormat("m", Text(), ResponsesRequest())
        fmt.opening(0)
        fmt.pieces(0, Pieces(calls=[CallStart(0, "call_x", "f")]))
        for _ in range(n):
            fmt.pieces(0, Pieces(calls=[CallArgs(0, "a" * 128)]))
        fmt.pieces(0, Pieces(reasoning="b"))  # closes the function_call item

    assert_linear(run)


def test_a_long_call_streamed_one_character_at_a_time_costs_linear_time() -> None:
    # Every format reads a call's text once, however it is split (hermes, a JSON string
    # argument one character per delta; qwen3_coder, an XML string value).
    for name, head, tail in (
        ("hermes", '<tool_call>{"name": "f", "arguments": {"content": "', '"}}</tool_call>'),
        ("qwen3_coder", "<tool_call><function=f><parameter=content>", "</parameter>"),
        ("mistral", '[TOOL_CALLS]f[ARGS]{"content": "', '"}'),
    ):

        def run(n: int, name: str = name, head: str = head, tail: str = tail) -> None:
            parser = make_tool_parser(name)
            parser.feed(head)
            for _ in range(n * 8):
                parser.feed("x")
            parser.feed(tail)
            parser.finish()

        assert_linear(run)
