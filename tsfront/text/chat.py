"""Chat templates, rendered with Hugging Face ``transformers``' semantics.

A template comes from the model folder (``tokenizer_config.json``'s ``chat_template``, a string
or a list of named templates, or a ``chat_template.jinja`` file) and is rendered by ``jinja2``
in an immutable sandbox, with the environment ``transformers`` builds: ``trim_blocks``,
``lstrip_blocks``, the ``loopcontrols`` extension, ``{% generation %}`` blocks (rendered as
their body), a ``tojson`` filter that keeps non-ASCII text, and the globals
``raise_exception`` and ``strftime_now``. The variables are ``messages``, ``tools``,
``add_generation_prompt``, the special tokens (``bos_token``, ``eos_token``, ...) and any extra
keyword arguments. A template is compiled once.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from tsfront.text._deps import require
from tsfront.text.errors import ChatTemplateError

#: Names a template sees that the renderer itself sets (with the special tokens' names, see
#: `tsfront.text.TextModel.template_names`): a caller's extra variables may not replace them.
RENDERER_NAMES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "raise_exception",
        "strftime_now",
    }
)
#: The special-token names transformers hands every template (whether or not a model has them).
SPECIAL_TOKEN_NAMES = frozenset(
    {
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
    }
)


class _TemplateRaised(Exception):
    """A template called ``raise_exception``; carried out of jinja2 to become ChatTemplateError."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _generation_extension() -> type:
    """``{% generation %}...{% endgeneration %}``: transformers marks assistant text with it
    (for training masks); rendering, it is just its body."""
    ext = require("jinja2.ext")
    nodes = require("jinja2.nodes")

    # jinja2 is imported at run time (an optional dependency): mypy cannot follow the base.
    class Generation(ext.Extension):  # type: ignore[name-defined]
        tags = frozenset({"generation"})

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return Generation


@lru_cache(maxsize=32)
def compile_template(source: str) -> Any:
    """Compile ``source`` in the sandboxed environment (cached by source text)."""
    jinja2 = require("jinja2")
    sandbox = require("jinja2.sandbox")
    env = sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _generation_extension()],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(
            f"the chat template does not compile: {e.message} (line {e.lineno}); "
            "fix chat_template in tokenizer_config.json"
        ) from e


def select_template(chat_template: Any, tools: list | None) -> str | None:
    """The template to render: a string as is; from a list of ``{"name", "template"}``, the
    ``tool_use`` one when tools are given and it exists, else ``default``."""
    if chat_template is None or isinstance(chat_template, str):
        return chat_template
    if isinstance(chat_template, list):
        named = {
            t.get("name"): t.get("template")
            for t in chat_template
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
        if tools and "tool_use" in named:
            return named["tool_use"]
        if "default" in named:
            return named["default"]
        names = ", ".join(sorted(str(n) for n in named)) or "none"
        raise ChatTemplateError(
            f"the model's chat templates are named {names} but none is 'default'; "
            "name one 'default' in tokenizer_config.json"
        )
    raise ChatTemplateError(
        f"chat_template is a {type(chat_template).__name__}; it must be a string or a list of "
        '{"name", "template"} objects'
    )


def render(source: str, variables: dict[str, Any]) -> str:
    """Render a chat template; a template error or ``raise_exception`` → ChatTemplateError."""
    template = compile_template(source)
    jinja2 = require("jinja2")
    try:
        return template.render(**variables)
    except _TemplateRaised as e:
        raise ChatTemplateError(f"the chat template refused the messages: {e}") from e
    except jinja2.TemplateError as e:
        raise ChatTemplateError(
            f"the chat template failed on these messages: {e}; check the message roles and "
            "fields the model's template expects"
        ) from e
    except Exception as e:
        # Whatever else a template raises on its input (ZeroDivisionError, a RecursionError on
        # deeply nested fields, an OverflowError, ...) is the input's fault, not the server's.
        raise ChatTemplateError(
            f"the chat template failed on these messages ({type(e).__name__}: {e}); check "
            "the message roles and fields the model's template expects"
        ) from e
