"""Incremental detokenization of one stream.

A :class:`Detokenizer` turns the token ids of one output stream into text deltas whose
concatenation equals the ``tokenizers`` package's own decode of the whole output (decoded after
the prompt's tail, so a SentencePiece ``▁`` on the first output token becomes the space it is
in the full text). A token that ends inside a multi-byte UTF-8 character yields ``""``: its
bytes are held until the character is complete, never shown as U+FFFD.

Three algorithms, chosen per model by :meth:`TextModel.detokenizer` (docs/TEXT.md has the
measurements behind the choice):

- :class:`ByteLevelDetokenizer`, for a tokenizer whose decoder is exactly ``ByteLevel``
  (GPT-2, Llama-3, Qwen): each token id maps to fixed bytes (a table built once per model,
  with the decoder's own rule), and a C incremental UTF-8 decoder turns the bytes into text.
  No ``tokenizers`` call per token.
- :class:`StreamDetokenizer` with ``tokenizers.decoders.DecodeStream`` (Rust), for any other
  decoder (SentencePiece ``▁``, byte fallback, WordPiece ...): it decodes a short window of ids
  with and without the new ones and emits the difference once the text no longer ends in an
  incomplete character.
- :class:`StreamDetokenizer` without DecodeStream (tokenizers before 0.21, or a window that
  DecodeStream refuses): the same prefix/read-offset algorithm in Python, as vLLM's.
"""

from __future__ import annotations

import codecs
import copy
from collections.abc import Sequence
from typing import Any

from tsfront.text._deps import require

# The prompt tail passed as context: at least this many tokens, grown up to the maximum
# until it decodes without a replacement character (a tail that starts inside a character).
_CONTEXT_MIN = 4
_CONTEXT_MAX = 24
_REPLACEMENT = "\ufffd"


def prompt_context(tokenizer: Any, prompt_ids: Sequence[int] | None, skip: bool) -> list[int]:
    """The tail of the prompt that the first output token is decoded after."""
    if not prompt_ids:
        return []
    ids = list(prompt_ids[-_CONTEXT_MAX:])
    if len(ids) <= _CONTEXT_MIN:
        return ids
    for n in range(_CONTEXT_MIN, len(ids) + 1):
        tail = ids[-n:]
        if _REPLACEMENT not in tokenizer.decode(tail, skip_special_tokens=skip):
            return tail
    return ids[-_CONTEXT_MIN:]


class Detokenizer:
    """Turns one stream's token ids into text deltas. Made by ``TextModel.detokenizer``.

    Not thread-safe; one per stream. ``copy.copy(detok)`` forks its state.
    """

    __slots__ = ()

    def step(self, token_ids: Sequence[int]) -> str:
        """The new text for these tokens (``""`` while a character is incomplete)."""
        raise NotImplementedError

    def flush(self) -> str:
        """At the end of the stream: the held-back text (an incomplete character as U+FFFD,
        exactly as a full decode shows it)."""
        raise NotImplementedError


def byte_level_table(tokenizer: Any) -> tuple[list[bytes], frozenset[int]] | None:
    """The bytes of every token id and the set of special ids, when the tokenizer's decoder is
    exactly ``ByteLevel``; ``None`` otherwise.

    The rule is the decoder's own: a token whose characters are all in the GPT-2 byte alphabet
    stands for those bytes; any other token (an added token such as ``"café✓"``) for its UTF-8.
    Ids with no token decode to nothing, as in ``Tokenizer.decode``.
    """
    decoders = require("tokenizers.decoders")
    if type(tokenizer.decoder) is not decoders.ByteLevel:
        return None
    alphabet = _byte_alphabet()
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    added = tokenizer.get_added_tokens_decoder()
    n = max(n, max(added, default=-1) + 1)
    table: list[bytes] = []
    id_to_token = tokenizer.id_to_token
    for i in range(n):
        token = id_to_token(i)
        if token is None:
            table.append(b"")
            continue
        try:
            table.append(bytes([alphabet[c] for c in token]))
        except KeyError:
            table.append(token.encode("utf-8"))
    special = frozenset(i for i, t in added.items() if t.special)
    return table, special


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's map from the printable stand-in characters back to bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


class ByteLevelDetokenizer(Detokenizer):
    """Byte-level BPE streams: a table lookup and a C UTF-8 decoder per token."""

    __slots__ = ("_n", "_table", "_utf8")

    def __init__(
        self,
        table: list[bytes],
        prompt_ids: Sequence[int] | None = None,
    ) -> None:
        self._table = table
        self._n = len(table)
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        if prompt_ids:
            # A prompt that ends inside a character: its bytes start the first output text.
            self._utf8.decode(self._bytes(prompt_ids[-_CONTEXT_MIN:]))

    def _bytes(self, token_ids: Sequence[int]) -> bytes:
        table, n = self._table, self._n
        return b"".join([table[t] for t in token_ids if 0 <= t < n])

    def step(self, token_ids: Sequence[int]) -> str:
        """The new text for these tokens (``""`` while a character is incomplete)."""
        if len(token_ids) == 1:
            t = token_ids[0]
            return self._utf8.decode(self._table[t]) if 0 <= t < self._n else ""
        return self._utf8.decode(self._bytes(token_ids))

    def flush(self) -> str:
        """At the end of the stream: the held-back bytes, as U+FFFD (as a full decode)."""
        text = self._utf8.decode(b"", True)
        self._utf8.reset()
        return text

    def __copy__(self) -> ByteLevelDetokenizer:
        other = ByteLevelDetokenizer.__new__(ByteLevelDetokenizer)
        other._table = self._table
        other._n = self._n
        other._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        other._utf8.setstate(self._utf8.getstate())
        return other


