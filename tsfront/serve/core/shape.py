"""What the run asks of a dialect's response shape (`Format`), and `encode_json`.

The core runs a request and hands each choice's output to its `Format`: a text event is
``head(index) + json(text) + tail`` (everything but the new text encoded once per request, so a
plain token costs one string encode and one concatenation, on the task path and the push path
alike); parsed output (reasoning, content, tool calls) goes to `Format.pieces`; the choice's end
to `Format.last`; a failure after the stream began to `Format.error_event`. Each dialect's
shapes subclass it (`tsfront.serve.openai.formats`, `tsfront.serve.responses.endpoints`).

What carries parsed model output is encoded by `encode_json`, which never raises on a lone
surrogate. (The detokenizer's text holds none: it decodes bytes with replacement characters;
only a parser decoding an escape such as ``"\\ud800"`` could make one, and the parsers write
those back as escapes. The per-token path of plain text encodes with msgspec directly.)
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import msgspec

from tsfront.errors import DeadlineExceeded
from tsfront.ids import response_id

if TYPE_CHECKING:
    from tsfront.client.stream import OutputChunk
    from tsfront.serve.core.choice import Choice
    from tsfront.serve.core.parsing import Pieces

__all__ = ["Format", "encode_json", "stream_failure"]

_JSON = msgspec.json.Encoder()


def encode_json(obj: Any) -> bytes:
    """``obj`` (dicts, lists, strings, numbers) as JSON; a string holding a lone surrogate,
    which UTF-8 cannot hold, is written as its ``\\uXXXX`` escape instead of raising (then
    every non-ASCII character is escaped: the same JSON, in ASCII)."""
    try:
        return _JSON.encode(obj)
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def stream_failure(exc: Exception) -> tuple[str, int]:
    """The kind and status of a stream's failure after its start, given none: a deadline
    that passed is ``timeout_error`` 504, anything else ``server_error`` 503."""
    if isinstance(exc, DeadlineExceeded):
        return "timeout_error", 504
    return "server_error", 503


class Format:
    """One response's shape, whole and streamed: its id (``id_prefix`` and 96 bits from
    `secrets`, `tsfront.ids`), time and model, and the events the run asks for."""

    id_prefix = ""
    #: What ends a stream after its last event.
    done = b""
    #: Everything of a text event after the JSON-encoded text.
    tail = b""

    def __init__(self, model: str, text: Any, prompts: int, include_usage: bool) -> None:
        self.id = response_id(self.id_prefix)
        self.created = int(time.time())
        self.model = model
        self.text = text
        self.prompts = prompts
        self.include_usage = include_usage

    def counts(self, choices: list[Choice]) -> tuple[int, int]:
        """``(prompt tokens, completion tokens)`` of a response (a prompt fanned out n times
        counts once)."""
        n = max(1, len(choices) // max(1, self.prompts))
        return sum(ch.prompt_tokens for ch in choices[::n]), sum(ch.tokens for ch in choices)

    def head(self, index: int) -> bytes:
        """Everything of a text event of choice ``index`` before its JSON-encoded text (a
        shape whose text is always parsed has none: the run asks it only of plain text)."""
        raise NotImplementedError

    def opening(self, index: int) -> bytes | None:
        """An event to send before any text, or None."""
        return None

    def last(self, ch: Choice, text: str, chunk: OutputChunk | None) -> bytes:
        """The event that ends choice ``ch`` (with the last text and logprobs, if any)."""
        raise NotImplementedError

    def with_logprobs(self, index: int, text: str, chunk: OutputChunk) -> bytes:
        """A text event that carries the logprobs of ``chunk``'s tokens."""
        raise NotImplementedError

    def pieces(self, index: int, pieces: Pieces) -> bytes:
        """The events of one parsed delta: reasoning, content, tool calls."""
        raise NotImplementedError

    def whole(self, choices: list, texts: list[str]) -> bytes:
        """The non-streamed response body."""
        raise NotImplementedError

    def usage_event(self, choices: list) -> bytes:
        """The event of the usage after the last choice ended (when ``include_usage``)."""
        raise NotImplementedError

    def error_event(
        self, exc: Exception, status: int | None = None, kind: str | None = None
    ) -> bytes:
        """An error after the stream began (an engine died or aborted the request; the request
        timeout passed), with the status the response would have had before it began
        (``status`` and ``kind`` given, or 504 for a timeout, else 503)."""
        raise NotImplementedError
