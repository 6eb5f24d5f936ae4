"""Encode only what is new: a rendered prompt's ids from the ids of its cached prefixes.

An agent re-sends its whole conversation every turn, and a fleet of agents one system prompt.
The ids of a prompt's text up to an **anchor** (an added token the tokenizer always cuts at)
do not depend on the text after it, so they are kept in an `EncodeCache` (native, shared by
every worker of a server: `tsfront._native.EncodeCache`) and a turn encodes only its tail.

Why a cut is exact (``tokenizers``' ``encode(text, add_special_tokens=False)``):

1. The added tokens are taken out of the text first, non-normalized ones (one left-to-right
   leftmost-longest pass over the raw text) then normalized ones (over each normalized piece);
   the normalizer, the pre-tokenizer and the model then work on each remaining piece alone. A
   post-processor adds nothing without ``add_special_tokens``.
2. An anchor's every occurrence is taken out as that token when no other added token of its
   pass (or an earlier one) can overlap it: none holds it, no proper suffix of another is a
   proper prefix of it, it does not overlap itself; it has no ``lstrip`` / ``rstrip`` /
   ``single_word``, and starts and ends with no whitespace (so no neighbour's strip reaches
   into it). A normalized token is an anchor only when the normalizer does nothing (none, or
   an empty sequence); ``encode_special_tokens`` turns the special ones off.
3. So ``encode(P + A + T) == encode(P + A) + encode(A + T)[1:]`` where ``A`` is an anchor
   occurrence: the text after ``A`` is encoded after ``A`` (never at offset 0, which
   Metaspace's ``prepend_scheme: first`` looks at), and its leftmost-longest pass starts right
   after ``A`` as it does in the whole text. The first id of ``encode(A + T)`` is ``A``'s
   (checked: a mismatch turns the cache off for the model and logs it).

Not cached (detected at load, `exact_anchors` says why): truncation or padding set on the
tokenizer, BPE dropout, no provable anchor among the tokens the chat template writes. Only
rendered chat prompts go through it (``add_special_tokens=False``), and only those of at
least `MIN_CACHED_CHARS` characters.
"""

from __future__ import annotations

import json
import logging
import mmap
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tsfront import _native

__all__ = [
    "COUNTERS",
    "DEFAULT_CACHE_MB",
    "MIN_CACHED_CHARS",
    "PRIVATE_CACHE_MB",
    "Anchors",
    "PromptEncoder",
    "exact_anchors",
    "new_cache",
    "private_cache",
]

log = logging.getLogger("tsfront.text")

#: The store's counters, as `_native.EncodeCache.counters` returns them (then bytes reserved).
COUNTERS = (
    "lookups", "hits", "hit_bytes", "stored", "store_busy", "stale", "refreshed", "too_big",
)  # fmt: skip

#: Default size of a server's shared store (``tsfront serve --encode-cache-mb``): about 8
#: bytes a cached token (its text and its id), so 8M tokens.
DEFAULT_CACHE_MB = 64

#: Prompts shorter than this are encoded whole: the cache's own steps (the UTF-8 bytes, the
#: anchors, a lookup, a store) cost about what encoding 2,000 characters does.
MIN_CACHED_CHARS = 2048


#: The store a process makes for itself when no server gave it a shared one (an embedded
#: `ServeApp`): anonymous memory, its pages taken only as they are written.
PRIVATE_CACHE_MB = 16


def new_cache(buffer: Any, seed: int | None = None) -> Any:
    """Format the zeroed writable ``buffer`` as an empty store and attach to it."""
    _native.encode_cache_format(buffer, secrets.randbits(64) if seed is None else seed)
    return _native.EncodeCache(buffer)


def private_cache(mb: int = PRIVATE_CACHE_MB) -> Any:
    """A store of ``mb`` MiB for this process alone."""
    return new_cache(mmap.mmap(-1, mb << 20))


@dataclass(frozen=True)
class Anchors:
    """The anchors of one tokenizer: ``texts[i]`` is one added token with id ``ids[i]``."""

    texts: tuple[str, ...]
    ids: tuple[int, ...]

    @property
    def encoded(self) -> tuple[bytes, ...]:
        return tuple(t.encode("utf-8") for t in self.texts)


def _overlaps_from_left(a: str, b: str) -> bool:
    """Whether an occurrence of ``b`` can cover the start of an occurrence of ``a`` (``b``
    holds ``a``, or a proper suffix of ``b`` is a proper prefix of ``a``)."""
    if a != b and a in b:
        return True
    return any(b.endswith(a[:k]) for k in range(1, min(len(a), len(b))))


