"""The bounds a request must keep before the server does any work for it.

Each check here is cheap (counts, lengths, a walk of a small value) and runs before the
expensive steps (tokenizing, rendering a chat template, compiling stop strings), so that a
hostile or mistaken request is refused in microseconds instead of holding a worker's event
loop. A failed check raises `Refused`, which `tsfront.serve.api` answers with a 400 naming
``param``.

The bounds and why (docs/SERVE.md, "Limits"):

- ``stop``: at most `MAX_STOP_STRINGS` strings of at most `MAX_STOP_CHARS` characters each
  (OpenAI allows 4 stop sequences; vLLM sets no length limit; a stop string is a few
  characters in practice, and a stop string longer than 1,024 characters would be a paragraph).
- Integers that reach the engine fit its int64 (``seed + n - 1`` included: choice ``k`` is
  sampled with ``seed + k``); token ids are below the model's vocabulary.
- ``chat_template_kwargs`` may not name a variable the renderer sets (`tsfront.text.TextModel`
  ``.template_names``: ``chat_template``, ``messages``, ``tools``, ``add_generation_prompt``,
  the special tokens, ...), and its values are JSON of at most `MAX_KWARGS_DEPTH` levels and
  `MAX_KWARGS_ITEMS` items.
- Text: a prompt (or the messages' text) of more than ``context x max_token_chars``
  characters cannot fit the context, since no token stands for more characters than the
  longest token of the vocabulary (``TextModel.max_token_chars``); it is refused before it is
  encoded. A chat request has at most as many messages as the context has tokens (every
  template writes at least one token of role markup per message).
- ``metadata`` (``/v1/responses``: echoed in the response and stored with it): OpenAI's
  limits, at most `MAX_METADATA_PAIRS` pairs, keys of at most `MAX_METADATA_KEY` characters,
  string values of at most `MAX_METADATA_VALUE` (a client's tags, not its data).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_KWARGS_DEPTH",
    "MAX_KWARGS_ITEMS",
    "MAX_METADATA_KEY",
    "MAX_METADATA_PAIRS",
    "MAX_METADATA_VALUE",
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "Refused",
    "check_metadata",
    "check_template_kwargs",
    "decode_error",
]

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_KWARGS_DEPTH = 8
MAX_KWARGS_ITEMS = 1024
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
#: msgspec's decoder stops near the interpreter's recursion limit (a RecursionError).
_DECODE_DEPTH = "about 1,000"
# A \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one: msgspec reports it as truncation.
_LONE_HIGH = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})")


class Refused(Exception):
    """A request outside a bound: answered 400 with ``param``."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def decode_error(body: bytes, exc: Exception) -> str:
    """What is wrong with a body the JSON decoder refused, in words a client can act on."""
    if isinstance(exc, RecursionError):
        return (
            f"the body nests JSON arrays or objects {_DECODE_DEPTH} levels deep, more than "
            "the server decodes; no OpenAI field needs more than a few levels: flatten it"
        )
    text = str(exc)
    if ("truncated" in text or "surrogate" in text) and _LONE_HIGH.search(body):
        return (
            "the body is not valid JSON: a string holds a lone UTF-16 surrogate escape "
            "(\\ud800-\\udbff without its low half): JSON strings must be valid Unicode; send "
            "the character itself, or the escaped surrogate pair"
        )
    if "Invalid UTF-8" in text:
        return f"the body is not valid JSON: {text}; send the body encoded as UTF-8"
    return f"the body is not valid JSON: {text}"


def check_template_kwargs(kwargs: dict[str, Any], reserved: frozenset[str]) -> None:
    """Refuse ``chat_template_kwargs`` that name a renderer's variable or are too big."""
    taken = sorted(reserved.intersection(kwargs))
    if taken:
        raise Refused(
            f"chat_template_kwargs may not set {', '.join(taken)}: the server sets "
            f"{'it' if len(taken) == 1 else 'them'} (the template, messages, tools and "
            "special tokens are the model's); send only the template's own options, e.g. "
            '{"enable_thinking": false}',
            "chat_template_kwargs",
        )
    bad = next((k for k in kwargs if not k.isidentifier()), None)
    if bad is not None:
        raise Refused(
            f"chat_template_kwargs key {bad[:64]!r} is not a template variable name "
            "(letters, digits and _)",
            "chat_template_kwargs",
        )
    # Iterative walk: a deep value must not recurse here either.
    items = 0
    stack: list[tuple[Any, int]] = [(v, 1) for v in kwargs.values()]
    while stack:
        value, depth = stack.pop()
        items += 1
        if items > MAX_KWARGS_ITEMS or depth > MAX_KWARGS_DEPTH:
            raise Refused(
                f"chat_template_kwargs is too big: at most {MAX_KWARGS_ITEMS} values nested at "
                f"most {MAX_KWARGS_DEPTH} levels",
                "chat_template_kwargs",
            )
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def check_metadata(metadata: Any) -> None:
    """Refuse ``metadata`` beyond OpenAI's limits (None: none given)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise Refused("metadata must be an object of string keys and string values", "metadata")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise Refused(
            f"metadata has {len(metadata)} pairs: at most {MAX_METADATA_PAIRS} are allowed",
            "metadata",
        )
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            raise Refused(
                f"metadata key {key[:16]!r}... is {len(key)} characters long: keys are at most "
                f"{MAX_METADATA_KEY}",
                "metadata",
            )
        if not isinstance(value, str):
            raise Refused(
                f"metadata[{key[:16]!r}] is not a string: values must be strings (of at most "
                f"{MAX_METADATA_VALUE} characters)",
                "metadata",
            )
        if len(value) > MAX_METADATA_VALUE:
            raise Refused(
                f"metadata[{key[:16]!r}] is {len(value)} characters long: values are at most "
                f"{MAX_METADATA_VALUE}",
                "metadata",
            )
