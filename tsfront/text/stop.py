"""Stop strings matched in the streamed text.

The engine refuses stop strings (it only knows stop token ids), so the frontend matches them in
the detokenized text. :class:`StopMatcher` sits between the detokenizer and the client: it
holds back any suffix that could still grow into a stop string, so no part of a stop string is
ever emitted before the match is known, and tells the caller the moment a stop string is
complete so it can abort the engine request.

Which match wins: the stop string that is *complete* first in the text (smallest end offset),
as the engine would have produced it; among several ending at the same offset, the longest
(it started earliest). This answer depends only on the whole text, never on how it was split
into deltas.

Cost per :meth:`StopMatcher.feed`: the held-back text is shorter than the longest stop string
(``L``), so the search for a match scans at most ``len(text) + L - 1`` characters once per stop
string, in C (``str.find``); nothing already emitted is scanned again. Finding what to hold back
looks only at the last ``min(L - 1, len(held + text))`` characters, and returns at once when
none of them can start a stop string (the common case); otherwise it tries the suffixes of
that window longest first (a set lookup each), so its worst case grows with the square of that
window, never with the length of the output.
"""

from __future__ import annotations

from collections.abc import Sequence

from tsfront.text.errors import TextError


class StopMatcher:
    """Incremental matcher of one stream's stop strings.

    Args:
        stop: the stop strings (duplicates ignored; an empty string is refused).
        include_stop_str_in_output: emit the matched stop string itself (OpenAI's default is
            to leave it out).

    Attributes:
        matched: the stop string that matched, or ``None`` while none has.
    """

    __slots__ = ("_first", "_held", "_include", "_longest", "_prefixes", "_stops", "matched")

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        if isinstance(stop, str):
            stop = [stop]
        stops: list[str] = []
        for s in stop:
            if not isinstance(s, str):
                raise TextError(f"stop strings must be str, got {type(s).__name__}: pass text")
            if not s:
                raise TextError("a stop string is empty: it would match at once; drop it")
            if s not in stops:
                stops.append(s)
        self._stops = tuple(stops)
        self._include = include_stop_str_in_output
        self._longest = max((len(s) for s in stops), default=0)
        # Every proper prefix of every stop string: a held-back suffix is one of these.
        self._prefixes = frozenset(s[:k] for s in stops for k in range(1, len(s)))
        # First characters of the stop strings: a delta without any of them (and nothing held)
        # cannot complete or start a stop string.
        self._first = tuple(dict.fromkeys(s[0] for s in stops))
        self._held = ""
        self.matched: str | None = None

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings, deduplicated, in the order given."""
        return self._stops

    @property
    def pending(self) -> str:
        """The text held back because it could be the start of a stop string."""
        return self._held

    def feed(self, text: str) -> tuple[str, bool]:
        """Add the next delta of text; return ``(text safe to emit now, matched)``.

        Once a stop string matches, the returned text ends just before it (or just after it
        with ``include_stop_str_in_output``) and every later call returns ``("", True)``.
        """
        if self.matched is not None:
            return "", True
        held = self._held
        if not held:
            # Fast path (most deltas): no character of the delta can start a stop string, so
            # nothing matches and nothing need be held.
            for c in self._first:
                if c in text:
                    break
            else:
                return text, False
            buf = text
        else:
            buf = held + text
        # A match must end inside the new text (the held text alone matched nothing), so each
        # search starts where a stop string ending in the new text could start.
        best_end = -1
        best_start = 0
        best: str | None = None
        n_held = len(held)
        for s in self._stops:
            i = buf.find(s, max(0, n_held - len(s) + 1))
            if i < 0:
                continue
            end = i + len(s)
            if best is None or end < best_end or (end == best_end and i < best_start):
                best, best_start, best_end = s, i, end
        if best is not None:
            self.matched = best
            self._held = ""
            return buf[: best_end if self._include else best_start], True
        keep = self._held_suffix(buf)
        if keep:
            self._held = buf[-keep:]
            return buf[:-keep], False
        self._held = ""
        return buf, False

    def _held_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that could start a stop string."""
        window = min(self._longest - 1, len(buf))
        if window <= 0:
            return 0
        tail = buf[-window:]
        # Common case: none of the stop strings' first characters is in the tail.
        if not any(c in tail for c in self._first):
            return 0
        prefixes = self._prefixes
        for k in range(window, 0, -1):
            if tail[-k:] in prefixes:
                return k
        return 0

    def flush(self) -> str:
        """At the end of a stream that matched nothing: the held-back text ("" after a match)."""
        held, self._held = self._held, ""
        return held if self.matched is None else ""
