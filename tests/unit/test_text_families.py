"""``--tool-call-parser auto`` / ``--reasoning-parser auto``: the family read from the model
folder (config.json, the chat template's markers, the name), the peers' names as aliases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tsfront.serve.core.chatsettings import ChatSettings, settle
from tsfront.text import TextModel
from tsfront.text.families import (
    FAMILIES,
    HARMONY,
    REASONING_ALIASES,
    TOOL_ALIASES,
    choose,
    detect,
)
from tsfront.text.reasoning import REASONING_PARSERS
from tsfront.text.testing import make_test_model
from tsfront.text.tools import TOOL_PARSERS

DS_CALLS = "<｜tool▁calls▁begin｜>"
DS_SEP = "<｜tool▁sep｜>"

# (config.json, chat template markers, name) -> (family, tool parser, reasoning parser)
CASES: list[tuple[dict[str, Any], str, str, tuple[str, str | None, str | None]]] = [
    ({"model_type": "gpt_oss"}, "", "", ("gpt-oss", HARMONY, HARMONY)),
    ({"architectures": ["GptOssForCausalLM"]}, "", "", ("gpt-oss", HARMONY, HARMONY)),
    ({"model_type": "deepseek_v32"}, "", "", ("DeepSeek-V3.2", "deepseek_v32", "deepseek_r1")),
    ({"model_type": "deepseek_v4"}, "", "", ("DeepSeek-V4", "deepseek_v4", "deepseek_v4")),
    (
        {"model_type": "deepseek_v3"},
        f"{DS_CALLS}{DS_SEP}name</think>",
        "",
        ("DeepSeek-V3.1", "deepseek_v31", "deepseek_r1"),
    ),
    (
        {"model_type": "deepseek_v3"},
        f"{DS_CALLS}{DS_SEP}\\n```json <think>",
        "",
        ("DeepSeek-R1", "deepseek_v3", "deepseek_r1"),
    ),
    ({"model_type": "deepseek_v3"}, f"{DS_CALLS}```json", "", ("DeepSeek-V3", "deepseek_v3", None)),
    (
        {"model_type": "kimi_k2"},
        "<|tool_calls_section_begin|><think>",
        "",
        ("Kimi (thinking)", "kimi_k2", "kimi_k2"),
    ),
    ({"model_type": "kimi_k2"}, "<|tool_calls_section_begin|>", "", ("Kimi-K2", "kimi_k2", None)),
    ({"model_type": "glm4_moe"}, "<arg_key>", "GLM-4.5-Air", ("GLM-4.5 / 4.6", "glm45", "glm45")),
    ({"model_type": "glm4_moe"}, "<arg_key>", "GLM-4.7-FP8", ("GLM-4.7", "glm47", "glm45")),
    (
        {"architectures": ["GlmMoeDsaForCausalLM"]},
        "",
        "",
        ("GLM-4.7 / GLM-5", "glm47", "glm45"),
    ),
    ({"model_type": "minimax_m2"}, "", "", ("MiniMax-M2", "minimax_m2", "minimax_m2")),
    ({"model_type": "longcat_flash"}, "<think>", "", ("LongCat", "longcat", "deepseek_r1")),
    (
        {"model_type": "longcat_flash"},
        "<longcat_think>",
        "",
        ("LongCat (thinking)", "longcat", "longcat"),
    ),
    ({"model_type": "nemotron_h"}, "<think>", "", ("Nemotron-H", "qwen3_coder", "qwen3")),
    (
        {"model_type": "qwen3_moe"},
        "<tool_call>\n<function=x>",
        "",
        ("Qwen3-Coder", "qwen3_coder", None),
    ),
    ({"model_type": "qwen3"}, "<tool_call><think>", "", ("Qwen3", "hermes", "qwen3")),
    ({"model_type": "qwen2"}, "<tool_call><think>", "QwQ-32B", ("QwQ", "hermes", "deepseek_r1")),
    ({"model_type": "qwen2"}, "<tool_call>", "", ("Qwen2.5 / Hermes", "hermes", None)),
    ({"model_type": "llama4"}, "<|python_start|>", "", ("Llama-4", "pythonic", None)),
    (
        {"model_type": "llama"},
        "<|start_header_id|> respond with a JSON for a function call",
        "",
        ("Llama-3.1-3.3", "llama3_json", None),
    ),
    ({"model_type": "mistral"}, "[TOOL_CALLS][THINK]", "", ("Magistral", "mistral", "mistral")),
    ({"model_type": "mistral"}, "[TOOL_CALLS]", "", ("Mistral", "mistral", None)),
    ({"text_config": {"model_type": "gpt_oss"}}, "", "", ("gpt-oss", HARMONY, HARMONY)),
]


@pytest.mark.parametrize(("config", "template", "name", "want"), CASES)
def test_each_family_is_found_from_its_folder(
    config: dict[str, Any], template: str, name: str, want: tuple[str, str | None, str | None]
) -> None:
    family = detect(config, template, name)
    assert family is not None
    assert (family.name, family.tool, family.reasoning) == want


@pytest.mark.parametrize(
    ("config", "template"),
    [
        ({}, ""),
        ({"model_type": "llama"}, "<|start_header_id|>"),  # no tool template: not certain
        ({"model_type": "deepseek_v3"}, ""),  # which DeepSeek: the template would say
        ({"model_type": "tsfront-test-bytelevel"}, "anything"),
    ],
)
def test_no_family_without_certainty(config: dict[str, Any], template: str) -> None:
    assert detect(config, template) is None


def test_named_templates_are_all_read() -> None:
    named = [{"name": "default", "template": "x"}, {"name": "tool_use", "template": "<tool_call>"}]
    family = detect({"model_type": "qwen2"}, named)
    assert family is not None and family.tool == "hermes"


def test_auto_picks_the_familys_parsers_and_says_so() -> None:
    family = detect({"model_type": "qwen3"}, "<tool_call><think>")
    picked = choose("auto", "auto", family, TOOL_PARSERS, REASONING_PARSERS)
    assert (picked.tool, picked.reasoning) == ("hermes", "qwen3")
    assert picked.notes == (
        "parsers: family Qwen3 (from the model folder); tool calls hermes, reasoning qwen3",
    )
    nothing = choose("auto", "auto", None, TOOL_PARSERS, REASONING_PARSERS)
    assert (nothing.tool, nothing.reasoning) == (None, None)
    assert "family none certain" in nothing.notes[0]


def test_an_explicit_name_wins_and_none_turns_one_off() -> None:
    family = detect({"model_type": "qwen3"}, "<tool_call><think>")
    picked = choose("pythonic", "none", family, TOOL_PARSERS, REASONING_PARSERS)
    assert (picked.tool, picked.reasoning) == ("pythonic", None)
    # An explicit name for one, auto for the other: the family still gives the other.
    picked = choose("auto", "deepseek_r1", family, TOOL_PARSERS, REASONING_PARSERS)
    assert (picked.tool, picked.reasoning) == ("hermes", "deepseek_r1")


@pytest.mark.parametrize(
    ("flag", "peer", "ours"),
    [
        ("tool", "qwen", "hermes"),  # SMG
        ("tool", "qwen_xml", "qwen3_coder"),  # SMG
        ("tool", "llama", "llama3_json"),  # SMG
        ("tool", "deepseek31", "deepseek_v31"),  # SMG
        ("tool", "deepseekv3", "deepseek_v3"),  # SGLang
        ("tool", "llama4_pythonic", "pythonic"),  # vLLM
        ("tool", "openai", HARMONY),  # vLLM's gpt-oss
        ("tool", "gpt-oss", HARMONY),  # SGLang's
        ("reasoning", "openai_gptoss", HARMONY),  # vLLM
        ("reasoning", "deepseek-r1", "deepseek_r1"),  # SGLang
        ("reasoning", "qwen3_thinking", "qwen3"),  # SMG
    ],
)
def test_peer_names_are_aliases(flag: str, peer: str, ours: str) -> None:
    args = (peer, None) if flag == "tool" else (None, peer)
    picked = choose(*args, None, TOOL_PARSERS, REASONING_PARSERS)
    got = picked.tool if flag == "tool" else picked.reasoning
    assert got == ours
    if ours != HARMONY:
        assert any(f"{peer}: tsfront's {ours}" in n for n in picked.notes)


def test_unknown_names_and_harmony_with_another_are_refused() -> None:
    with pytest.raises(ValueError, match=r"--tool-call-parser 'nope': unknown; use one of"):
        choose("nope", None, None, TOOL_PARSERS, REASONING_PARSERS)
    with pytest.raises(ValueError, match=r"--reasoning-parser 'nope': unknown"):
        choose(None, "nope", None, TOOL_PARSERS, REASONING_PARSERS)
    with pytest.raises(ValueError, match=r"harmony .* cannot be combined"):
        choose("openai", "qwen3", None, TOOL_PARSERS, REASONING_PARSERS)
    # Named harmony for one: it does both.
    picked = choose("openai", None, None, TOOL_PARSERS, REASONING_PARSERS)
    assert (picked.tool, picked.reasoning) == (HARMONY, HARMONY)
    # gpt-oss's folder, another parser named for tools: auto does not pick harmony.
    gpt = detect({"model_type": "gpt_oss"}, "")
    picked = choose("hermes", "auto", gpt, TOOL_PARSERS, REASONING_PARSERS)
    assert (picked.tool, picked.reasoning) == ("hermes", None)


def test_a_family_whose_parser_is_not_registered_is_skipped_with_a_note() -> None:
    kimi = detect({}, "<|tool_calls_section_begin|><think>")
    assert kimi is not None
    registered_tools = {n for n in TOOL_PARSERS if n != "kimi_k2"}
    registered_reasoning = {n for n in REASONING_PARSERS if n != "kimi_k2"}
    picked = choose("auto", "auto", kimi, registered_tools, registered_reasoning)
    assert (picked.tool, picked.reasoning) == (None, None)
    assert any(
        "needs the 'kimi_k2' parser, which this tsfront does not have yet" in n
        for n in picked.notes
    )
    # An alias to a name not registered is refused at once, naming it.
    with pytest.raises(ValueError, match=r"'kimik2' \(kimi_k2\): not available"):
        choose("kimik2", None, None, registered_tools, registered_reasoning)


def test_every_registered_parser_and_alias_target_is_known() -> None:
    """A family row or an alias naming a registered parser uses its exact name; the rest
    are part A's names (docs/TEXT.md), kept here so a typo shows."""
    pending_tools = {"deepseek_v32", "deepseek_v4", "kimi_k2", "glm45", "glm47", "minimax_m2",
                     "minimax_m3", "longcat", "inkling"}  # fmt: skip
    pending_reasoning = {"deepseek_v4", "kimi_k2", "glm45", "minimax_m2", "minimax_m3",
                         "inkling", "mistral"}  # fmt: skip
    for family in FAMILIES:
        assert family.tool in {*TOOL_PARSERS, HARMONY, None, *pending_tools}, family
        assert family.reasoning in {*REASONING_PARSERS, HARMONY, None, *pending_reasoning}
    assert set(TOOL_ALIASES.values()) <= {*TOOL_PARSERS, HARMONY, *pending_tools}
    assert set(REASONING_ALIASES.values()) <= {*REASONING_PARSERS, HARMONY, *pending_reasoning}


def test_settle_reads_the_model_folder(tmp_path: Path) -> None:
    folder = make_test_model(tmp_path / "Qwen3-8B", "bytelevel")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok["chat_template"] += "{# <tool_call> <think> #}"
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    model = TextModel.load(folder)
    settings, notes = settle(ChatSettings("auto", "auto"), model)
    assert (settings.tool_parser, settings.reasoning_parser) == ("hermes", "qwen3")
    assert notes and "Qwen3" in notes[0]
    # --chat-template replaces the folder's: its markers count.
    settings, _ = settle(ChatSettings("auto", "auto"), model, "{{ messages }}")
    assert (settings.tool_parser, settings.reasoning_parser) == (None, None)
