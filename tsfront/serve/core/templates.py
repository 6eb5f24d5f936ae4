"""The server's control of chat templates: ``--chat-template`` and
``--default-chat-template-kwargs``.

``--chat-template FILE_OR_TEXT`` replaces the model folder's template for every request (a
path to a Jinja file, or the template text itself); it is compiled at start, so a template
that does not compile stops the server with exit 2 instead of failing every request.
``--default-chat-template-kwargs JSON`` gives every request template variables (e.g.
``{"enable_thinking": false}``); a request's own ``chat_template_kwargs`` override them key by
key. Neither may set a variable the renderer sets itself (`tsfront.serve.core.limits`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["TemplateOptions", "add_template_arguments", "template_options"]

TemplateOptions = tuple[str | None, dict[str, Any]]


def add_template_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--chat-template`` and ``--default-chat-template-kwargs`` to ``parser``."""
    group = parser.add_argument_group("chat template")
    group.add_argument(
        "--chat-template",
        metavar="FILE_OR_TEXT",
        help="the chat template for every request instead of the model folder's: a Jinja "
        "file, or the template text",
    )
    group.add_argument(
        "--default-chat-template-kwargs",
        metavar="JSON",
        help="template variables for every request, e.g. '{\"enable_thinking\": false}' "
        "(a request's chat_template_kwargs override them key by key)",
    )


def template_options(args: argparse.Namespace, reserved: frozenset[str]) -> TemplateOptions:
    """The template source and default variables the flags give (``(None, {})`` without
    them); raises ValueError with a message for the command line."""
    from tsfront.serve.core.limits import Refused, check_template_kwargs
    from tsfront.text import TextError
    from tsfront.text.chat import compile_template

    source: str | None = None
    given = getattr(args, "chat_template", None)
    if given is not None:
        path = Path(given)
        if path.is_file():
            source = path.read_text(encoding="utf-8")
        elif "{{" in given or "{%" in given:
            source = given
        else:
            raise ValueError(
                f"--chat-template {given!r}: no such file, and not a template (no {{{{ or {{%)"
            )
        try:
            compile_template(source)
        except TextError as exc:
            raise ValueError(f"--chat-template: {exc}") from None
    defaults: dict[str, Any] = {}
    raw = getattr(args, "default_chat_template_kwargs", None)
    if raw is not None:
        try:
            defaults = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--default-chat-template-kwargs: not JSON ({exc})") from None
        if not isinstance(defaults, dict):
            raise ValueError("--default-chat-template-kwargs: must be a JSON object")
        try:
            check_template_kwargs(defaults, reserved)
        except Refused as exc:
            raise ValueError(f"--default-chat-template-kwargs: {exc}") from None
    return source, defaults
