"""The code under test: a user's own stream consumer.

`TextConsumer` is what an application might do with every chunk of a tsfront stream: keep
the tokens, count them, and turn each into a piece of text (here a lookup table, as a
detokenizer's fast path is). The tests next to this file check it and measure it per token.
"""

from __future__ import annotations

from tsfront import RequestStream


class TextConsumer:
    """Reads a stream to its end; ``tokens``, ``text`` and ``finish_reason`` afterwards."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = vocab
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.finish_reason: str | None = None

    async def consume(self, stream: RequestStream) -> int:
        """Read every chunk; returns the number of tokens read."""
        vocab, size = self.vocab, len(self.vocab)
        async for chunk in stream:
            for token in chunk.output_ids:
                self.tokens.append(token)
                self.pieces.append(vocab[token % size])
            if chunk.finish_reason is not None:
                self.finish_reason = chunk.finish_reason
        return len(self.tokens)

    @property
    def text(self) -> str:
        return "".join(self.pieces)
