"""Incremental detokenization of one stream.

A :class:`Detokenizer` turns the token ids of one output stream into text deltas whose
concatenation equals the ``tokenizers`` package's own decode of the whole output (decoded after
the prompt's tail, so a SentencePiece ``▁`` on the first output token becomes the space it is
in the full text). A token that ends inside a multi-byte UTF-8 character yields ``""``: its
bytes are held until the character is complete, never shown as U+FFFD.

Three algorithms, chosen per model by :meth:`TextModel.detokenizer` (docs/TEXT.md has the
measurements behind the choice):

- :class:`TableDetokenizer`, for a decoder whose output is the concatenation of per-token
  text (``ByteLevel`` as in GPT-2, Llama-3, Qwen; ``Metaspace``; Llama-2's byte-fallback
  chain; none): each token id maps to fixed bytes (a table built once per model, with the
  decoder's own rule, :func:`token_tables`), and CPython's incremental UTF-8 decoder (C) turns
  the bytes into text. No ``tokenizers`` call per token.
- :class:`StreamDetokenizer` with ``tokenizers.decoders.DecodeStream`` (Rust), for any other
  decoder (WordPiece, ...): it decodes a short window of ids with and without the new ones and
  emits the difference once the text no longer ends in an incomplete character.
- :class:`StreamDetokenizer` without DecodeStream (tokenizers before 0.21, or a window that
  DecodeStream refuses): the same prefix/read-offset algorithm in Python, as vLLM's.
"""

from __future__ import annotations

import codecs
import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# The prompt tail passed as context: at least this many tokens, grown up to the maximum
# until it decodes without a replacement character (a tail that starts inside a character).
_CONTEXT_MIN = 4
_CONTEXT_MAX = 24
_REPLACEMENT = "\ufffd"


def prompt_context(
    tokenizer: Any, prompt_ids: Sequence[int] | None, skip: bool
) -> tuple[list[int], list[int]]:
    """The tail of the prompt that the first output token is decoded after, split into
    ``(context, pending)``: ``pending`` are the last prompt ids when the prompt (given as ids)
    ends inside a character; they are decoded with the output, which shows the character if
    the output completes it and U+FFFD (as the full decode does) if not."""
    if not prompt_ids:
        return [], []
    ids = list(prompt_ids[-_CONTEXT_MAX:])
    end = len(ids)
    while end > 0 and len(ids) - end < _CONTEXT_MIN:
        if not tokenizer.decode(ids[:end], skip_special_tokens=skip).endswith(_REPLACEMENT):
            break
        end -= 1
    head, pending = ids[:end], ids[end:]
    if len(head) <= _CONTEXT_MIN:
        return head, pending
    for n in range(_CONTEXT_MIN, len(head) + 1):
        tail = head[-n:]
        if _REPLACEMENT not in tokenizer.decode(tail, skip_special_tokens=skip):
            return tail, pending
    return head[-_CONTEXT_MIN:], pending


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

    def native_state(self) -> tuple[list[bytes], Any, str] | None:
        """What a native step of this stream needs (see `TableDetokenizer.native_state`);
        ``None``: this stream has none."""
        return None


# Byte-fallback decoders show each byte of an invalid sequence as its own U+FFFD.
_BYTE_FALLBACK_ERRORS = "tsfront.bytefallback"


def _per_byte_replacement(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeDecodeError)
    return _REPLACEMENT * (error.end - error.start), error.end


codecs.register_error(_BYTE_FALLBACK_ERRORS, _per_byte_replacement)


@dataclass(frozen=True)
class TokenTable:
    """What each token id stands for, for a decoder whose output is a concatenation.

    Attributes:
        pieces: the bytes of each id inside a text (a skipped special token: ``b""``).
        first: for a ``Metaspace`` decoder, the bytes of an id when it is the text's first
            token (the decoder drops its ``▁`` there); else ``None``.
        special: the ids that ``skip_special_tokens`` drops.
        skip: whether this table drops them.
        strip_space: drop one leading space of the whole text (a ``Strip`` decoder, or the
            space a decoder-less tokenizer puts between tokens).
        errors: the UTF-8 error handler that reproduces the decoder's U+FFFD.
    """

    pieces: list[bytes]
    first: list[bytes] | None
    special: frozenset[int]
    skip: bool
    strip_space: bool
    errors: str

    def at_start(self, prompt_ids: Sequence[int] | None) -> bool:
        """Whether output after ``prompt_ids`` is the start of the decoded text."""
        if not prompt_ids:
            return True
        n = len(self.pieces)
        if self.first is not None:
            special = self.special if self.skip else frozenset()
            return not any(0 <= t < n and t not in special for t in prompt_ids)
        return not any(0 <= t < n and self.pieces[t] for t in prompt_ids)


