"""gpt-oss's Harmony format, through OpenAI's own renderer and parser (``openai-harmony``).

gpt-oss is not prompted through a Jinja template and its output is not text to split with
tags: the prompt is a Harmony conversation (a system message with the reasoning effort and
the date, a developer message with the instructions and the function tools written as a
TypeScript namespace, then the turns), and the output is messages on channels, each
``<|channel|>NAME [to=RECIPIENT] [<|constrain|>TYPE]<|message|>TEXT<|end|>`` in special tokens.
``openai-harmony`` (Rust) does both on token ids:

- `render_prompt`: OpenAI chat messages and tools → the prompt's token ids;
- `HarmonyParser`: the output's token ids, streamed, → reasoning (the ``analysis`` channel),
  content (``final``, and ``commentary`` without a recipient: a preamble to the user) and
  tool calls (a message to ``functions.NAME``: a `CallStart` when its header is complete,
  then its text as `CallArgs` as the model writes it).

Harmony's vocabulary is ``o200k_base.tiktoken``, which the package downloads at first use
and checks against its SHA-256. A server may have no network, so `load_encoding` hands it the
file: where ``TIKTOKEN_ENCODINGS_BASE`` names a folder holding it, that one; else the model's
own tokenizer (gpt-oss's folder ships ``tokenizer.json``, whose first 199,998 tokens are
o200k's) is written out in tiktoken's format into a per-user cache folder, checked against
the same hash, and handed over through ``TIKTOKEN_ENCODINGS_BASE``. Only a model whose
tokenizer is not o200k leaves Harmony to its own cache and download.

Model output never raises out of here: a token Harmony refuses (text outside any message,
a header that never ends) turns the rest of the output, from the message it broke, into
content text, decoded by the model's detokenizer.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tsfront.install import install_line
from tsfront.text.errors import TextDependencyMissing, TextError
from tsfront.text.tools.base import CallArgs, CallStart, Content, Delta, random_call_id

if TYPE_CHECKING:
    from tsfront.text.detok import Detokenizer
    from tsfront.text.model import TextModel

__all__ = [
    "EFFORTS",
    "VOCAB_FILE",
    "VOCAB_SHA256",
    "HarmonyParser",
    "HarmonyUnavailable",
    "load_encoding",
    "reasoning_effort",
    "render_prompt",
    "write_vocabulary",
]

#: The file Harmony reads from ``TIKTOKEN_ENCODINGS_BASE``, and its SHA-256 (Harmony's check).
VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
_BASE_TOKENS = 199_998  # o200k's ranks; gpt-oss's special tokens follow
_ENV = "TIKTOKEN_ENCODINGS_BASE"

#: A request's reasoning effort → Harmony's (OpenAI's ``minimal`` is gpt-oss's lowest).
EFFORTS = {"minimal": "Low", "low": "Low", "medium": "Medium", "high": "High"}

_FUNCTIONS = "functions."


class HarmonyUnavailable(TextError):
    """Harmony cannot be used: ``openai-harmony`` is not installed, or its vocabulary cannot
    be had (the message says which, and what to do)."""


def _harmony() -> Any:
    try:
        import openai_harmony  # type: ignore[import-untyped]
    except ImportError as e:
        raise TextDependencyMissing(
            "gpt-oss's Harmony format needs the 'openai-harmony' package, which is not "
            f"installed: {install_line('harmony')}"
        ) from e
    return openai_harmony


def reasoning_effort(value: Any, param: str) -> str:
    """The Harmony effort of a request's ``value`` (``low``, ``medium``, ``high``, or
    ``minimal``, read as ``low``); a `TextError` naming ``param`` for anything else."""
    effort = EFFORTS.get(value) if isinstance(value, str) else None
    if effort is None:
        raise TextError(
            f"{param} {value!r}: gpt-oss takes 'low', 'medium' or 'high' ('minimal' reads as 'low')"
        )
    return effort


def write_vocabulary(model: TextModel, folder: Path) -> Path | None:
    """Write ``model``'s first 199,998 tokens as ``folder/o200k_base.tiktoken`` when they are
    o200k's (their SHA-256 is Harmony's); ``None`` when they are not. An existing file with
    the right hash is kept."""
    path = folder / VOCAB_FILE
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == VOCAB_SHA256:
        return path
    if model.vocab_size < _BASE_TOKENS:
        return None
    token_bytes = model.token_bytes
    text = b"".join(base64.b64encode(token_bytes(i)) + b" %d\n" % i for i in range(_BASE_TOKENS))
    if hashlib.sha256(text).hexdigest() != VOCAB_SHA256:
        return None
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = folder / f".{VOCAB_FILE}.{os.getpid()}"
    partial.write_bytes(text)
    os.replace(partial, path)  # whole or not at all, for a reader in another worker
    return path


def _cache_folder() -> Path:
    """The per-user folder the vocabulary is written to; a fresh one if another user holds
    it (Harmony checks the file's hash anyway: at worst a load would fail)."""
    folder = Path(tempfile.gettempdir()) / f"tsfront-harmony-{os.getuid()}"
    try:
        if folder.stat().st_uid != os.getuid():
            return Path(tempfile.mkdtemp(prefix="tsfront-harmony-"))
    except FileNotFoundError:
        pass
    return folder


_ENCODING: Any = None


def load_encoding(model: TextModel | None = None) -> Any:
    """Harmony's gpt-oss encoding, loaded once per process (see the module docstring for
    where its vocabulary comes from). Raises `HarmonyUnavailable` or `TextDependencyMissing`."""
    global _ENCODING
    if _ENCODING is not None:
        return _ENCODING
    harmony = _harmony()
    if not os.environ.get(_ENV) and model is not None:
        path = write_vocabulary(model, _cache_folder())
        if path is not None:
            os.environ[_ENV] = str(path.parent)
    try:
        _ENCODING = harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as e:
        where = (
            f"{_ENV}={os.environ[_ENV]} (a folder with {VOCAB_FILE}, SHA-256 {VOCAB_SHA256})"
            if os.environ.get(_ENV)
            else "its download (no model tokenizer with o200k's tokens was given)"
        )
        raise HarmonyUnavailable(
            f"Harmony's vocabulary could not be loaded from {where}: {e}. Point {_ENV} at a "
            f"folder holding {VOCAB_FILE}, or serve gpt-oss's own folder (its tokenizer.json "
            "holds the vocabulary)"
        ) from e
    return _ENCODING


# ---------------------------------------------------------------------------------- render


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise TextError(f"{where} must be a string")


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps({} if value is None else value, ensure_ascii=False)


def render_prompt(
    encoding: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    effort: str = "Medium",
    today: datetime.date | None = None,
) -> list[int]:
    """The prompt's token ids for OpenAI chat ``messages`` and function ``tools`` (the
    request's ``{"type": "function", "function": {...}}`` list), as vLLM renders gpt-oss's:

    a system message (Harmony's identity, ``Reasoning: effort``, today's date); a developer
    message with the ``system`` and ``developer`` messages' text as its instructions and the
    tools (none: no developer message); then each turn: a user's text; an assistant's
    ``reasoning_content`` on ``analysis``, each of its ``tool_calls`` on ``commentary`` to
    ``functions.NAME``, its ``content`` on ``final``; a tool result from
    ``functions.NAME`` (its name from the call its ``tool_call_id`` names, or its ``name``).
    Harmony drops the analysis of turns before the last final answer. Raises `TextError` on
    messages it cannot render.
    """
    h = _harmony()
    system = h.SystemContent.new().with_reasoning_effort(h.ReasoningEffort(effort))
    system = system.with_conversation_start_date(
        (today or datetime.datetime.now(datetime.UTC).date()).isoformat()
    )
    out = [h.Message.from_role_and_content(h.Role.SYSTEM, system)]
    instructions: list[str] = []
    turns: list[Any] = []
    names: dict[str, str] = {}
    for i, message in enumerate(messages):
        role = message.get("role")
        where = f"messages[{i}].content"
        if role in ("system", "developer"):
            instructions.append(_text(message.get("content"), where))
        elif role == "user":
            turns.append(
                h.Message.from_role_and_content(h.Role.USER, _text(message.get("content"), where))
            )
        elif role == "assistant":
            thought = message.get("reasoning_content") or message.get("reasoning")
            if thought:
                turns.append(
                    h.Message.from_role_and_content(
                        h.Role.ASSISTANT, _text(thought, f"messages[{i}].reasoning_content")
                    ).with_channel("analysis")
                )
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                name = function.get("name")
                if not isinstance(name, str):
                    raise TextError(f"messages[{i}].tool_calls: a call without a function name")
                if isinstance(call.get("id"), str):
                    names[call["id"]] = name
                turns.append(
                    h.Message.from_role_and_content(
                        h.Role.ASSISTANT, _arguments(function.get("arguments"))
                    )
                    .with_channel("commentary")
                    .with_recipient(_FUNCTIONS + name)
                    .with_content_type("json")
                )
            content = _text(message.get("content"), where)
            if content or not (thought or message.get("tool_calls")):
                turns.append(
                    h.Message.from_role_and_content(h.Role.ASSISTANT, content).with_channel("final")
                )
        elif role == "tool":
            name = names.get(message.get("tool_call_id") or "") or message.get("name")
            if not isinstance(name, str):
                raise TextError(
                    f"messages[{i}]: a tool result whose tool_call_id names no earlier call; "
                    "send the id of the assistant's call (or the function's name as name)"
                )
            turns.append(
                h.Message.from_author_and_content(
                    h.Author.new(h.Role.TOOL, _FUNCTIONS + name),
                    _text(message.get("content"), where),
                )
                .with_channel("commentary")
                .with_recipient("assistant")
            )
        else:
            raise TextError(
                f"messages[{i}].role {role!r}: use system, developer, user, assistant or tool"
            )
    functions = [
        h.ToolDescription.new(f["name"], f.get("description") or "", f.get("parameters") or None)
        for f in (t.get("function") or t for t in tools or ())
    ]
    if instructions or functions:
        developer = h.DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions("\n\n".join(instructions))
        if functions:
            developer = developer.with_function_tools(functions)
        out.append(h.Message.from_role_and_content(h.Role.DEVELOPER, developer))
    out.extend(turns)
    try:
        return list(
            encoding.render_conversation_for_completion(
                h.Conversation.from_messages(out), h.Role.ASSISTANT
            )
        )
    except Exception as e:  # Harmony's own refusal of the conversation
        raise TextError(f"messages cannot be rendered in gpt-oss's Harmony format: {e}") from e


# ----------------------------------------------------------------------------------- parse

# What the parser does with the message being read: a table of the states, each the
# destination of the message's text.
_HEADER = "header"  # before <|message|>: nothing known yet
_REASONING = "reasoning"  # analysis: reasoning text
_CONTENT = "content"  # final, a preamble on commentary, or no channel: content text
_CALL = "call"  # to a recipient: a tool call's arguments
_RAW = "raw"  # Harmony refused a token: the rest is content text, decoded by the model

_DESTINATION = {"analysis": _REASONING}
# Harmony's special tokens (o200k_harmony's ids): <|message|> ends a header; <|end|>,
# <|call|> and <|return|> end a message.
_MESSAGE = 200008
_ENDS = frozenset({200007, 200012, 200002})


class HarmonyParser:
    """One choice's output tokens → reasoning, content and tool calls, streamed.

    Args:
        encoding: `load_encoding`'s.
        fallback: a fresh detokenizer of the model (``skip_special_tokens=True``), which
            turns the output into content from a token Harmony refuses on.

    ``feed(ids)`` returns ``(reasoning, deltas)``: the reasoning text now known and the
    `Content` / `CallStart` / `CallArgs` deltas (calls numbered 0, 1, ... in the choice).
    """

    __slots__ = (
        "_calls",
        "_fallback",
        "_held",
        "_messages",
        "_parser",
        "_state",
        "called",
        "incomplete",
        "reasoning_tokens",
    )

    def __init__(self, encoding: Any, fallback: Detokenizer) -> None:
        h = _harmony()
        self._parser = h.StreamableParser(encoding, h.Role.ASSISTANT, strict=False)
        self._fallback = fallback
        self._state = _HEADER
        self._held: list[int] = []  # this message's ids so far (for the fallback)
        self._calls = 0
        self._messages = 0  # messages whose header ended
        #: Whether a call was parsed.
        self.called = False
        #: Whether the output ended inside a call (its arguments may be cut).
        self.incomplete = False
        #: The tokens of ``analysis`` messages, headers included.
        self.reasoning_tokens = 0

    def feed(self, ids: Sequence[int]) -> tuple[str, list[Delta]]:
        """The reasoning and deltas of the next output ids."""
        if self._state == _RAW:
            text = self._fallback.step(ids)
            return "", [Content(text)] if text else []
        reasoning: list[str] = []
        deltas: list[Delta] = []
        parser = self._parser
        for k, token in enumerate(ids):
            try:
                parser.process(token)
            except Exception:
                self._held.append(token)
                return self._raw(ids[k + 1 :], reasoning, deltas)
            state = self._state
            if state == _REASONING:
                self.reasoning_tokens += 1
            if state == _HEADER:
                # Harmony's own rule: <|message|> ends a header (the state is read from the
                # tokens, as reading the parser's state costs time linear in the message).
                self._held.append(token)
                if token == _MESSAGE:
                    self._begin(deltas)
            elif token in _ENDS:
                self._state = _HEADER
                self._held = []
            else:
                self._held.append(token)
                delta = parser.last_content_delta
                if delta:
                    if state == _REASONING:
                        reasoning.append(delta)
                    elif state == _CONTENT:
                        deltas.append(Content(delta))
                    else:
                        deltas.append(CallArgs(self._calls - 1, delta))
        return "".join(reasoning), deltas

    def _begin(self, deltas: list[Delta]) -> None:
        """A header just ended: where this message's text goes."""
        parser = self._parser
        self._messages += 1
        recipient = parser.current_recipient
        if recipient:
            name = recipient[len(_FUNCTIONS) :] if recipient.startswith(_FUNCTIONS) else recipient
            deltas.append(CallStart(self._calls, random_call_id(), name))
            self._calls += 1
            self.called = True
            self._state = _CALL
        else:
            self._state = _DESTINATION.get(parser.current_channel or "", _CONTENT)
        if self._state == _REASONING:
            self.reasoning_tokens += len(self._held)

    def _raw(
        self, rest: Sequence[int], reasoning: list[str], deltas: list[Delta]
    ) -> tuple[str, list[Delta]]:
        """Harmony refused a token: the message it broke, and all after, is content."""
        if self._state == _CALL:
            self.incomplete = True
        self._state = _RAW
        text = self._fallback.step([*self._held, *rest])
        self._held = []
        if text:
            deltas.append(Content(text))
        return "".join(reasoning), deltas

    def finish(self, length: bool = False) -> tuple[str, list[Delta]]:
        """At the end of the output (``length``: cut by ``max_tokens``)."""
        if self._state == _RAW:
            text = self._fallback.flush()
            return "", [Content(text)] if text else []
        if self._state == _CALL and length:
            self.incomplete = True
        if self._state == _HEADER and self._held and not (length and self._messages):
            # Text outside any message, or a header that never ended: content after all. A
            # header that max_tokens cut after a message (a call about to begin) is dropped.
            reasoning, deltas = self._raw((), [], [])
            text = self._fallback.flush()
            if text:
                deltas.append(Content(text))
            return reasoning, deltas
        return "", []
