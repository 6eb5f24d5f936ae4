"""Tool-call parsers: a model's tool-call text turned into OpenAI ``tool_calls``, streamed.

One streaming interface (:class:`ToolParser`, in :mod:`~tsfront.text.tools.base`), one module
per format family:

- ``hermes`` (:mod:`~tsfront.text.tools.hermes`): Hermes-2-Pro, Qwen2.5, Qwen3;
- ``qwen3_coder`` (:mod:`~tsfront.text.tools.qwen3_coder`): Qwen3-Coder;
- ``llama3_json`` (:mod:`~tsfront.text.tools.llama3_json`): Llama 3.1-3.3 JSON tool calls;
- ``mistral`` (:mod:`~tsfront.text.tools.mistral`): Mistral, Mixtral, Mistral-Small, Devstral;
- ``deepseek_v3``, ``deepseek_v31`` (:mod:`~tsfront.text.tools.deepseek`);
- ``deepseek_v32``, ``deepseek_v4`` (:mod:`~tsfront.text.tools.dsml`): DeepSeek's DSML;
- ``kimi_k2`` (:mod:`~tsfront.text.tools.kimi`): Kimi-K2, K2-Thinking, K2.5;
- ``kimi_k3`` (:mod:`~tsfront.text.tools.kimi_k3`): Kimi-K3's XTML channels;
- ``glm45``, ``glm47`` (:mod:`~tsfront.text.tools.glm`): GLM-4.5 / 4.6, GLM-4.7 / 5;
- ``minimax_m2`` (:mod:`~tsfront.text.tools.minimax`): MiniMax-M2;
- ``minimax_m3`` (:mod:`~tsfront.text.tools.minimax_m3`): MiniMax-M3's namespaced XML;
- ``longcat`` (:mod:`~tsfront.text.tools.longcat`): LongCat-Flash;
- ``nemotron`` (:mod:`~tsfront.text.tools.nemotron`): Nemotron-3, Nemotron-Nano-v2;
- ``inkling`` (:mod:`~tsfront.text.tools.inkling`): Inkling's TML blocks;
- ``pythonic`` (:mod:`~tsfront.text.tools.pythonic`): Llama-3.2 / Llama-4 pythonic calls;

and the constrained-decoding side (:mod:`~tsfront.text.tools.constrained`): the engine
schemas for ``tool_choice: "required"`` and a named tool, and parsers of their output. A new
format is one module with a :class:`ToolParser` subclass and one line in :data:`TOOL_PARSERS`.

What formats are made of: :mod:`~tsfront.text.tools.reading` (the cursor and small readers of
a call's text as it arrives), :mod:`~tsfront.text.tools.jsontext` (JSON arguments written
canonically as they are read) and :mod:`~tsfront.text.tools.params` (tagged parameter values
written as JSON by the tool's schema).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tsfront.text.tools.base import (
    CallArgs,
    CallStart,
    Content,
    Delta,
    Parsed,
    ToolCall,
    ToolCallError,
    ToolParser,
    assemble,
    canonical_arguments,
    random_call_id,
)
from tsfront.text.tools.constrained import (
    NamedToolParser,
    RequiredToolParser,
    named_schema,
    parse_named,
    parse_required,
    required_schema,
)
from tsfront.text.tools.deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from tsfront.text.tools.dsml import DeepSeekV4Parser, DeepSeekV32Parser
from tsfront.text.tools.glm import Glm45Parser, Glm47Parser
from tsfront.text.tools.hermes import HermesParser
from tsfront.text.tools.inkling import InklingParser
from tsfront.text.tools.kimi import KimiK2Parser
from tsfront.text.tools.kimi_k3 import KimiK3Parser
from tsfront.text.tools.llama3_json import Llama3JsonParser
from tsfront.text.tools.longcat import LongcatParser
from tsfront.text.tools.minimax import MinimaxM2Parser
from tsfront.text.tools.minimax_m3 import MinimaxM3Parser
from tsfront.text.tools.mistral import MistralParser
from tsfront.text.tools.nemotron import NemotronParser
from tsfront.text.tools.pythonic import PythonicParser
from tsfront.text.tools.qwen3_coder import Qwen3CoderParser

__all__ = [
    "TOOL_PARSERS",
    "CallArgs",
    "CallStart",
    "Content",
    "Delta",
    "NamedToolParser",
    "Parsed",
    "RequiredToolParser",
    "ToolCall",
    "ToolCallError",
    "ToolParser",
    "assemble",
    "canonical_arguments",
    "make_tool_parser",
    "named_schema",
    "parse_named",
    "parse_required",
    "random_call_id",
    "required_schema",
]

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    cls.name: cls
    for cls in (
        HermesParser,
        Qwen3CoderParser,
        Llama3JsonParser,
        MistralParser,
        DeepSeekV3Parser,
        DeepSeekV31Parser,
        DeepSeekV32Parser,
        DeepSeekV4Parser,
        KimiK2Parser,
        KimiK3Parser,
        Glm45Parser,
        Glm47Parser,
        MinimaxM2Parser,
        MinimaxM3Parser,
        LongcatParser,
        NemotronParser,
        InklingParser,
        PythonicParser,
    )
}
"""``--tool-call-parser`` name → parser class."""


def make_tool_parser(name: str, tools: Sequence[Mapping[str, Any]] | None = None) -> ToolParser:
    """A fresh parser of format ``name`` for one choice of a request with ``tools``.

    Raises :class:`ToolCallError` naming the known formats for an unknown ``name``.
    """
    cls = TOOL_PARSERS.get(name)
    if cls is None:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise ToolCallError(f"unknown tool-call parser {name!r}: use one of {known}")
    return cls(tools)
