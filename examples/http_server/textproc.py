"""Text in, text out: tokenizers, incremental detokenizers and stop-string matching.

tsfront moves token ids only (it refuses stop strings on the wire), so everything textual
happens here, in the worker process:

* `ByteTokenizer` — the default: token = UTF-8 byte + 3 (ids 0, 1, 2 are pad, BOS, EOS, as
  in the simulator's default ``eos_token_id`` 2); no files, no dependency;
* `HFTokenizer` — a ``tokenizer.json`` through the ``tokenizers`` package (imported only
  when asked for);
* each has an incremental detokenizer (``tokenizer.detokenizer()``) that turns id deltas into
  text deltas, holding back incomplete UTF-8 / merge sequences until they resolve;
* `StopMatcher` — finds the first stop string in the detokenized text, holding back just
  enough text that a stop string split across deltas is never emitted in part.
"""

from __future__ import annotations

import codecs

SPECIAL_IDS = 3  # ByteTokenizer: 0 pad, 1 BOS, 2 EOS
REPLACEMENT = "\ufffd"


class ByteTokenizer:
    """UTF-8 bytes as tokens: ``id = byte + 3``; ids below 3 are special, above 258 unknown."""

    name = "bytes"
    eos_token_id = 2

    def encode(self, text: str) -> list[int]:
        return [b + SPECIAL_IDS for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        detok = self.detokenizer()
        return detok.feed(ids) + detok.flush()

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer()


class ByteDetokenizer:
    """Incremental UTF-8 decoding of byte tokens (special ids skipped, unknown ids → U+FFFD)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: list[int]) -> str:
        out = []
        for i in ids:
            if i < SPECIAL_IDS:
                continue
            if i >= SPECIAL_IDS + 256:
                out.append(self._decoder.decode(b"", final=True))  # flush a cut sequence
                out.append(REPLACEMENT)
                continue
            out.append(self._decoder.decode(bytes((i - SPECIAL_IDS,))))
        return "".join(out)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class HFTokenizer:
    """A Hugging Face ``tokenizer.json``, through the optional ``tokenizers`` package."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise RuntimeError(
                "--tokenizer needs the 'tokenizers' package (pip install tokenizers); "
                "without --tokenizer the byte tokenizer is used"
            ) from None
        self._tok = Tokenizer.from_file(path)
        self.name = path
        self.eos_token_id = None

    @classmethod
    def from_object(cls, tokenizer) -> HFTokenizer:
        """Wrap an already-built tokenizer (anything with ``encode(text).ids`` and ``decode``)."""
        self = cls.__new__(cls)
        self._tok = tokenizer
        self.name = type(tokenizer).__name__
        self.eos_token_id = None
        return self

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def detokenizer(self) -> HFDetokenizer:
        return HFDetokenizer(self)


class HFDetokenizer:
    """Incremental detokenization by re-decoding a short window (prefix/read offsets).

    Decoding token by token breaks merges and multi-token characters, so each step decodes
    ``ids[prefix:]`` and emits what it adds beyond ``ids[prefix:read]``; a window that ends in
    U+FFFD (an incomplete character) is held back until more ids arrive.
    """

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def feed(self, ids: list[int]) -> str:
        self._ids.extend(ids)
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]


def load_tokenizer(path: str | None):
    """The byte tokenizer, or the ``tokenizer.json`` at ``path``."""
    return ByteTokenizer() if path is None else HFTokenizer(path)


class StopMatcher:
    """Match stop strings in streamed text.

    ``feed(delta)`` returns ``(text, stop)``: the text that is now safe to emit and, once a
    stop string has appeared, which one (the text then ends just before it, and the request
    should be aborted). Up to ``max(len(stop)) - 1`` characters are held back between calls;
    `flush` returns them when the stream ends without a match.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._buf = ""
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, str | None]:
        if self.matched is not None:
            return "", self.matched
        if not self.stops:
            return delta, None
        self._buf += delta
        best = -1
        for stop in self.stops:
            at = self._buf.find(stop)
            if at >= 0 and (best < 0 or at < best):
                best, self.matched = at, stop
        if best >= 0:
            text, self._buf = self._buf[:best], ""
            return text, self.matched
        cut = len(self._buf) - self._hold
        if cut <= 0:
            return "", None
        text, self._buf = self._buf[:cut], self._buf[cut:]
        return text, None

    def flush(self) -> str:
        text, self._buf = self._buf, ""
        return text if self.matched is None else ""