class StreamDetokenizer(Detokenizer):
    """Any tokenizer: ``DecodeStream`` when given, else the prefix/read-offset algorithm."""

    __slots__ = ("_emitted", "_ids", "_list_step", "_prefix", "_skip", "_stream", "_tokenizer")

    def __init__(
        self,
        tokenizer: Any,
        decode_stream: type | None,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        context = prompt_context(tokenizer, prompt_ids, skip_special_tokens)
        # Every id fed (context first) and how many of them the emitted text covers; the rest
        # are held (an incomplete character) and decoded by flush(). The held ids are decoded
        # after ids[_prefix:_emitted], the ids of the last emission: a window that starts on a
        # whole character (a byte-fallback decoder turns a run of byte tokens that starts
        # inside a character into U+FFFD throughout).
        self._ids = context
        self._prefix = 0
        self._emitted = len(context)
        self._list_step = True
        # None: the prefix/read-offset algorithm in Python (no DecodeStream in this version
        # of tokenizers, or DecodeStream refused this stream's window).
        self._stream = (
            None
            if decode_stream is None
            else decode_stream(ids=context or None, skip_special_tokens=skip_special_tokens)
        )

    def step(self, token_ids: Sequence[int]) -> str:
        """The new text for these tokens (``""`` while a character is incomplete)."""
        if not token_ids:
            return ""
        ids = self._ids
        ids.extend(token_ids)
        stream = self._stream
        if stream is None:
            return self._step_offsets()
        try:
            if len(token_ids) == 1:
                out = stream.step(self._tokenizer, token_ids[0])
            elif self._list_step:
                out = stream.step(self._tokenizer, list(token_ids))
            else:
                return self._step_each(token_ids)
        except TypeError:
            # tokenizers before 0.22 take one id per step; the stream has not moved.
            self._list_step = False
            return self._step_each(token_ids)
        except Exception:
            # DecodeStream refuses a window whose text does not extend its previous text
            # ("invalid prefix"); this stream goes on with the offsets algorithm.
            self._stream = None
            return self._step_offsets()
        if out is None:
            return ""
        self._prefix = self._emitted
        self._emitted = len(ids)
        return out

    def _step_each(self, token_ids: Sequence[int]) -> str:
        parts = []
        base = len(self._ids) - len(token_ids)
        for k, t in enumerate(token_ids):
            try:
                out = self._stream.step(self._tokenizer, t)
            except Exception:
                self._stream = None
                parts.append(self._step_offsets())
                return "".join(parts)
            if out is not None:
                parts.append(out)
                self._prefix = self._emitted
                self._emitted = base + k + 1
        return "".join(parts)

    def _step_offsets(self) -> str:
        text = self._pending_text()
        if not text or text.endswith(_REPLACEMENT):
            return ""
        self._prefix = self._emitted
        self._emitted = len(self._ids)
        return text

    def _pending_text(self) -> str:
        """Text of the ids fed after the last emitted one, decoded after a few before it."""
        ids = self._ids
        if self._emitted >= len(ids):
            return ""
        start = self._prefix
        decode = self._tokenizer.decode
        base = decode(ids[start : self._emitted], skip_special_tokens=self._skip)
        full = decode(ids[start:], skip_special_tokens=self._skip)
        if full.startswith(base):
            return full[len(base) :]
        # Byte-fallback decoders turn a group of byte tokens that is not valid UTF-8 into one
        # U+FFFD per byte, including bytes of a character already emitted: the held ids alone.
        return decode(ids[self._emitted :], skip_special_tokens=self._skip)

    def flush(self) -> str:
        """At the end of the stream: the held-back text (an incomplete character as U+FFFD,
        exactly as a full decode shows it)."""
        text = self._pending_text()
        if text:
            self._prefix = self._emitted
            self._emitted = len(self._ids)
        return text

    def __copy__(self) -> StreamDetokenizer:
        other = StreamDetokenizer.__new__(StreamDetokenizer)
        other._tokenizer = self._tokenizer
        other._skip = self._skip
        other._stream = None if self._stream is None else copy.copy(self._stream)
        other._ids = list(self._ids)
        other._prefix = self._prefix
        other._emitted = self._emitted
        other._list_step = self._list_step
        return other
