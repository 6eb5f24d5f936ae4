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

How: a :class:`StopSet` compiles the stop strings once into an Aho-Corasick automaton (a trie
of the stop strings with failure links). Its state after any text is the longest suffix of
that text that is a prefix of some stop string, which is exactly what must be held back; a
state that ends a stop string (itself or through its failure links) is a match, and the
longest stop string ending there is precomputed per state. The tables take memory and time
linear in the stop strings' total length, and one `StopSet` serves every choice of a request:
a :class:`StopMatcher` is that set plus its own state and held text.

Cost per :meth:`StopMatcher.feed`: nothing held and none of the stop strings' first
characters in the delta (the common case) returns at once; otherwise each character of the
delta is one automaton step (amortised O(1): a failure link only ever shortens the state), and
a run of characters that cannot start a stop string is skipped by one regular-expression
search in C. Nothing already emitted is scanned again, so a stream costs time linear in its
length, whatever the stop strings.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence

from tsfront.text.errors import TextError

__all__ = ["StopMatcher", "StopSet"]


class StopSet:
    """Stop strings compiled once (an Aho-Corasick automaton), shared by the matchers of
    every choice of a request.

    Args:
        stop: the stop strings (duplicates ignored; an empty string is refused).
    """

    __slots__ = ("_done", "_fail", "_first", "_goto", "_skip", "_stops", "depth")

    def __init__(self, stop: Sequence[str]) -> None:
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
        # The trie: node 0 is the root; goto[node][char] -> child; depth[node] = its length.
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        word = [-1]  # the stop string a node spells in full, or -1
        for w, s in enumerate(stops):
            node = 0
            for c in s:
                nxt = goto[node].get(c)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][c] = nxt
                    goto.append({})
                    depth.append(depth[node] + 1)
                    word.append(-1)
                node = nxt
            word[node] = w
        # Failure links (longest proper suffix that is a trie node), breadth first; done[node]
        # = the longest stop string that is a suffix of the node's text (itself first).
        fail = [0] * len(goto)
        done = list(word)
        order = list(goto[0].values())
        for node in order:
            for c, child in goto[node].items():
                f = fail[node]
                while f and c not in goto[f]:
                    f = fail[f]
                fail[child] = goto[f].get(c, 0)  # shallower than child: node is not the root
                if done[child] < 0:
                    done[child] = done[fail[child]]
                order.append(child)
        self._goto = goto
        self._fail = fail
        self._done = done
        self.depth = depth
        # First characters of the stop strings: a delta without any of them (and nothing held)
        # cannot complete or start a stop string.
        self._first = tuple(goto[0])
        # (With no stop strings the fast path always returns: the pattern is never searched.)
        self._skip = re.compile(
            "[" + "".join(re.escape(c) for c in self._first) + "]" if stops else "(?!)"
        )

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings, deduplicated, in the order given."""
        return self._stops

    def __len__(self) -> int:
        return len(self._stops)

    def matcher(self, include_stop_str_in_output: bool = False) -> StopMatcher:
        """A new matcher of one stream over these stop strings."""
        return StopMatcher(self, include_stop_str_in_output)


class StopMatcher:
    """Incremental matcher of one stream's stop strings.

    Args:
        stop: the stop strings (duplicates ignored; an empty string is refused), or a
            compiled :class:`StopSet` to share its tables.
        include_stop_str_in_output: emit the matched stop string itself (OpenAI's default is
            to leave it out).

    Attributes:
        matched: the stop string that matched, or ``None`` while none has.
    """

    __slots__ = ("_held", "_held_len", "_include", "_set", "_state", "matched")

    def __init__(
        self, stop: Sequence[str] | StopSet, include_stop_str_in_output: bool = False
    ) -> None:
        self._set = stop if isinstance(stop, StopSet) else StopSet(stop)
        self._include = include_stop_str_in_output
        self._state = 0
        # The held text (the last depth[state] characters of the stream) as the deltas it
        # came in, so that holding a long prefix never copies it per delta.
        self._held: deque[str] = deque()
        self._held_len = 0
        self.matched: str | None = None

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings, deduplicated, in the order given."""
        return self._set.stops

    @property
    def pending(self) -> str:
        """The text held back because it could be the start of a stop string."""
        return "".join(self._held)

    def feed(self, text: str) -> tuple[str, bool]:
        """Add the next delta of text; return ``(text safe to emit now, matched)``.

        Once a stop string matches, the returned text ends just before it (or just after it
        with ``include_stop_str_in_output``) and every later call returns ``("", True)``.
        """
        if self.matched is not None:
            return "", True
        stops = self._set
        state = self._state
        if not state:
            # Fast path (most deltas): no character of the delta can start a stop string, so
            # nothing matches and nothing need be held.
            for c in stops._first:
                if c in text:
                    break
            else:
                return text, False
        goto = stops._goto
        fail = stops._fail
        done = stops._done
        skip = stops._skip
        n = len(text)
        i = 0
        while i < n:
            if not state:
                # Jump to the next character that can start a stop string (one search in C).
                m = skip.search(text, i)
                if m is None:
                    break
                i = m.start()
            c = text[i]
            i += 1
            while True:
                nxt = goto[state].get(c)
                if nxt is not None:
                    state = nxt
                    break
                if not state:
                    break
                state = fail[state]
            w = done[state]
            if w >= 0:
                s = stops._stops[w]
                buf = "".join(self._held) + text[:i]
                self.matched = s
                self._held = deque()
                self._held_len = 0
                self._state = 0
                return (buf if self._include else buf[: len(buf) - len(s)]), True
        self._state = state
        keep = stops.depth[state]
        held = self._held
        if keep <= n:
            # Everything held before is released; the new hold (if any) is a tail of the delta.
            out = "".join(held) + text[: n - keep] if held else text[: n - keep]
            self._held = deque((text[n - keep :],)) if keep else deque()
            self._held_len = keep
            return out, False
        # The hold grew by the whole delta; release what fell off its front (each character
        # is appended and released once, so this is linear in the stream).
        drop = self._held_len + n - keep
        released: list[str] = []
        while drop:
            piece = held[0]
            if len(piece) <= drop:
                released.append(piece)
                held.popleft()
                drop -= len(piece)
            else:
                released.append(piece[:drop])
                held[0] = piece[drop:]
                drop = 0
        held.append(text)
        self._held_len = keep
        return "".join(released), False

    def flush(self) -> str:
        """At the end of a stream that matched nothing: the held-back text ("" after a match)."""
        held, self._held = self._held, deque()
        self._held_len = 0
        self._state = 0
        return "".join(held) if self.matched is None else ""
