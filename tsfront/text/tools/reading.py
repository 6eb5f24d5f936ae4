"""Reading a call as its text arrives: the cursor and the small readers formats are made of.

A format reads a call region (from the marker that opened it) with a generator method,
``ToolParser._read(cursor)``, written top-down like the grammar it reads. Each reader here is
a generator too: it looks at :class:`Cursor` ``text`` from ``pos``, consumes what it could
decide, and ``yield``\\ s when it needs more text; the parser resumes the format's generator
when the next delta has been added. At the end of the output the cursor is ``final`` and no
reader yields again: each answers with what it has ("not found", "ended").

Every reader consumes what it has looked at (into a piece it returns or hands on), keeping back
at most what could be the start of what it waits for (a marker's first characters, a partial
literal). So the text a cursor holds stays a few characters past what was decided, and a
region of any length is read once: a call costs time linear in its text, however it is split.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator
from dataclasses import dataclass

__all__ = [
    "TRUNCATED",
    "Cursor",
    "NoCall",
    "Reader",
    "Step",
    "attributes",
    "blank",
    "held_prefix",
    "json_string",
    "literal",
    "peek",
    "run",
    "tag_name",
    "until",
]

_BLANKS = re.compile(r"\s*")
# key="value" (or key='value', or key=value) in a tag's attribute text.
_ATTRIBUTE = re.compile(r"""([\w:.-]+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""")
_ENTITIES = (("&quot;", '"'), ("&apos;", "'"), ("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))
# The next quote or backslash inside a JSON string.
_STRING_STOP = re.compile(r'["\\]')


class Cursor:
    """The text of one call region as it arrives.

    ``text[pos:]`` is what no reader consumed yet; ``base`` is how many characters of the
    region came before ``text`` (so ``offset`` is the region position of ``pos``); ``final``:
    no more text will come.
    """

    __slots__ = ("base", "final", "pos", "text")

    def __init__(self, text: str, final: bool = False) -> None:
        self.text = text
        self.pos = 0
        self.base = 0
        self.final = final

    def add(self, delta: str) -> None:
        """Append the next delta (what was consumed is dropped first)."""
        if self.pos:
            self.base += self.pos
            self.text = self.text[self.pos :] + delta
            self.pos = 0
        else:
            self.text += delta

    @property
    def offset(self) -> int:
        """The region position of ``pos``: how many of the region's characters were read."""
        return self.base + self.pos

    def rest(self) -> str:
        """What is left unread."""
        return self.text[self.pos :]


@dataclass(frozen=True, slots=True)
class NoCall:
    """A region's outcome: its first ``n`` characters are no call, but text (content, if no
    call came before); the text after them is scanned again."""

    n: int


class _Truncated:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TRUNCATED"


#: A region's outcome at the end of the output: a call (or its markup) that the end cut; no
#: call of it was started, nothing of it is content, and the parser is `incomplete`.
TRUNCATED = _Truncated()

Reader = Generator[None, None, object]
"""A format's reader of a region: yields for more text; returns ``None`` (the region ended
where the cursor stands), a `NoCall` or `TRUNCATED`."""

Step = Generator[None, None, None]
"""A part of a format's reader that reads and emits, and returns nothing."""


def blank(c: Cursor) -> Generator[None, None, bool]:
    """Skip whitespace: ``True`` with a non-blank character at ``c.pos``, ``False`` if the
    output ended first."""
    while True:
        m = _BLANKS.match(c.text, c.pos)
        c.pos = m.end() if m is not None else c.pos
        if c.pos < len(c.text):
            return True
        if c.final:
            return False
        yield


def peek(c: Cursor) -> Generator[None, None, str]:
    """The next character (not consumed), or ``""`` at the end of the output."""
    while c.pos >= len(c.text):
        if c.final:
            return ""
        yield
    return c.text[c.pos]


def literal(c: Cursor, lit: str) -> Generator[None, None, bool]:
    """Whether ``lit`` is next: consumed then; ``False`` (nothing consumed) if other text is,
    or the output ends first."""
    size = len(lit)
    while True:
        text, pos = c.text, c.pos
        if len(text) - pos >= size:
            if text.startswith(lit, pos):
                c.pos = pos + size
                return True
            return False
        if not lit.startswith(text[pos:]) or c.final:
            return False
        yield


def run(
    c: Cursor, pattern: re.Pattern[str], more: re.Pattern[str] | None = None
) -> Generator[None, None, str]:
    """The run of characters ``pattern`` matches at ``c.pos`` (``more``, if given, matches
    what follows its first piece): it ends at the first character neither takes, or the end
    of the output."""
    parts: list[str] = []
    while True:
        m = (more if parts and more is not None else pattern).match(c.text, c.pos)
        if m is not None:
            parts.append(m.group())
            c.pos = m.end()
        if c.pos < len(c.text) or c.final:
            return "".join(parts)
        yield


def held_prefix(text: str, start: int, markers: tuple[str, ...], firsts: str) -> int:
    """The length of the longest suffix of ``text[start:]`` that is a proper prefix of one
    of ``markers`` (``firsts``: their first characters, a quick test)."""
    longest = max(len(m) for m in markers)
    lo = max(start, len(text) - longest + 1)
    for i in range(lo, len(text)):
        if text[i] in firsts:
            tail = text[i:]
            for m in markers:
                if len(m) > len(tail) and m.startswith(tail):
                    return len(text) - i
    return 0


def until(
    c: Cursor,
    markers: tuple[str, ...],
    take: Callable[[str], object] | None = None,
) -> Generator[None, None, int]:
    """Read up to the first of ``markers`` and past it; return its index in ``markers``, or
    -1 when the output ends first.

    The text before the marker goes to ``take`` (if given) in pieces, as it arrives; a tail
    that could be the start of a marker is held until the next delta says (and, when the
    output ends, is not taken: the reader is cut there).
    """
    firsts = "".join(dict.fromkeys(m[0] for m in markers))
    while True:
        text, pos = c.text, c.pos
        best, which = -1, -1
        for k, m in enumerate(markers):
            j = text.find(m, pos)
            if j >= 0 and (best < 0 or j < best):
                best, which = j, k
        if best >= 0:
            if take is not None and best > pos:
                take(text[pos:best])
            c.pos = best + len(markers[which])
            return which
        end = len(text) - held_prefix(text, pos, markers, firsts)
        if take is not None and end > pos:
            take(text[pos:end])
        if c.final:
            # (A held tail is no marker now; a reader cut here keeps only what it took.)
            c.pos = len(text)
            return -1
        c.pos = end
        yield


def tag_name(c: Cursor, ends: tuple[str, ...]) -> Generator[None, None, str | None]:
    """The name of a tag, read up to and past the first of ``ends``: stripped, when it is
    ``ends[0]`` (the tag's ``>``); ``None`` when another of ``ends`` (a tag out of place)
    or the end of the output comes first."""
    parts: list[str] = []
    found = yield from until(c, ends, parts.append)
    return "".join(parts).strip() if found == 0 else None


def json_string(c: Cursor) -> Generator[None, None, str | None]:
    """The JSON string at ``c.pos`` (its opening quote), decoded; ``None`` if it is not valid
    JSON (a raw control character, a bad escape) or the output ends inside it."""
    c.pos += 1
    parts: list[str] = []
    escaped = False
    while True:
        text, start = c.text, c.pos
        i, n = start, len(text)
        while i < n:
            if escaped:
                escaped = False
                i += 1
                continue
            m = _STRING_STOP.search(text, i)
            if m is None:
                i = n
                break
            i = m.start()
            if text[i] == "\\":
                escaped = True
                i += 1
                continue
            parts.append(text[start:i])
            c.pos = i + 1
            try:
                value = json.loads('"' + "".join(parts) + '"')
            except ValueError:
                return None
            return value if isinstance(value, str) else None
        parts.append(text[start:n])
        c.pos = n
        if c.final:
            return None
        yield


def attributes(
    c: Cursor, entities: bool = False, end: str = ">"
) -> Generator[None, None, dict[str, str] | None]:
    """The attributes of the tag whose name was just read, up to and past its ``end``
    (``>``): ``{key: value}``; ``None`` when the tag does not end (a ``<`` first, for ``>``;
    or the end of the output). ``entities``: the format escapes ``&``, ``"`` (and ``<``,
    ``>``, ``'``) in attribute values as XML does."""
    parts: list[str] = []
    found = yield from until(c, (end, "<") if end == ">" else (end,), parts.append)
    if found != 0:
        if found == 1:
            c.pos -= 1
        return None
    out: dict[str, str] = {}
    for m in _ATTRIBUTE.finditer("".join(parts)):
        value = next(v for v in m.groups()[1:] if v is not None)
        if entities and "&" in value:
            for entity, char in _ENTITIES:
                value = value.replace(entity, char)
        out.setdefault(m.group(1), value)
    return out
