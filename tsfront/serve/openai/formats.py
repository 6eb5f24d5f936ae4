"""The OpenAI response shapes: completions and chat, whole and streamed.

A streamed event is ``head(index) + json(text) + tail`` (`tsfront.serve.core.shape.Format`):
the last event of a choice without logprobs is the same bytes with its ``finish_reason``. The
rarer events (the first chat delta, logprobs, usage, errors) are built as dicts and encoded
with msgspec. A response's id is 96 bits from `secrets` (`tsfront.ids`: a client may fetch
a response by its id), and the envelope after the id (object, time, model) is made once per
second.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import msgspec

from tsfront.serve.core.shape import Format, encode_json, stream_failure
from tsfront.text.tools import CallArgs, CallStart

if TYPE_CHECKING:
    from tsfront.client.stream import OutputChunk
    from tsfront.serve.core.choice import Choice
    from tsfront.serve.core.parsing import Pieces

__all__ = ["ChatFormat", "CompletionFormat", "OpenAIFormat"]

_JSON = msgspec.json.Encoder()


class OpenAIFormat(Format):
    """What both OpenAI shapes share: the chunk envelope, usage, error events, ``[DONE]``."""

    object_whole = ""
    object_chunk = ""
    done = b"data: [DONE]\n\n"

    def __init__(self, model: str, text: Any, prompts: int, include_usage: bool) -> None:
        super().__init__(model, text, prompts, include_usage)
        self._envelope = (
            b'data: {"id":"'
            + self.id.encode()
            + _after_id(self.object_chunk, self.created, model, include_usage)
        )
        self.tail = self._tail()
        self._heads: dict[int, bytes] = {}

    # -- per event -----------------------------------------------------------------------------

    def head(self, index: int) -> bytes:
        """Everything of a text event before the JSON-encoded text of choice ``index``."""
        head = self._heads.get(index)
        if head is None:
            head = self._heads[index] = self._envelope + str(index).encode() + self._text_key()
        return head

    def event(self, choice: dict[str, Any]) -> bytes:
        """A whole chunk event carrying ``choice``."""
        body: dict[str, Any] = {
            "id": self.id,
            "object": self.object_chunk,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if self.include_usage:
            body["usage"] = None
        return b"data: " + encode_json(body) + b"\n\n"

    def usage(self, choices: list) -> dict[str, Any]:
        """The ``usage`` object of a response (a prompt fanned out n times counts once)."""
        n = max(1, len(choices) // max(1, self.prompts))
        firsts = choices[::n]
        completion = sum(ch.tokens for ch in choices)
        prompt = sum(ch.prompt_tokens for ch in firsts)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(ch.cached for ch in firsts)},
        }

    def usage_event(self, choices: list) -> bytes:
        """The last event of ``stream_options.include_usage``: no choices, the usage."""
        body = {
            "id": self.id,
            "object": self.object_chunk,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage(choices),
        }
        return b"data: " + _JSON.encode(body) + b"\n\n"

    def error_event(
        self, exc: Exception, status: int | None = None, kind: str | None = None
    ) -> bytes:
        """An OpenAI error object (`Format.error_event`)."""
        if status is None or kind is None:
            kind, status = stream_failure(exc)
        body = {"error": {"message": str(exc), "type": kind, "param": None, "code": status}}
        return b"data: " + _JSON.encode(body) + b"\n\n"

    # -- shape-specific ------------------------------------------------------------------------

    def _text_key(self) -> bytes:
        raise NotImplementedError

    def _tail(self) -> bytes:
        raise NotImplementedError


class CompletionFormat(OpenAIFormat):
    """``/v1/completions``: ``text_completion`` objects."""

    object_whole = "text_completion"
    object_chunk = "text_completion"
    id_prefix = "cmpl-"

    def _text_key(self) -> bytes:
        return b',"text":'

    def _tail(self) -> bytes:
        return b',"logprobs":null,"finish_reason":null}]}\n\n'

    def _logprobs(self, pairs: list[tuple[int, float]] | None) -> dict[str, Any] | None:
        if pairs is None:
            return None
        token_text = self.text.token_text
        return {
            "tokens": [token_text(t) for t, _ in pairs],
            "token_logprobs": [v for _, v in pairs],
            "top_logprobs": None,
            "text_offset": None,
        }

    def last(self, ch: Choice, text: str, chunk: OutputChunk | None) -> bytes:
        if chunk is None:  # no logprobs: a text event's bytes, with the finish reason
            return self.head(ch.index) + _JSON.encode(text) + _finish(ch.finish)
        pairs = _pairs(chunk)
        return self.event(
            {
                "index": ch.index,
                "text": text,
                "logprobs": self._logprobs(pairs),
                "finish_reason": ch.finish,
            }
        )

    def with_logprobs(self, index: int, text: str, chunk: OutputChunk) -> bytes:
        return self.event(
            {
                "index": index,
                "text": text,
                "logprobs": self._logprobs(_pairs(chunk)),
                "finish_reason": None,
            }
        )

    def whole(self, choices: list, texts: list[str]) -> bytes:
        return _JSON.encode(
            {
                "id": self.id,
                "object": self.object_whole,
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": ch.index,
                        "text": text,
                        "logprobs": self._logprobs(ch.logprobs),
                        "finish_reason": ch.finish,
                    }
                    for ch, text in zip(choices, texts, strict=True)
                ],
                "usage": self.usage(choices),
            }
        )


class ChatFormat(OpenAIFormat):
    """``/v1/chat/completions``: ``chat.completion`` and ``chat.completion.chunk`` objects."""

    object_whole = "chat.completion"
    object_chunk = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def _text_key(self) -> bytes:
        return b',"delta":{"content":'

    def _tail(self) -> bytes:
        return b'},"logprobs":null,"finish_reason":null}]}\n\n'

    def opening(self, index: int) -> bytes | None:
        return self.event(
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        )

    def _logprobs(self, pairs: list[tuple[int, float]] | None) -> dict[str, Any] | None:
        if pairs is None:
            return None
        token_text = self.text.token_text
        token_bytes = self.text.token_bytes
        content = [
            {
                "token": token_text(token),
                "logprob": value,
                "bytes": list(token_bytes(token)),
                "top_logprobs": [],
            }
            for token, value in pairs
        ]
        return {"content": content}

    def last(self, ch: Choice, text: str, chunk: OutputChunk | None) -> bytes:
        if chunk is None:  # no logprobs: a text event's bytes (or an empty delta's), finished
            if text:
                return self.head(ch.index) + _JSON.encode(text) + b"}" + _finish(ch.finish)
            return self._envelope + b"%d" % ch.index + b',"delta":{}' + _finish(ch.finish)
        pairs = _pairs(chunk)
        return self.event(
            {
                "index": ch.index,
                "delta": {"content": text} if text else {},
                "logprobs": self._logprobs(pairs),
                "finish_reason": ch.finish,
            }
        )

    def with_logprobs(self, index: int, text: str, chunk: OutputChunk) -> bytes:
        return self.event(
            {
                "index": index,
                "delta": {"content": text},
                "logprobs": self._logprobs(_pairs(chunk)),
                "finish_reason": None,
            }
        )

    def pieces(self, index: int, pieces: Pieces) -> bytes:
        # OpenAI's delta shapes: reasoning_content, then content, then per call a first
        # delta with index, id, type, name and arguments "", then its arguments.
        if not pieces:
            return b""
        events = []
        if pieces.reasoning:
            events.append(self._delta(index, {"reasoning_content": pieces.reasoning}))
        if pieces.content:
            events.append(self.head(index) + encode_json(pieces.content) + self.tail)
        for delta in pieces.calls:
            if type(delta) is CallStart:
                call: dict[str, Any] = {
                    "index": delta.index,
                    "id": delta.id,
                    "type": "function",
                    "function": {"name": delta.name, "arguments": ""},
                }
            elif type(delta) is CallArgs:
                call = {"index": delta.index, "function": {"arguments": delta.text}}
            else:
                continue
            events.append(self._delta(index, {"tool_calls": [call]}))
        return b"".join(events)

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        return self.event({"index": index, "delta": delta, "logprobs": None, "finish_reason": None})

    def whole(self, choices: list, texts: list[str]) -> bytes:
        return encode_json(
            {
                "id": self.id,
                "object": self.object_whole,
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": ch.index,
                        "message": (
                            ch.parser.message()
                            if ch.parser is not None
                            else {"role": "assistant", "content": text}
                        ),
                        "logprobs": self._logprobs(ch.logprobs),
                        "finish_reason": ch.finish,
                    }
                    for ch, text in zip(choices, texts, strict=True)
                ],
                "usage": self.usage(choices),
            }
        )


def _finish(reason: str | None) -> bytes:
    # The end of a choice's last event, after its text.
    return b',"logprobs":null,"finish_reason":' + _JSON.encode(reason) + b"}]}\n\n"


@lru_cache(maxsize=64)
def _after_id(obj: str, created: int, model: str, include_usage: bool) -> bytes:
    # A stream event's envelope after the response id: the same for every request of a
    # server in the same second (made once, not formatted per request).
    usage = ',"usage":null' if include_usage else ""
    return (
        f'","object":"{obj}","created":{created},"model":{_JSON.encode(model).decode()}{usage},'
        '"choices":[{"index":'
    ).encode()


def _pairs(chunk: OutputChunk) -> list[tuple[int, float]]:
    values = chunk.output_token_logprobs_val or []
    return list(zip(chunk.output_ids, values, strict=False))