def vocabulary_limit(tokenizer: Any) -> int:
    """One past the largest id with a token (model vocabulary and added tokens)."""
    added = tokenizer.get_added_tokens_decoder()
    return max(tokenizer.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)


def token_tables(tokenizer: Any) -> dict[bool, TokenTable] | None:
    """The :class:`TokenTable` of ``tokenizer`` keyed by ``skip_special_tokens``, when its
    decoder is one whose output is the concatenation of per-token text (``None`` for any
    other: DecodeStream decodes those).

    Supported, each by the decoder's own rule: ``ByteLevel`` (GPT-2 byte alphabet; a token with
    any other character stands for its UTF-8); ``Metaspace`` (``▁`` → space, dropped in the
    first token); ``Sequence[Replace(▁, " "), ByteFallback, Fuse]`` optionally followed by
    ``Strip(" ", 1, 0)`` (Llama-2, Mistral, Gemma: ``<0xNN>`` is a byte); no decoder at all
    (tokens joined by spaces). Ids with no token decode to nothing, as in ``Tokenizer.decode``.
    """
    decoder = tokenizer.decoder
    spec: Any = None if decoder is None else json.loads(decoder.__getstate__())
    kind = "join" if spec is None else spec.get("type")
    shape = None
    if kind not in ("join", "ByteLevel", "Metaspace"):
        shape = _sentencepiece_shape(spec)
        if shape is None:
            return None
    added = tokenizer.get_added_tokens_decoder()
    special = frozenset(i for i, t in added.items() if t.special)
    n = vocabulary_limit(tokenizer)
    # id_to_token is what Tokenizer.decode uses (get_vocab can disagree with it).
    id_to_token = tokenizer.id_to_token
    tokens: list[str | None] = [id_to_token(i) for i in range(n)]
    first: list[bytes] | None = None
    strip = False
    errors = "replace"
    if kind == "join":
        pieces = [b"" if t is None else b" " + t.encode() for t in tokens]
        strip = True
    elif kind == "ByteLevel":
        pieces = _byte_level_pieces(tokens)
    elif kind == "Metaspace":
        repl = spec.get("replacement", "▁")
        scheme = spec.get("prepend_scheme")
        if scheme is None:
            scheme = "always" if spec.get("add_prefix_space", True) else "never"
        pieces = [b"" if t is None else t.replace(repl, " ").encode() for t in tokens]
        if scheme != "never":
            first = [b"" if t is None else t.replace(repl, "").encode() for t in tokens]
    else:
        assert shape is not None
        (pattern, content), strip = shape
        pieces = [_fallback_bytes(t, pattern, content) for t in tokens]
        errors = _BYTE_FALLBACK_ERRORS
    skipped = list(pieces)
    for i in special:
        skipped[i] = b""
    return {
        False: TokenTable(pieces, first, special, False, strip, errors),
        True: TokenTable(skipped, first, special, True, strip, errors),
    }


def kept_table(tables: dict[bool, TokenTable], keep: frozenset[int]) -> TokenTable:
    """The table that skips special tokens but those of ``keep`` (a parser's markers: their
    text is given, the other special tokens' is not)."""
    full, skipped = tables[False], tables[True]
    pieces = list(skipped.pieces)
    for i in keep:
        if 0 <= i < len(pieces):
            pieces[i] = full.pieces[i]
    return TokenTable(
        pieces, skipped.first, skipped.special - keep, True, skipped.strip_space, skipped.errors
    )


def _sentencepiece_shape(spec: dict[str, Any]) -> tuple[tuple[str, str], bool] | None:
    """``((pattern, content), strip)`` for ``Sequence[Replace, ByteFallback, Fuse, Strip?]``."""
    if spec.get("type") != "Sequence":
        return None
    parts = spec.get("decoders") or []
    kinds = [p.get("type") for p in parts]
    if kinds not in (
        ["Replace", "ByteFallback", "Fuse"],
        ["Replace", "ByteFallback", "Fuse", "Strip"],
    ):
        return None
    replace = parts[0]
    pattern = (replace.get("pattern") or {}).get("String")
    if not isinstance(pattern, str) or not isinstance(replace.get("content"), str):
        return None
    strip = len(parts) == 4
    if strip and (parts[3].get("content"), parts[3].get("start"), parts[3].get("stop")) != (
        " ",
        1,
        0,
    ):
        return None
    return (pattern, replace["content"]), strip


def _fallback_bytes(token: str | None, pattern: str, content: str) -> bytes:
    if token is None:
        return b""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            pass
    return token.replace(pattern, content).encode()


