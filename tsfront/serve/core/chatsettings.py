"""The chat output's parsers: ``tsfront serve --tool-call-parser`` and ``--reasoning-parser``.

`add_chat_arguments` adds the two flags; `chat_settings` checks the parsed ones (an unknown
name is a ``ValueError`` naming the flag and the valid names, so the command exits 2 at
start) and returns `ChatSettings`, which crosses the spawn in
`tsfront.serve.processes.worker.WorkerOptions`. The template flags are
`tsfront.serve.core.templates`'.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = ["ChatSettings", "add_chat_arguments", "chat_settings"]


@dataclass(frozen=True)
class ChatSettings:
    """The chat output parsers of every worker.

    Attributes:
        tool_parser: the ``--tool-call-parser`` name (`tsfront.text.tools.TOOL_PARSERS`), or
            ``None``: ``tool_choice: "auto"`` is refused (required and named tools still work:
            they are constrained and parsed without the model's format).
        reasoning_parser: the ``--reasoning-parser`` name
            (`tsfront.text.reasoning.REASONING_PARSERS`), or ``None``: no ``reasoning_content``.
    """

    tool_parser: str | None = None
    reasoning_parser: str | None = None


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the chat output parser flags to ``tsfront serve``'s ``parser``."""
    from tsfront.text.reasoning import REASONING_PARSERS
    from tsfront.text.tools import TOOL_PARSERS

    chat = parser.add_argument_group("chat output (tool calls, reasoning)")
    chat.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help='parse the model\'s tool calls into message.tool_calls, for tool_choice "auto": '
        f"one of {', '.join(sorted(TOOL_PARSERS))} (default: none)",
    )
    chat.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="split <think>...</think> into message.reasoning_content: one of "
        f"{', '.join(sorted(REASONING_PARSERS))} (default: none)",
    )


def chat_settings(args: argparse.Namespace) -> ChatSettings:
    """`ChatSettings` from parsed flags; raises ValueError naming a bad one."""
    from tsfront.text.reasoning import REASONING_PARSERS
    from tsfront.text.tools import TOOL_PARSERS

    tool = args.tool_call_parser
    if tool is not None and tool not in TOOL_PARSERS:
        raise ValueError(
            f"--tool-call-parser {tool!r}: unknown; use one of {', '.join(sorted(TOOL_PARSERS))}"
        )
    reasoning = args.reasoning_parser
    if reasoning is not None and reasoning not in REASONING_PARSERS:
        raise ValueError(
            f"--reasoning-parser {reasoning!r}: unknown; use one of "
            f"{', '.join(sorted(REASONING_PARSERS))}"
        )
    return ChatSettings(tool, reasoning)
