"""Which parsers a model needs, read from its folder: ``--tool-call-parser auto`` and
``--reasoning-parser auto``, and the peers' parser names as aliases of ours.

`FAMILIES` is one table: each row a model family, how its folder shows it (``config.json``'s
``model_type`` or ``architectures``, markers its chat template must hold or must not hold, a
name fragment where the configs of two families are the same) and the tool-call and
reasoning parsers it needs, by name. `detect` returns the first row the folder matches, when
one does: only then is the family certain and ``auto`` picks its parsers; otherwise ``auto``
picks none (the server runs as it would without the flags). A row may name a parser that is
not registered (yet): `choose` then skips that parser with a message saying so, and keeps
the other.

``harmony`` is not a text parser but gpt-oss's whole format (`tsfront.text.harmony`): the
prompt rendered and the output parsed on token ids, for tool calls and reasoning at once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FAMILIES",
    "HARMONY",
    "REASONING_ALIASES",
    "TOOL_ALIASES",
    "Choice",
    "Family",
    "choose",
    "detect",
    "resolve",
]

#: gpt-oss's format: the name of both its "parsers".
HARMONY = "harmony"


@dataclass(frozen=True)
class Family:
    """One row of `FAMILIES`.

    Attributes:
        name: the family, as start-up prints it.
        tool: its ``--tool-call-parser`` name, or ``None`` (no tool-call format).
        reasoning: its ``--reasoning-parser`` name, or ``None`` (it does not think).
        model_types: ``config.json`` ``model_type`` values (also under ``text_config``).
        architectures: ``config.json`` ``architectures`` entries.
        markers: text the chat template holds, every one.
        absent: text the chat template does not hold, any of it.
        names: fragments of the model's name (lowercase), one of which it holds.

    A folder matches when its configs match ``model_types`` or ``architectures`` (either,
    when the row gives any) and its template and name match the rest.
    """

    name: str
    tool: str | None
    reasoning: str | None
    model_types: frozenset[str] = frozenset()
    architectures: frozenset[str] = frozenset()
    markers: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    def matches(
        self, model_types: Collection[str], architectures: Collection[str], template: str, name: str
    ) -> bool:
        if (self.model_types or self.architectures) and not (
            self.model_types.intersection(model_types)
            or self.architectures.intersection(architectures)
        ):
            return False
        if not all(m in template for m in self.markers):
            return False
        if any(m in template for m in self.absent):
            return False
        return not self.names or any(n in name for n in self.names)


def _f(name: str, tool: str | None, reasoning: str | None, **rule: Any) -> Family:
    for key in ("model_types", "architectures"):
        rule[key] = frozenset(rule.get(key, ()))
    return Family(name, tool, reasoning, **rule)


_DS_CALLS = "<｜tool▁calls▁begin｜>"  # noqa: RUF001 (DeepSeek's full-width bars)
_DS_SEP = "<｜tool▁sep｜>"  # noqa: RUF001
_DS_TYPES = {"deepseek_v3"}

#: The families, most specific first (`detect` takes the first match).
FAMILIES: tuple[Family, ...] = (
    _f("gpt-oss", HARMONY, HARMONY, model_types={"gpt_oss"}, architectures={"GptOssForCausalLM"}),
    _f("DeepSeek-V4", "deepseek_v4", "deepseek_v4", model_types={"deepseek_v4"}),
    _f(
        "DeepSeek-V3.2",
        "deepseek_v32",
        "deepseek_r1",
        model_types={"deepseek_v32"},
        architectures={"DeepseekV32ForCausalLM"},
    ),
    _f(
        "Kimi (thinking)", "kimi_k2", "kimi_k2", markers=("<|tool_calls_section_begin|>", "<think>")
    ),
    _f("Kimi-K2", "kimi_k2", None, markers=("<|tool_calls_section_begin|>",)),
    # One model_type, three formats: the template tells them apart.
    _f(
        "DeepSeek-V3.1",
        "deepseek_v31",
        "deepseek_r1",
        model_types=_DS_TYPES,
        markers=(_DS_SEP, "</think>"),
        absent=("```json",),
    ),
    _f(
        "DeepSeek-R1",
        "deepseek_v3",
        "deepseek_r1",
        model_types=_DS_TYPES,
        markers=(_DS_CALLS, "```json", "<think>"),
    ),
    _f("DeepSeek-V3", "deepseek_v3", None, model_types=_DS_TYPES, markers=(_DS_CALLS, "```json")),
    _f(
        "GLM-4.7 / GLM-5",
        "glm47",
        "glm45",
        architectures={"GlmMoeDsaForCausalLM"},
        model_types={"glm_moe_dsa"},
    ),
    _f("GLM-4.7", "glm47", "glm45", model_types={"glm4_moe"}, names=("glm-4.7", "glm4.7")),
    _f("GLM-4.5 / 4.6", "glm45", "glm45", model_types={"glm4_moe"}),
    _f("MiniMax-M3", "minimax_m3", "minimax_m3", model_types={"minimax_m3"}),
    _f(
        "MiniMax-M2",
        "minimax_m2",
        "minimax_m2",
        model_types={"minimax_m2"},
        architectures={"MiniMaxM2ForCausalLM"},
    ),
    _f(
        "LongCat (thinking)",
        "longcat",
        "longcat",
        model_types={"longcat_flash"},
        markers=("<longcat_think>",),
    ),
    _f("LongCat", "longcat", "deepseek_r1", model_types={"longcat_flash"}, markers=("<think>",)),
    _f("LongCat", "longcat", None, model_types={"longcat_flash"}),
    _f("Nemotron-H", "qwen3_coder", "qwen3", model_types={"nemotron_h"}, markers=("<think>",)),
    _f("Inkling", "inkling", "inkling", model_types={"inkling"}),
    _f("Qwen3-Coder / Qwen3.5", "qwen3_coder", "qwen3", markers=("<function=", "<think>")),
    _f("Qwen3-Coder", "qwen3_coder", None, markers=("<function=", "<tool_call>")),
    _f(
        "Qwen3",
        "hermes",
        "qwen3",
        model_types={"qwen3", "qwen3_moe"},
        markers=("<tool_call>", "<think>"),
    ),
    _f("QwQ", "hermes", "deepseek_r1", model_types={"qwen2"}, markers=("<tool_call>", "<think>")),
    _f("Qwen2.5 / Hermes", "hermes", None, markers=("<tool_call>",), absent=("<think>",)),
    _f("Llama-4", "pythonic", None, model_types={"llama4"}, markers=("<|python_start|>",)),
    _f(
        "Llama-3.1-3.3",
        "llama3_json",
        None,
        model_types={"llama"},
        markers=("<|start_header_id|>", "JSON for a function call"),
    ),
    _f("Magistral", "mistral", "mistral", markers=("[TOOL_CALLS]", "[THINK]")),
    _f("Mistral", "mistral", None, markers=("[TOOL_CALLS]",)),
)

#: The peers' tool-call parser names (vLLM, SMG, SGLang; docs/TEXT.md) → ours, where they
#: differ.
TOOL_ALIASES: Mapping[str, str] = {
    # vLLM
    "openai": HARMONY,
    "qwen3_xml": "qwen3_coder",
    "llama4_pythonic": "pythonic",
    "llama4_json": "llama3_json",
    # SMG
    "qwen": "hermes",
    "qwen_xml": "qwen3_coder",
    "qwen_coder": "qwen3_coder",
    "nemotron": "qwen3_coder",
    "llama": "llama3_json",
    "deepseek": "deepseek_v3",
    "deepseek31": "deepseek_v31",
    "deepseek32": "deepseek_v32",
    "glm45_moe": "glm45",
    "glm47_moe": "glm47",
    "kimik2": "kimi_k2",
    # SGLang
    "gpt-oss": HARMONY,
    "gpt_oss": HARMONY,
    "deepseekv3": "deepseek_v3",
    "deepseekv31": "deepseek_v31",
    "deepseekv32": "deepseek_v32",
    "deepseekv4": "deepseek_v4",
    "llama3": "llama3_json",
    "qwen25": "hermes",
    "minimax-m2": "minimax_m2",
    "minimax-m3": "minimax_m3",
}

#: The peers' reasoning parser names → ours, where they differ.
REASONING_ALIASES: Mapping[str, str] = {
    # vLLM
    "openai_gptoss": HARMONY,
    "deepseek_v3": "deepseek_r1",  # V3.1's thinking toggle: the prompt opens <think> or not
    # SMG
    "qwen3_thinking": "qwen3",
    "kimi": "kimi_k2",
    "minimax": "minimax_m2",
    "deepseek_v31": "deepseek_r1",
    # SGLang
    "gpt-oss": HARMONY,
    "gpt_oss": HARMONY,
    "deepseek-r1": "deepseek_r1",
    "deepseek-v3": "deepseek_r1",
    "deepseek-v4": "deepseek_v4",
    "qwen3-thinking": "qwen3",
    "minimax-m3": "minimax_m3",
}


def _config_values(config: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    types: set[str] = set()
    archs: set[str] = set()
    for cfg in (config, config.get("text_config")):
        if not isinstance(cfg, Mapping):
            continue
        if isinstance(cfg.get("model_type"), str):
            types.add(cfg["model_type"])
        for a in cfg.get("architectures") or ():
            if isinstance(a, str):
                archs.add(a)
    return types, archs


def _template_text(template: Any) -> str:
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # named templates: all of them
        return "\n".join(
            t["template"]
            for t in template
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        )
    return ""


def detect(config: Mapping[str, Any], template: Any, name: str = "") -> Family | None:
    """The family of a model folder (`FAMILIES`' first match), or ``None`` when none is
    certain. ``config``: its ``config.json``; ``template``: its chat template (a string or the
    list of named templates); ``name``: the model's name."""
    types, archs = _config_values(config)
    text = _template_text(template)
    lowered = name.lower()
    for family in FAMILIES:
        if family.matches(types, archs, text, lowered):
            return family
    return None


def resolve(name: str, registered: Collection[str], aliases: Mapping[str, str]) -> str | None:
    """Our name for a flag's ``name``: itself when registered, else its alias (a peer's
    name); ``None`` when neither is known."""
    if name in registered:
        return name
    return aliases.get(name)


@dataclass(frozen=True)
class Choice:
    """What `choose` picked for the two flags, and what to print at start-up.

    Attributes:
        tool: the tool-call parser (``None``: none), ``harmony`` for gpt-oss.
        reasoning: the reasoning parser (``None``: none), ``harmony`` for gpt-oss.
        family: the family `detect` found (``None`` when the folder makes none certain).
        notes: lines for start-up: what auto picked and why, a parser skipped.
    """

    tool: str | None
    reasoning: str | None
    family: Family | None
    notes: tuple[str, ...]


def choose(
    tool: str | None,
    reasoning: str | None,
    family: Family | None,
    tools: Collection[str],
    reasonings: Collection[str],
) -> Choice:
    """The parsers for ``--tool-call-parser tool`` and ``--reasoning-parser reasoning``
    (each a name, a peer's name, ``"auto"``, or ``"none"`` / ``None`` for none),
    ``family`` being the folder's (`detect`) and ``tools`` / ``reasonings`` the registered
    names (`harmony` is always known). An explicit name wins over the family's. Raises
    ``ValueError`` naming the flag for a name that is neither ours nor a peer's, and for
    Harmony with another parser."""
    notes: list[str] = []
    flags = (
        ("--tool-call-parser", tool, {*tools, HARMONY}, TOOL_ALIASES, "tool"),
        ("--reasoning-parser", reasoning, {*reasonings, HARMONY}, REASONING_ALIASES, "reasoning"),
    )
    explicit: dict[str, str | None] = {}
    for flag, given, known, aliases, _ in flags:
        if given is None or given in ("auto", "none"):
            continue
        ours = resolve(given, known, aliases)
        if ours is None:
            raise ValueError(
                f"{flag} {given!r}: unknown; use one of {', '.join(sorted(known))}, auto or "
                "none (vLLM's, SMG's and SGLang's names of these work too)"
            )
        if ours not in known:
            raise ValueError(
                f"{flag} {given!r} ({ours}): not available in this tsfront; use one of "
                f"{', '.join(sorted(known))}"
            )
        if ours != given:
            notes.append(f"{flag} {given}: tsfront's {ours}")
        explicit[flag] = ours
    if HARMONY in explicit.values() and len(set(explicit.values())) > 1:
        raise ValueError(
            "harmony (gpt-oss) parses tool calls and reasoning at once: it cannot be combined "
            "with another parser"
        )
    picked: list[str | None] = []
    for flag, given, known, _, attr in flags:
        if given != "auto":
            picked.append(explicit.get(flag))
            continue
        wanted = getattr(family, attr) if family is not None else None
        if wanted is not None and wanted not in known:
            notes.append(
                f"{flag} auto: {family.name if family else '?'} needs the {wanted!r} parser, "
                "which this tsfront does not have yet: none used"
            )
            wanted = None
        if wanted == HARMONY and any(v != HARMONY for v in explicit.values()):
            notes.append(f"{flag} auto: not harmony, as the other parser was named")
            wanted = None
        picked.append(wanted)
    tool_name, reasoning_name = picked
    if HARMONY in picked:  # one named harmony, the other left out: Harmony does both
        tool_name = reasoning_name = HARMONY
    if "auto" in (tool, reasoning):
        what = f"{family.name} (from the model folder)" if family is not None else "none certain"
        notes.insert(
            0,
            f"parsers: family {what}; tool calls {tool_name or 'none'}, reasoning "
            f"{reasoning_name or 'none'}",
        )
    return Choice(tool_name, reasoning_name, family, tuple(notes))