def _byte_level_pieces(tokens: list[str | None]) -> list[bytes]:
    """ByteLevel's rule for each token, in C string operations: translate the byte alphabet
    to Latin-1 and encode; a character outside the alphabet (mapped out of Latin-1) fails the
    encode, and that token stands for its UTF-8."""
    alphabet = {c: b for b, c in enumerate(byte_alphabet())}
    table = {ord(c): b for c, b in alphabet.items()}
    for c in range(256):
        if chr(c) not in alphabet:
            table[c] = 0x10000  # not in the alphabet: must fail the Latin-1 encode
    pieces: list[bytes] = []
    for t in tokens:
        if t is None:
            pieces.append(b"")
            continue
        try:
            pieces.append(t.translate(table).encode("latin-1"))
        except UnicodeEncodeError:
            pieces.append(t.encode())
    return pieces


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in character of each byte (ByteLevel's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


#: The incremental UTF-8 decoder class, looked up once (a codec registry lookup per stream
#: showed in the server's profile).
_UTF8 = codecs.getincrementaldecoder("utf-8")


class TableDetokenizer(Detokenizer):
    """A stream decoded by table lookups and a C incremental UTF-8 decoder: no ``tokenizers``
    call per token. For the decoders :func:`token_table` supports."""

    __slots__ = ("_at_start", "_decode", "_n", "_pieces", "_table", "_utf8")

    def __init__(self, table: TokenTable, prompt_ids: Sequence[int] | None = None) -> None:
        self._table = table
        self._pieces = table.pieces
        self._n = len(table.pieces)
        self._utf8 = _UTF8(table.errors)
        self._decode = self._utf8.decode
        self._at_start = (table.first is not None or table.strip_space) and table.at_start(
            prompt_ids
        )
        if prompt_ids and not self._at_start:
            # A prompt that ends inside a character: its bytes start the first output text.
            # One whose last token ends in an ASCII byte leaves no bytes held (the decoder
            # as new): the usual case, with no decode of the tail.
            last = prompt_ids[-1]
            end = self._pieces[last][-1:] if 0 <= last < self._n else b""
            if not end or end[0] >= 0x80:
                self._decode(self._bytes(prompt_ids[-_CONTEXT_MIN:]))

    def _bytes(self, token_ids: Sequence[int]) -> bytes:
        pieces, n = self._pieces, self._n
        return b"".join([pieces[t] for t in token_ids if 0 <= t < n])

    def step(self, token_ids: Sequence[int]) -> str:
        """The new text for these tokens (``""`` while a character is incomplete)."""
        if self._at_start:
            return self._step_start(token_ids)
        if len(token_ids) == 1:
            t = token_ids[0]
            return self._decode(self._pieces[t]) if 0 <= t < self._n else ""
        return self._decode(self._bytes(token_ids))

    def _step_start(self, token_ids: Sequence[int]) -> str:
        """Tokens at the start of the text, where the first-token rules apply."""
        table = self._table
        for i, t in enumerate(token_ids):
            if not 0 <= t < self._n:
                continue
            if table.first is not None:
                if table.skip and t in table.special:
                    continue
                self._at_start = False
                return self._decode(table.first[t]) + self.step(token_ids[i + 1 :])
            text = self._decode(self._pieces[t])
            if text:
                self._at_start = False
                if text[0] == " ":
                    text = text[1:]
                return text + self.step(token_ids[i + 1 :])
        return ""

    def native_state(self) -> tuple[list[bytes], Any, str] | None:
        """What a native step of this stream needs (``tsfront._native.token_event``): the
        table's bytes per id, the incremental UTF-8 decoder whose ``buffer`` holds the bytes
        of an incomplete character (shared: the native step and `step` may take turns), and
        its error handler. ``None`` while the text's first-token rules still apply."""
        if self._at_start:
            return None
        return self._pieces, self._utf8, self._table.errors

    def flush(self) -> str:
        """At the end of the stream: the held-back bytes, as U+FFFD (as a full decode)."""
        text = self._decode(b"", True)
        self._utf8.reset()
        return text

    def __copy__(self) -> TableDetokenizer:
        other = TableDetokenizer.__new__(TableDetokenizer)
        other._table = self._table
        other._pieces = self._pieces
        other._n = self._n
        other._at_start = self._at_start
        other._utf8 = _UTF8(self._table.errors)
        other._utf8.setstate(self._utf8.getstate())
        other._decode = other._utf8.decode
        return other


def _decoder_failure(error: BaseException) -> bool:
    """An error of DecodeStream itself: any Exception, or a Rust panic (pyo3's
    PanicException derives from BaseException), never KeyboardInterrupt and the like."""
    return isinstance(error, Exception) or type(error).__name__ == "PanicException"


class StreamDetokenizer(Detokenizer):
    """Any tokenizer: ``DecodeStream`` when given, else the prefix/read-offset algorithm."""

    __slots__ = (
        "_drop",
        "_emitted",
        "_ids",
        "_limit",
        "_list_step",
        "_prefix",
        "_shown",
        "_skip",
        "_stream",
        "_tokenizer",
    )

    def __init__(
        self,
        tokenizer: Any,
        decode_stream: type | None,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
        id_limit: int | None = None,
        drop: frozenset[int] = frozenset(),
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # Ids dropped before decoding: the special tokens a request skips but for those a
        # parser reads (decoded with skip_special_tokens=False: the same text).
        self._drop = drop
        # Ids at or above this (or negative) have no token: no text, as Tokenizer.decode skips
        # an unknown id (and refuses a negative one).
        self._limit = id_limit if id_limit is not None else vocabulary_limit(tokenizer)
        limit = self._limit
        if prompt_ids:
            prompt_ids = [t for t in prompt_ids[-_CONTEXT_MAX:] if 0 <= t < limit and t not in drop]
        context, pending = prompt_context(tokenizer, prompt_ids, skip_special_tokens)
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
        self._stream: Any = None  # a tokenizers DecodeStream (untyped), or None
        if decode_stream is not None:
            try:
                self._stream = decode_stream(
                    ids=context or None, skip_special_tokens=skip_special_tokens
                )
            except TypeError:
                # tokenizers before 0.22 has no prefill: step through the context instead.
                self._stream = decode_stream(skip_special_tokens=skip_special_tokens)
                for t in context:
                    self._stream.step(tokenizer, t)
        # Text of the pending prompt ids before their broken character (the " " of a token
        # " \xf0\x9f"): part of the prompt, so not output when the output completes it.
        self._shown = ""
        if pending:
            self._ids = [*context, *pending]
            base = tokenizer.decode(context, skip_special_tokens=skip_special_tokens)
            full = tokenizer.decode(self._ids, skip_special_tokens=skip_special_tokens)
            if full.startswith(base):
                self._shown = full[len(base) :].rstrip(_REPLACEMENT)
            if self._stream is not None:
                try:
                    for t in pending:
                        self._stream.step(tokenizer, t)  # an incomplete character: no text
                except BaseException as e:
                    if not _decoder_failure(e):
                        raise
                    self._stream = None

    def step(self, token_ids: Sequence[int]) -> str:
        """The new text for these tokens (``""`` while a character is incomplete)."""
        limit = self._limit
        drop = self._drop
        if len(token_ids) == 1:
            if not 0 <= token_ids[0] < limit or (drop and token_ids[0] in drop):
                return ""
        elif not all(0 <= t < limit for t in token_ids) or (
            drop and any(t in drop for t in token_ids)
        ):
            token_ids = [t for t in token_ids if 0 <= t < limit and t not in drop]
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
        except BaseException as e:
            # DecodeStream refuses a window whose text does not extend its previous text
            # ("invalid prefix"), and some versions panic on state they got wrong; this
            # stream goes on with the offsets algorithm, which keeps its own state.
            if not _decoder_failure(e):
                raise
            self._stream = None
            return self._step_offsets()
        if out is None:
            return ""
        self._prefix = self._emitted
        self._emitted = len(ids)
        return self._unshown(out) if self._shown else out

    def _unshown(self, text: str) -> str:
        """``text`` less the prompt text it repeats at its start (see ``_shown``)."""
        shown, self._shown = self._shown, ""
        return text[len(shown) :] if text.startswith(shown) else text

    def _step_each(self, token_ids: Sequence[int]) -> str:
        parts = []
        base = len(self._ids) - len(token_ids)
        for k, t in enumerate(token_ids):
            try:
                out = self._stream.step(self._tokenizer, t)
            except BaseException as e:
                if not _decoder_failure(e):
                    raise
                self._stream = None
                parts.append(self._step_offsets())
                return "".join(parts)
            if out is not None:
                parts.append(out)
                self._prefix = self._emitted
                self._emitted = base + k + 1
        text = "".join(parts)
        return self._unshown(text) if self._shown and text else text

    def _step_offsets(self) -> str:
        text = self._pending_text()
        if not text or text.endswith(_REPLACEMENT):
            return ""
        self._prefix = self._emitted
        self._emitted = len(self._ids)
        return self._unshown(text) if self._shown else text

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
        return self._unshown(text) if self._shown else text

    def __copy__(self) -> StreamDetokenizer:
        other = StreamDetokenizer.__new__(StreamDetokenizer)
        other._tokenizer = self._tokenizer
        other._skip = self._skip
        other._drop = self._drop
        other._stream = None
        if self._stream is not None:
            try:
                other._stream = copy.copy(self._stream)
            except TypeError:
                pass  # DecodeStream up to 0.22.0 cannot be copied: the copy uses offsets
        other._ids = list(self._ids)
        other._limit = self._limit
        other._prefix = self._prefix
        other._shown = self._shown
        other._emitted = self._emitted
        other._list_step = self._list_step
        return other
