"""One engine request of a response: its stream, detokenizer, stop matcher, parser and counts.

A response has one `Choice` per engine request (prompts x ``n``). `tsfront.serve.core.service` makes
them and reads their streams; `tsfront.serve.openai.formats` turns them into OpenAI's shapes. Here
only what both need: the text of each chunk (after stop strings), the counts the usage
reports, and the finish reason, in OpenAI's terms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tsfront.client.stream import OutputChunk, RequestStream
    from tsfront.serve.core.parsing import OutputParser
    from tsfront.text.detok import Detokenizer
    from tsfront.text.stop import StopMatcher

__all__ = ["ABORT", "Choice"]

#: ``Choice.finish`` of a request the engine aborted after it began: never sent as a
#: ``finish_reason`` (OpenAI has none such); the response ends with an error instead.
ABORT = "abort"
_FINISH = {"stop": "stop", "length": "length", "abort": ABORT}


class Choice:
    """One engine request of a response.

    Args:
        index: the choice's ``index`` in the response.
        stream: its engine stream.
        detok: its detokenizer.
        stop: its stop matcher (``None``: no stop strings).
        prompt_tokens: the prompt's length.
        parser: splits its text into reasoning, content and tool calls (``None``: the text
            is the content).
    """

    __slots__ = (
        "cached",
        "detok",
        "failure",
        "finish",
        "index",
        "logprobs",
        "parser",
        "prompt_tokens",
        "stop",
        "stream",
        "tokens",
    )

    def __init__(
        self,
        index: int,
        stream: RequestStream,
        detok: Detokenizer,
        stop: StopMatcher | None,
        prompt_tokens: int,
        parser: OutputParser | None = None,
    ) -> None:
        self.index = index
        self.stream = stream
        self.detok = detok
        self.stop = stop
        self.parser = parser
        #: What its parser raised on the model's output in the stream's sink
        #: (`tsfront.serve.core.push.ParsedPusher`, which aborted the request), or None.
        self.failure: Exception | None = None
        self.tokens = 0
        self.prompt_tokens = prompt_tokens
        self.cached = 0
        #: None while running; ``"stop"``, ``"length"``, ``"tool_calls"``, or `ABORT`.
        self.finish: str | None = None
        self.logprobs: list[tuple[int, float]] | None = None

    def plain(self, tokens: list[int]) -> str:
        """The text of tokens that end nothing (no finish reason; no stop strings to match)."""
        self.tokens += len(tokens)
        return self.detok.step(tokens)

    def text(self, chunk: OutputChunk) -> str:
        """The new text of ``chunk`` (after stop matching); sets ``finish`` on the last one."""
        ids = chunk.output_ids
        self.tokens += len(ids)
        text = self.detok.step(ids) if ids else ""
        reason = chunk.finish_reason
        if reason is not None:
            text += self.detok.flush()
            self.prompt_tokens = chunk.prompt_tokens or self.prompt_tokens
            self.cached = chunk.cached_tokens
        stop = self.stop
        if stop is not None:
            text, matched = stop.feed(text)
            if matched:
                # Stop decoding now instead of running on to max_tokens.
                self.stream.abort()
                self.finish = "stop"
                self.prompt_tokens = chunk.prompt_tokens or self.prompt_tokens
                self.cached = chunk.cached_tokens
                return text
            if reason is not None:
                text += stop.flush()
        if reason is not None:
            self.finish = _FINISH.get(reason, reason)
            if chunk.completion_tokens:
                self.tokens = chunk.completion_tokens
        return text

    def settle(self) -> None:
        """After the parser's last output: ``"stop"`` becomes ``"tool_calls"`` when a call was
        parsed (a call cut by ``max_tokens`` keeps ``"length"``)."""
        parser = self.parser
        if self.finish == "stop" and parser is not None and parser.called:
            self.finish = "tool_calls"
