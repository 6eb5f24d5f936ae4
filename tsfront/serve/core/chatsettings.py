"""The chat output's parsers: ``tsfront serve --tool-call-parser`` and ``--reasoning-parser``.

`add_chat_arguments` adds the two flags (``auto`` by default) and ``--reasoning-effort``;
`chat_settings` checks the parsed ones (an unknown name, ours or a peer's, is a
``ValueError`` naming the flag and the valid names, so the command exits 2 at start);
`settle` turns ``auto`` into the parsers of the family the model folder shows
(`tsfront.text.families`) and returns the `ChatSettings` that cross the spawn in
`tsfront.serve.processes.worker.WorkerOptions`, with the lines start-up prints. The
template flags are `tsfront.serve.core.templates`'.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tsfront.text import TextModel

__all__ = ["ChatSettings", "add_chat_arguments", "chat_settings", "settle"]

#: gpt-oss's reasoning effort when a request names none (``--reasoning-effort``).
EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class ChatSettings:
    """The chat output parsers of every worker.

    Attributes:
        tool_parser: the ``--tool-call-parser`` name (`tsfront.text.tools.TOOL_PARSERS`), or
            ``None``: ``tool_choice: "auto"`` is refused (required and named tools still work:
            they are constrained and parsed without the model's format).
        reasoning_parser: the ``--reasoning-parser`` name
            (`tsfront.text.reasoning.REASONING_PARSERS`), or ``None``: no ``reasoning_content``.
            Both ``"harmony"`` for gpt-oss (`tsfront.text.harmony`: its prompt and output).
        reasoning_effort: gpt-oss's effort for a request that names none.
    """

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    reasoning_effort: str = "medium"

    @property
    def harmony(self) -> bool:
        """Whether chat is gpt-oss's Harmony format (rendered and parsed by openai-harmony)."""
        return self.tool_parser == "harmony"


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the chat output parser flags to ``tsfront serve``'s ``parser``."""
    from tsfront.text.reasoning import REASONING_PARSERS
    from tsfront.text.tools import TOOL_PARSERS

    chat = parser.add_argument_group("chat output (tool calls, reasoning)")
    chat.add_argument(
        "--tool-call-parser",
        default="auto",
        metavar="NAME",
        help='parse the model\'s tool calls into message.tool_calls, for tool_choice "auto": '
        f"one of {', '.join(sorted([*TOOL_PARSERS, 'harmony']))} (vLLM's, SMG's and SGLang's "
        "names too), none, or auto: the model family's, when its folder makes it certain, "
        "else none (default: auto)",
    )
    chat.add_argument(
        "--reasoning-parser",
        default="auto",
        metavar="NAME",
        help="split the model's reasoning into message.reasoning_content: one of "
        f"{', '.join(sorted([*REASONING_PARSERS, 'harmony']))} (peers' names too), none, or "
        "auto (default: auto)",
    )
    chat.add_argument(
        "--reasoning-effort",
        default="medium",
        choices=EFFORTS,
        help="gpt-oss's reasoning effort for a request that names none (reasoning_effort, "
        "Responses' reasoning.effort) (default: medium)",
    )


def chat_settings(args: argparse.Namespace) -> ChatSettings:
    """`ChatSettings` from parsed flags, as given (``auto`` kept: `settle` resolves it once
    the model is loaded); raises ValueError naming a bad one."""
    from tsfront.text.families import choose
    from tsfront.text.reasoning import REASONING_PARSERS
    from tsfront.text.tools import TOOL_PARSERS

    tool, reasoning = args.tool_call_parser, args.reasoning_parser
    choose(tool, reasoning, None, TOOL_PARSERS, REASONING_PARSERS)  # the names' check
    return ChatSettings(tool, reasoning, getattr(args, "reasoning_effort", "medium"))


def _model_config(model: TextModel) -> dict[str, Any]:
    path = None if model.folder is None else model.folder / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path and path.is_file() else {}
    except (OSError, ValueError):
        return {}  # TextModel.load read it already; unreadable here is no family
    return data if isinstance(data, dict) else {}


def settle(
    settings: ChatSettings, model: TextModel, chat_template: str | None = None
) -> tuple[ChatSettings, list[str]]:
    """``settings`` with ``auto`` and the peers' names resolved for ``model`` (its
    ``config.json``, its chat template or ``chat_template``, its name), and the lines to
    print at start-up. Raises ValueError (the names are checked by `chat_settings`)."""
    from tsfront.text.families import choose, detect
    from tsfront.text.reasoning import REASONING_PARSERS
    from tsfront.text.tools import TOOL_PARSERS

    family = detect(
        _model_config(model),
        chat_template if chat_template is not None else model.chat_template,
        model.name,
    )
    picked = choose(
        settings.tool_parser, settings.reasoning_parser, family, TOOL_PARSERS, REASONING_PARSERS
    )
    return replace(settings, tool_parser=picked.tool, reasoning_parser=picked.reasoning), list(
        picked.notes
    )
