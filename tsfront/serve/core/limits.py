"""The bounds a request must keep before the server does any work for it.

Each check here is cheap (counts, lengths, a walk of a small value) and runs before the
expensive steps (tokenizing, rendering a chat template, compiling stop strings), so that a
hostile or mistaken request is refused in microseconds instead of holding a worker's event
loop. A failed check raises `Refused`, which `tsfront.serve.core.service` answers with a 400 naming
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
- JSON the server hands to recursive code (JSON schemas in ``response_format``,
  ``structured_outputs``, ``tools`` and ``text.format``; ``tool_choice``; the arguments of the
  tool calls in a conversation, which the server parses) nests at most `MAX_NESTING` levels of
  objects and arrays, checked by an iterative walk before anything recursive runs (the body
  decoder accepts ~1,000 levels; ``json.dumps``, the template's ``tojson`` and the response
  encoder stop short of that with a RecursionError). Text the server parses out of a string
  (tool-call arguments) holds no lone UTF-16 surrogate: the tokenizer cannot take one.
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
from typing import Any, TypeVar

import msgspec

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_KWARGS_DEPTH",
    "MAX_KWARGS_ITEMS",
    "MAX_METADATA_KEY",
    "MAX_METADATA_PAIRS",
    "MAX_METADATA_VALUE",
    "MAX_NESTING",
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "Refused",
    "check_json",
    "check_metadata",
    "check_template_kwargs",
    "decode_error",
    "decoded",
    "too_deep",
]

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_KWARGS_DEPTH = 8
MAX_KWARGS_ITEMS = 1024
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
#: Levels of JSON objects and arrays a schema, a tool, or a tool call's arguments may nest
#: (OpenAI's strict schemas allow 10 levels of objects; 64 leaves room for any real one).
MAX_NESTING = 64
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


T = TypeVar("T")


def decoded(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """``body`` as ``decoder``'s type; a body it refuses raises `Refused` (no param) saying
    what is wrong: a field's type or value, or the JSON itself (`decode_error`)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise Refused(f"invalid request body: {exc}", None) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise Refused(decode_error(body, exc), None) from None


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


def check_json(value: Any, param: str, where: str | None = None, *, text: bool = False) -> None:
    """Refuse a decoded JSON ``value`` (field ``param``, at ``where``) that nests more than
    `MAX_NESTING` levels of objects and arrays, or, with ``text`` (a value the server parsed
    from a string, not the body: only there can one hide), that holds a lone surrogate.

    An iterative walk that stops at the first level too deep: it runs before any recursive
    code sees the value, and costs a few microseconds for a real schema."""
    where = where or param
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        kind = type(node)
        if kind is str:
            if text and not node.isascii():
                _check_text(node, param, where)
            continue
        if kind is not dict and kind is not list:
            continue
        depth += 1
        if depth > MAX_NESTING:
            raise too_deep(where, param)
        if kind is dict:
            if text:
                for key in node:
                    if type(key) is str and not key.isascii():
                        _check_text(key, param, where)
            children = node.values()
        else:
            children = node
        for child in children:
            t = type(child)
            if t is dict or t is list or (text and t is str):
                push((child, depth))


def too_deep(where: str, param: str) -> Refused:
    """The refusal of a value at ``where`` nested more than `MAX_NESTING` levels."""
    return Refused(
        f"{where} nests JSON objects and arrays more than {MAX_NESTING} levels deep: "
        f"schemas, tools and tool-call arguments may nest at most {MAX_NESTING} levels "
        "(a real one needs far fewer); flatten it",
        param,
    )


def _check_text(value: str, param: str, where: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(
            f"{where} holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its "
            "other half): text must be valid Unicode; send the character itself, or the "
            "escaped surrogate pair",
            param,
        ) from None
