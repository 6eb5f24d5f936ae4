"""Anthropic's message shape: content blocks, whole and streamed (`MessagesFormat`).

A whole answer is one ``message`` object: its ``content`` blocks in the order the model wrote
them (``thinking``, then ``text``, then ``tool_use`` blocks with ``toolu_…`` ids and their
``input`` parsed), ``stop_reason`` (``end_turn``, ``max_tokens``, ``stop_sequence`` with the
matched ``stop_sequence``, ``tool_use``) and ``usage``. Streamed, the same content is the event
sequence of Anthropic's API, each event an ``event: TYPE`` line and its ``data``:

``message_start`` (the message without content), ``ping``; per block ``content_block_start``,
its ``content_block_delta`` events (``text_delta``, ``thinking_delta``, ``input_json_delta``
whose ``partial_json`` fragments are a tool call's arguments as the parser gives them, so they
arrive while the model writes the call), a thinking block's ``signature_delta``, and
``content_block_stop``; then ``message_delta`` (stop reason, usage) and ``message_stop``. An
error after the stream began is an ``error`` event and the stream's end.

A thinking block's ``signature`` is the server's seal on its text for the request's owner
(`tsfront.serve.core.seal`, purpose `THINKING`): a client sends the block back as it got it.
The usage counts as Anthropic's does: ``input_tokens`` are the prompt's tokens the engine did
not find cached, ``cache_read_input_tokens`` those it did.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tsfront.ids import call_id
from tsfront.serve.core.shape import Format, encode_json, stream_failure
from tsfront.text.tools import CallArgs, CallStart

if TYPE_CHECKING:
    from tsfront.client.stream import OutputChunk
    from tsfront.serve.core.choice import Choice
    from tsfront.serve.core.parsing import Pieces
    from tsfront.serve.core.seal import Seal

__all__ = ["THINKING", "MessagesFormat", "error_type", "stop_of"]

#: The seal's purpose for a thinking block's signature.
THINKING = "anthropic.thinking"

# Anthropic's error types by the status tsfront answers with (HTTP errors, docs: "Errors").
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an answer of ``status``."""
    return _ERROR_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")


def stop_of(ch: Choice) -> tuple[str, str | None]:
    """A finished choice's ``(stop_reason, stop_sequence)``."""
    finish = ch.finish
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    matched = ch.stop.matched if ch.stop is not None else None
    if matched is not None:
        return "stop_sequence", matched
    return "end_turn", None


def _input(arguments: str) -> dict[str, Any]:
    # A call's arguments (JSON text the parser made) as tool_use's ``input`` object.
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessagesFormat(Format):
    """The message and its events for one ``/v1/messages`` request (one choice).

    Args:
        model: the served model's name.
        text: the model's text layer.
        prompt_tokens: the prompt's tokens (``message_start``'s ``input_tokens``).
        seal: the server's seal (thinking signatures).
        owner: the request's owner (whose signatures they are).
    """

    id_prefix = "msg_"

    def __init__(self, model: str, text: Any, prompt_tokens: int, seal: Seal, owner: str) -> None:
        super().__init__(model, text, 1, False)
        self.prompt_tokens = prompt_tokens
        self._seal = seal
        self._owner = owner
        self._count = 0  # content blocks started (the next block's index)
        self._open: dict[str, Any] | None = None  # the block being streamed
        self._open_index = 0
        self._texts: list[str] = []  # its text deltas, joined once when it closes
        self._calls: dict[int, int] = {}  # the parser's call index → the block's index

    # -- the Format interface ------------------------------------------------------------------

    def opening(self, index: int) -> bytes | None:
        usage = {
            "input_tokens": self.prompt_tokens,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        start = self._event("message_start", {"message": self._message([], None, None, usage)})
        return start + self._event("ping", {})

    def pieces(self, index: int, pieces: Pieces) -> bytes:
        if not pieces:
            return b""
        out: list[bytes] = []
        if pieces.reasoning:
            self._text("thinking", pieces.reasoning, out)
        if pieces.content:
            self._text("text", pieces.content, out)
        for delta in pieces.calls:
            if type(delta) is CallStart:
                self._close(out)
                block = {"type": "tool_use", "id": call_id(24, "toolu_"), "name": delta.name}
                self._calls[delta.index] = self._start({**block, "input": {}}, out)
            elif type(delta) is CallArgs and delta.text:
                at = self._calls.get(delta.index)
                if at is not None:
                    fragment = {"type": "input_json_delta", "partial_json": delta.text}
                    out.append(self._event("content_block_delta", {"index": at, "delta": fragment}))
        return b"".join(out)

    def last(self, ch: Choice, text: str, chunk: OutputChunk | None) -> bytes:
        out: list[bytes] = []
        self._close(out)
        reason, sequence = stop_of(ch)
        out.append(
            self._event(
                "message_delta",
                {
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": self._usage(ch),
                },
            )
        )
        out.append(self._event("message_stop", {}))
        return b"".join(out)

    def whole(self, choices: list, texts: list[str]) -> bytes:
        (ch,) = choices
        message = ch.parser.message()
        blocks: list[dict[str, Any]] = []
        thought = message.get("reasoning_content")
        if thought:
            blocks.append(
                {"type": "thinking", "thinking": thought, "signature": self._sign(thought)}
            )
        if message.get("content"):
            blocks.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            function = call["function"]
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call_id(24, "toolu_"),
                    "name": function["name"],
                    "input": _input(function["arguments"]),
                }
            )
        reason, sequence = stop_of(ch)
        return encode_json(self._message(blocks, reason, sequence, self._usage(ch)))

    def error_event(
        self, exc: Exception, status: int | None = None, kind: str | None = None
    ) -> bytes:
        if status is None:
            _, status = stream_failure(exc)
        return self._event("error", {"error": {"type": error_type(status), "message": str(exc)}})

    # -- building blocks -----------------------------------------------------------------------

    @staticmethod
    def _event(kind: str, body: dict[str, Any]) -> bytes:
        data = encode_json({"type": kind, **body})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def _message(
        self,
        content: list[dict[str, Any]],
        reason: str | None,
        sequence: str | None,
        usage: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage,
        }

    @staticmethod
    def _usage(ch: Choice) -> dict[str, Any]:
        cached = min(ch.cached, ch.prompt_tokens)
        return {
            "input_tokens": ch.prompt_tokens - cached,
            "output_tokens": ch.tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        }

    def _sign(self, thought: str) -> str:
        return self._seal.tag(THINKING, self._owner, thought)

    def _start(self, block: dict[str, Any], out: list[bytes]) -> int:
        at = self._count
        self._count += 1
        self._open, self._open_index = block, at
        out.append(self._event("content_block_start", {"index": at, "content_block": block}))
        return at

    def _text(self, kind: str, text: str, out: list[bytes]) -> None:
        if self._open is None or self._open["type"] != kind:
            self._close(out)
            shell = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            self._start(shell, out)
        self._texts.append(text)
        delta = (
            {"type": "thinking_delta", "thinking": text}
            if kind == "thinking"
            else {"type": "text_delta", "text": text}
        )
        out.append(self._event("content_block_delta", {"index": self._open_index, "delta": delta}))

    def _close(self, out: list[bytes]) -> None:
        block, self._open = self._open, None
        if block is None:
            return
        at = self._open_index
        if block["type"] == "thinking":
            signature = {"type": "signature_delta", "signature": self._sign("".join(self._texts))}
            out.append(self._event("content_block_delta", {"index": at, "delta": signature}))
        self._texts.clear()
        out.append(self._event("content_block_stop", {"index": at}))