def _overlaps(a: str, b: str) -> bool:
    return a != b and (a in b or b in a or _overlaps_from_left(a, b) or _overlaps_from_left(b, a))


def _state(component: Any) -> Any:
    if component is None:
        return None
    try:
        return json.loads(component.__getstate__())
    except Exception:  # a component that does not serialise: unknown, so not provable
        return {"type": "unknown"}


def exact_anchors(tokenizer: Any, wanted: Iterable[str]) -> tuple[Anchors | None, str]:
    """The provable anchors (module docstring) among the added tokens whose text is in
    ``wanted`` (the texts the chat template writes), or ``None`` and why not."""
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return None, "the tokenizer truncates or pads"
    if getattr(tokenizer.model, "dropout", None):
        return None, "the BPE model has dropout"
    skip_special = bool(getattr(tokenizer, "encode_special_tokens", False))
    identity = _state(tokenizer.normalizer) in (None, {"type": "Sequence", "normalizers": []})
    added = tokenizer.get_added_tokens_decoder()
    raw = [t.content for t in added.values() if not t.normalized]
    normalized = [t.content for t in added.values() if t.normalized]
    wanted = set(wanted)
    texts, ids = [], []
    for tid, token in sorted(added.items()):
        a = token.content
        if a not in wanted or not a or a[0].isspace() or a[-1].isspace():
            continue
        if token.lstrip or token.rstrip or token.single_word:
            continue
        if token.special and skip_special:
            continue
        if any(a.endswith(a[:k]) for k in range(1, len(a))):  # overlaps itself
            continue
        if token.normalized:
            if not identity:
                continue
            if any(_overlaps(a, b) for b in raw) or any(
                _overlaps_from_left(a, b) for b in normalized if b != a
            ):
                continue
        elif any(_overlaps_from_left(a, b) for b in raw if b != a):
            continue
        texts.append(a)
        ids.append(tid)
    # Anchors are searched independently: they must not overlap one another either.
    keep = [i for i, a in enumerate(texts) if not any(_overlaps(a, b) for b in texts if b != a)]
    if not keep:
        return None, "no added token the chat template writes is a provable cut"
    return Anchors(tuple(texts[i] for i in keep), tuple(ids[i] for i in keep)), ""


class PromptEncoder:
    """``encode(text)``: ``tokenizer.encode(text, add_special_tokens=False).ids``, exactly,
    reading the ids of the text up to its last known anchor from ``cache`` and storing the
    rest's."""

    def __init__(self, tokenizer: Any, anchors: Anchors, cache: Any) -> None:
        self.tokenizer = tokenizer
        self.anchors = anchors
        self.cache = cache
        self._needles = anchors.encoded
        self._batch = tokenizer.encode_batch_fast

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (``UnicodeEncodeError`` for a lone surrogate, as the tokenizer
        refuses one)."""
        data = text.encode("utf-8")
        ends, which = _native.anchor_ends(data, self._needles)
        if not ends:
            return self._batch([text], add_special_tokens=False)[0].ids
        covered, ids = self.cache.lookup(data, ends)
        texts = self.anchors.texts
        pieces = []
        for j in range(covered, len(ends)):
            segment = data[ends[j - 1] if j else 0 : ends[j]].decode("utf-8")
            pieces.append(texts[which[j - 1]] + segment if j else segment)
        last = ends[-1]
        if last < len(data):
            pieces.append(texts[which[-1]] + data[last:].decode("utf-8"))
        encodings = self._batch(pieces, add_special_tokens=False)
        segments = []
        for k, encoding in enumerate(encodings):
            got = encoding.ids
            j = covered + k  # the piece after boundary j - 1 (a tail piece: j == len(ends))
            if j:
                anchor = self.anchors.ids[which[j - 1]]
                if not got or got[0] != anchor:
                    return self._unprovable(text, anchor, got[:1])
                del got[0]
            segments.append(got)
        stored = segments[: len(ends) - covered]
        if stored:
            self.cache.store(data, ends, covered, stored)
        for got in segments:
            ids += got
        return ids

    def _unprovable(self, text: str, anchor: int, got: Sequence[int]) -> list[int]:
        # The proof's premise failed for this tokenizer: never cache for it again.
        log.warning(
            "encode cache off: anchor %d did not encode as itself (got %s); every prompt is "
            "encoded whole from now on",
            anchor,
            list(got),
        )
        self._needles = ()
        return self._batch([text], add_special_tokens=False)[0].ids

    def counters(self) -> dict[str, int]:
        """The store's counters by name (`COUNTERS`), and ``reserved`` (bytes ever written)."""
        values = self.cache.counters()
        return {**dict(zip(COUNTERS, values, strict=False)), "reserved": values[-1]}
