"""What the server decides about chat output: parsers and the template (``tsfront serve`` flags).

`add_chat_arguments` adds ``--tool-call-parser``, ``--reasoning-parser``, ``--chat-template``
and ``--default-chat-template-kwargs``; `chat_settings` checks the parsed ones (an unknown
parser name, a template that is neither a file nor template text, kwargs that are not a JSON
object: ``ValueError`` naming the flag and the valid values) and returns `ChatSettings`,
which crosses the spawn in `tsfront.serve.worker.WorkerOptions`.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatSettings", "add_chat_arguments", "chat_settings"]


@dataclass(frozen=True)
class ChatSettings:
    """The chat output rules of every worker.

    Attributes:
        tool_parser: the ``--tool-call-parser`` name (`tsfront.text.tools.TOOL_PARSERS`), or
            ``None``: ``tool_choice: "auto"`` is refused (required and named tools still work:
            they are constrained and parsed without the model's format).
        reasoning_parser: the ``--reasoning-parser`` name
            (`tsfront.text.reasoning.REASONING_PARSERS`), or ``None``: no ``reasoning_content``.
        chat_template: template text that replaces the model's (``None``: the model's).
        template_kwargs: ``chat_template_kwargs`` every request starts from (its own win).
    """

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the chat output flags to ``tsfront serve``'s ``parser``."""
    from tsfront.text.reasoning import REASONING_PARSERS
    from tsfront.text.tools import TOOL_PARSERS

    chat = parser.add_argument_group("chat output (tools, reasoning, template)")
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
    chat.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE_OR_TEXT",
        help="a Jinja chat template (a file, or the template itself) instead of the model's",
    )
    chat.add_argument(
        "--default-chat-template-kwargs",
        default=None,
        metavar="JSON",
        help="chat_template_kwargs for every request, e.g. '{\"enable_thinking\": false}' "
        "(a request's own keys win)",
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
    template = args.chat_template
    if template is not None:
        if os.path.isfile(template):
            try:
                with open(template, encoding="utf-8") as f:
                    template = f.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"--chat-template {args.chat_template}: {exc}") from None
        elif not ("{{" in template or "{%" in template):
            raise ValueError(
                f"--chat-template {template!r}: no such file, and not template text "
                "(no {{ or {%)"
            )
    kwargs: dict[str, Any] = {}
    if args.default_chat_template_kwargs is not None:
        try:
            kwargs = json.loads(args.default_chat_template_kwargs)
        except ValueError as exc:
            raise ValueError(f"--default-chat-template-kwargs: not JSON ({exc})") from None
        if not isinstance(kwargs, dict):
            raise ValueError(
                '--default-chat-template-kwargs: must be a JSON object, e.g. {"enable_thinking":'
                " false}"
            )
    return ChatSettings(tool, reasoning, template, kwargs)
