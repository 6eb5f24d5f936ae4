"""The one streaming interface every tool-call format implements, and its shared pieces.

A :class:`ToolParser` sits after the detokenizer (and after a reasoning parser, if any) and
turns the streamed text of one choice into :data:`Delta` values: :class:`Content` (text for
``message.content``), :class:`CallStart` (a call's index, id and function name) and
:class:`CallArgs` (a fragment of that call's ``arguments`` JSON text)::

    parser = make_tool_parser("hermes", tools)
    for text in stream:
        for delta in parser.feed(text):
            ...                      # Content / CallStart / CallArgs
    for delta in parser.finish():    # what was held back; an unfinished call is dropped
        ...
    parser.called, parser.incomplete

Rules every parser keeps, whatever the split of the text into deltas:

- **No part of a call's markup is ever content.** Text that could still grow into a start
  marker is held back (as :class:`~tsfront.text.stop.StopMatcher` holds a stop string), and
  a call's text is held until the call is complete.
- **A call is emitted whole.** Its :class:`CallStart` and one :class:`CallArgs` with the
  final arguments are emitted together, once the call's end is seen and its arguments
  parsed. So the streamed fragments always concatenate to exactly the non-streamed
  ``arguments`` string, and an unparseable call can still fall back to content (nothing of it
  was sent). The price: arguments do not trickle out while the model writes them.
- **Arguments are canonical JSON text**: the parsed object re-serialised compactly
  (``separators=(",", ":")``, non-ASCII kept, ``NaN``/``Infinity`` refused); a call without
  arguments has ``"{}"``.
- **Content is the text before the first call.** Text between and after calls is dropped,
  as vLLM's non-streamed parsers drop it.
- **An unparseable call falls back to content** (its raw text, markup included) when no call
  came before it, as vLLM returns the raw output; after a call it is dropped like any text.
- **A call the stream ends inside** (``max_tokens``) is dropped and :attr:`incomplete` is
  set, so the server keeps ``finish_reason: "length"``.

:meth:`ToolParser.parse` is the non-streamed result: the whole text fed to a fresh parser,
so it equals the concatenated deltas of every split by construction.

Cost: while no call is in progress and nothing is held, :meth:`ToolParser.feed` returns at
once for a delta in which no marker's first character occurs (``str`` membership, in C).
Whatever the text, a stream costs time linear in its length: held text is kept as the deltas
it came in, and an undecided call is given to the format again only when a new delta brings
what it waits for (a :class:`Wait`: an end marker, a non-blank character, its bracketed value
closing, the end of a name); a delta longer than :data:`STEP` characters is taken in slices of
that size, so what is copied after each call is bounded too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from tsfront.ids import call_id
from tsfront.text.errors import TextError

__all__ = [
    "Balance",
    "CallArgs",
    "CallStart",
    "Content",
    "Delta",
    "Parsed",
    "ToolCall",
    "ToolCallError",
    "ToolParser",
    "Wait",
    "assemble",
    "call_from_object",
    "canonical_arguments",
    "loads_json",
    "random_call_id",
    "skip_blank",
    "tool_parameters",
]

# `str.isspace`'s characters (both are Py_UNICODE_ISSPACE), skipped in C.
_BLANKS = re.compile(r"\s*")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The longest slice of a delta :meth:`ToolParser.feed` works on at once (see the module doc).
STEP = 1024


class ToolCallError(TextError):
    """A tool-call parser asked for by a name that does not exist, or output that is no call."""


@dataclass(slots=True)
class Content:
    """Text for ``message.content``."""

    text: str


@dataclass(slots=True)
class CallStart:
    """A call's first delta: ``index`` (0, 1, ... in the choice), ``id`` and function ``name``."""

    index: int
    id: str
    name: str


@dataclass(slots=True)
class CallArgs:
    """A fragment of call ``index``'s ``arguments`` JSON text."""

    index: int
    text: str


Delta = Content | CallStart | CallArgs
"""What :meth:`ToolParser.feed` and :meth:`ToolParser.finish` return."""


@dataclass(slots=True)
class ToolCall:
    """One parsed call: ``arguments`` is JSON text (canonical, see :func:`canonical_arguments`)."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class Parsed:
    """A whole output parsed: ``content`` (text before the first call), the calls, and
    whether the output ended inside a call (``incomplete``)."""

    content: str
    calls: list[ToolCall]
    incomplete: bool


def random_call_id(length: int = 24, prefix: str = "call_") -> str:
    """``prefix`` + ``length`` random letters and digits (``call_`` + 24, as OpenAI's ids),
    from `secrets` (`tsfront.ids.call_id`: a client sends the id back)."""
    return call_id(length, prefix)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_json(text: str) -> Any:
    """``json.loads`` that refuses ``NaN``/``Infinity`` and raises only ``ValueError``."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def canonical_arguments(arguments: Any) -> str | None:
    """The compact JSON text of an arguments object, or ``None`` if it is not a JSON object.

    Non-ASCII characters are kept, but a surrogate code point (what the model's escape
    ``"\\ud800"`` decodes to: no UTF-8 text can hold one) is written as its ``\\uXXXX``
    escape, so the text is the model's JSON and can be sent.
    """
    if not isinstance(arguments, dict):
        return None
    try:
        text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    if not text.isascii():
        # Only inside a string can a surrogate be; there its escape means the same.
        text = _SURROGATE.sub(_escape, text)
    return text


def call_from_object(
    obj: Any, keys: Sequence[str] = ("arguments", "parameters")
) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` from ``{"name": …, "arguments"|"parameters": {…}}``.

    Missing or ``null`` arguments are ``{}``; arguments given as a JSON string holding an
    object are parsed (some models double-encode). Anything else is ``None``.
    """
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name or _SURROGATE.search(name):
        # (A name with a lone surrogate, decoded from its escape, names no function.)
        return None
    args: Any = None
    for key in keys:
        if key in obj:
            args = obj[key]
            break
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = loads_json(args) if args.strip() else {}
        except ValueError:
            return None
    text = canonical_arguments(args)
    return None if text is None else (name, text)


def skip_blank(buf: str, i: int) -> int:
    """The index of the first non-whitespace character of ``buf`` at or after ``i``."""
    match = _BLANKS.match(buf, i)
    return i if match is None else match.end()


def tool_parameters(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Function name → its JSON-schema ``parameters`` (``{}`` when absent), from OpenAI
    ``tools`` entries (``{"type": "function", "function": {"name", "parameters"}}``)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = dict(params) if isinstance(params, Mapping) else {}
    return out


class Wait:
    """What an undecided call waits for before its format can decide more.

    :meth:`ready` is given each new delta of the call, in order, and says whether the format's
    ``_take`` may now decide more; it keeps what it needs to say so of the next delta. This
    base waits for any text (a format that set no wait).
    """

    __slots__ = ()

    def ready(self, text: str) -> bool:
        """Whether ``text``, the call's next delta, may let the format decide more."""
        return bool(text)


class _Marker(Wait):
    """Waits for ``marker`` (which may begin in the ``carry``, the text before)."""

    __slots__ = ("carry", "marker")

    def __init__(self, marker: str, carry: str) -> None:
        self.marker = marker
        self.carry = carry

    def ready(self, text: str) -> bool:
        window = self.carry + text
        if self.marker in window:
            return True
        self.carry = window[max(0, len(window) - len(self.marker) + 1) :]
        return False


class _Blank(Wait):
    """Waits for a character that is not whitespace."""

    __slots__ = ()

    def ready(self, text: str) -> bool:
        return bool(text) and not text.isspace()


class _Outside(Wait):
    """Waits for a character that ``pattern`` (a negated class) finds: the end of a run."""

    __slots__ = ("pattern",)

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern

    def ready(self, text: str) -> bool:
        return self.pattern.search(text) is not None


_BLANK = _Blank()


class Balance(Wait):
    """Incremental matcher of one bracketed value (JSON, or Python literals with ``python``).

    :meth:`scan` continues where the previous call stopped, and as a :class:`Wait` it scans
    each new delta of the call, so a value streamed over many deltas is scanned once. Strings
    are skipped (with backslash escapes); Python's triple-quoted strings are not understood.
    """

    __slots__ = ("depth", "end", "escape", "pos", "quote", "quotes", "start")

    _OPEN = frozenset("{[(")
    _CLOSE = frozenset("}])")

    def __init__(self, start: int, *, python: bool = False) -> None:
        self.start = start
        self.pos = start
        self.depth = 0
        self.quote = ""
        self.escape = False
        self.quotes = "\"'" if python else '"'
        self.end = -1

    def scan(self, buf: str) -> int:
        """The end (exclusive) of the value that starts at ``start``, or -1 if not yet closed."""
        return self._scan(buf, 0)

    def ready(self, text: str) -> bool:
        return self._scan(text, self.pos) >= 0

    def _scan(self, text: str, offset: int) -> int:
        # ``text`` starts at position ``offset`` of the call's text; scanning resumes at pos.
        if self.end >= 0:
            return self.end
        depth, quote, escape = self.depth, self.quote, self.escape
        quotes, opens, closes = self.quotes, self._OPEN, self._CLOSE
        i, n = self.pos - offset, len(text)
        while i < n:
            c = text[i]
            i += 1
            if quote:
                if escape:
                    escape = False
                elif c == "\\":
                    escape = True
                elif c == quote:
                    quote = ""
            elif c in quotes:
                quote = c
            elif c in opens:
                depth += 1
            elif c in closes:
                depth -= 1
                if depth <= 0:
                    self.end = offset + i
                    self.pos, self.depth, self.quote, self.escape = self.end, depth, quote, escape
                    return self.end
        self.pos, self.depth, self.quote, self.escape = offset + i, depth, quote, escape
        return -1


Take = tuple[int, list[tuple[str, str]] | None] | None
"""What :meth:`ToolParser._take` answers: ``None`` (need more text), ``(n, None)`` (the first
``n`` characters are no call: content) or ``(n, calls)`` (they hold these ``(name,
arguments)`` calls; an empty list is markup with no call)."""


class ToolParser:
    """Base of every tool-call format: text/call states, holding back, emission.

    A format sets ``name``, ``markers`` (strings that open a call anywhere in the text),
    ``leading`` (characters that open a call only as the first non-blank text of the output,
    or after a call, e.g. ``"{"`` for Llama-3 JSON) and implements :meth:`_take`; it may
    override :meth:`_unfinished`, :meth:`_unclosed` and :meth:`_new_id`. While ``_take``
    cannot decide, it says what it waits for through the helpers it uses
    (:meth:`find_resumed`, :meth:`balanced_end`, :meth:`blank_end`, :meth:`wait_outside`);
    it is asked again only when a delta brings that (or any text, if it said nothing).

    Args:
        tools: the request's OpenAI ``tools`` (function schemas; formats that type their
            values, e.g. ``qwen3_coder``, read them).
    """

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()
    leading: ClassVar[str] = ""

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.tools_given = tools
        self.tools = tool_parameters(tools)
        markers = type(self).markers
        self._longest = max((len(m) for m in markers), default=0)
        self._prefixes = frozenset(m[:k] for m in markers for k in range(1, len(m)))
        self._first = "".join(dict.fromkeys(m[0] for m in markers))
        self._first_after = "".join(dict.fromkeys(self._first + self.leading))
        self._buf = ""  # the text held back (from the call's start, in a call)
        self._more: list[str] = []  # deltas held after _buf that _wait found nothing in
        self._in_call = False
        self._begin = bool(self.leading)
        # What the held text waits for (None: any text). Blanks, at the start of a format
        # with leading characters.
        self._wait: Wait | None = _BLANK if self._begin else None
        self._section = False
        self._count = 0
        self._balance: Balance | None = None
        self._searched = 0
        self._finished = False
        #: Whether the output ended inside a call (dropped; the server keeps ``length``).
        self.incomplete = False

    @property
    def called(self) -> bool:
        """Whether at least one call was emitted."""
        return self._count > 0

    # -- the interface ----------------------------------------------------------------------

    def feed(self, text: str) -> list[Delta]:
        """Add the next delta of text; return the deltas now known."""
        if not self._buf and not self._in_call and not self._begin:
            # Fast path (plain text): no character of the delta can start a call.
            for c in self._first_after if self._section else self._first:
                if c in text:
                    break
            else:
                return [Content(text)] if text and not self._section else []
        if len(text) > STEP:
            # A long text (a whole output) in slices, so what each call leaves to re-read is
            # bounded; each slice takes the path below.
            out: list[Delta] = []
            for i in range(0, len(text), STEP):
                out += self.feed(text[i : i + STEP])
            return _joined(out)
        wait = self._wait
        if wait is not None:  # (only then can deltas be held in _more)
            more = self._more
            if not wait.ready(text):
                more.append(text)  # nothing to decide in it: held as it came, never re-read
                return []
            if more:
                more.append(text)
                text = "".join(more)
                more.clear()
        self._buf += text
        return self._advance(False)

    def finish(self, length: bool = False) -> list[Delta]:
        """At the end of the stream: what was held back; an unfinished call is dropped and
        sets :attr:`incomplete`.

        ``length``: the engine stopped at ``max_tokens`` (``finish_reason: "length"``), so
        held-back text that could start a marker is a cut-off start tag: it is dropped (and
        sets :attr:`incomplete`) instead of becoming content.
        """
        if self._finished:
            return []
        self._finished = True
        if self._more:
            self._buf += "".join(self._more)
            self._more.clear()
        out = self._advance(True)
        rest, self._buf = self._buf, ""
        if rest:
            if (self._in_call and self._unfinished(rest)) or (
                length and not self._in_call and self._held(rest) == len(rest)
            ):
                self.incomplete = True
            else:
                self._content(out, rest)
        self._in_call = False
        if self._unclosed():
            self.incomplete = True
        return out

    def parse(self, text: str, length: bool = False) -> Parsed:
        """The non-streamed result of ``text``: ``text`` fed to a fresh parser at once."""
        fresh = self._spawn()
        deltas = fresh.feed(text) + fresh.finish(length)
        return assemble(deltas, fresh.incomplete)

    def _spawn(self) -> ToolParser:
        """A parser that has seen nothing, configured as this one."""
        return type(self)(self.tools_given)

    # -- what a format implements -----------------------------------------------------------

    def _take(self, buf: str, final: bool) -> Take:
        """Decide the call that ``buf`` starts with (at a marker or a leading character).

        ``final``: no more text will come (answer ``None`` only for a truncated call).
        """
        raise NotImplementedError

    def _unfinished(self, buf: str) -> bool:
        """At the end, whether the undecided ``buf`` is a truncated call (else content)."""
        return True

    def _unclosed(self) -> bool:
        """At the end, whether the format's call section is still open (truncation)."""
        return False

    def _new_id(self) -> str:
        return random_call_id()

    # -- helpers for _take: each, when it finds the call undecided, says what it waits for --

    def find_resumed(self, buf: str, marker: str, start: int) -> int:
        """``buf.find(marker, start)`` for the call being read, resumed where the previous
        search failed, so a long call is searched once, not once per delta. Not found: the
        call waits for ``marker``."""
        i = buf.find(marker, max(start, self._searched))
        if i < 0:
            self._searched = max(start, len(buf) - len(marker) + 1)
            self._wait = _Marker(marker, buf[self._searched :])
        return i

    def balanced_end(self, buf: str, start: int, *, python: bool = False) -> int:
        """End of the bracketed value at ``buf[start]``, scanned incrementally; -1 if open
        (the call waits for the value to close)."""
        bal = self._balance
        if bal is None or bal.start != start:
            bal = self._balance = Balance(start, python=python)
        end = bal.scan(buf)
        if end < 0:
            self._wait = bal
        return end

    def blank_end(self, buf: str, start: int) -> int:
        """:func:`skip_blank`; at the end of ``buf``, the call waits for a non-blank."""
        i = skip_blank(buf, start)
        if i >= len(buf):
            self._wait = _BLANK
        return i

    def wait_outside(self, pattern: re.Pattern[str]) -> None:
        """The call waits for a character ``pattern`` (a negated class) finds: a name or an
        id that reaches the end of the text so far may go on."""
        self._wait = _Outside(pattern)

    # -- the machinery ----------------------------------------------------------------------

    def _content(self, out: list[Delta], text: str) -> None:
        if text and not self._section:
            if out and isinstance(out[-1], Content):
                out[-1] = Content(out[-1].text + text)
            else:
                out.append(Content(text))

    def _emit(self, out: list[Delta], calls: list[tuple[str, str]]) -> None:
        self._section = True
        for name, arguments in calls:
            index = self._count
            self._count += 1
            out.append(CallStart(index, self._new_id(), name))
            out.append(CallArgs(index, arguments))

    def _advance(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while self._buf:
            buf = self._buf
            if self._in_call:
                self._wait = None
                taken = self._take(buf, final)
                if taken is None:
                    break  # self._wait: what the helpers _take used said it waits for
                n, calls = taken
                n = max(n, 1)
                self._buf = buf[n:]
                self._in_call = False
                self._wait = None
                self._balance = None
                self._searched = 0
                if calls is None:
                    self._content(out, buf[:n])
                else:
                    self._emit(out, calls)
                continue
            if self._begin:
                stripped = buf.lstrip()
                if not stripped:
                    self._wait = _BLANK
                    break
                self._begin = False
                self._wait = None
                if stripped[0] in self.leading:
                    self._in_call = True
                    continue
            pos, n = self._find(buf)
            if pos >= 0:
                self._content(out, buf[:pos])
                self._buf = buf[pos:]
                self._in_call = True
                continue
            keep = self._held(buf)
            self._content(out, buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            break
        return out

    def _find(self, buf: str) -> tuple[int, int]:
        """The earliest marker (or, after a call, leading character) in ``buf``."""
        best, size = -1, 0
        for m in self.markers:
            i = buf.find(m)
            if i >= 0 and (best < 0 or i < best):
                best, size = i, len(m)
        if self._section:
            for c in self.leading:
                i = buf.find(c)
                if i >= 0 and (best < 0 or i < best):
                    best, size = i, 1
        return best, size

    def _held(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that could start a marker."""
        window = min(self._longest - 1, len(buf))
        if window <= 0:
            return 0
        tail = buf[-window:]
        if not any(c in tail for c in self._first):
            return 0
        for k in range(window, 0, -1):
            if tail[-k:] in self._prefixes:
                return k
        return 0


def _joined(out: list[Delta]) -> list[Delta]:
    """``out`` with each run of `Content` deltas as one (joined once, not per piece)."""
    if len(out) < 2:
        return out
    joined: list[Delta] = []
    run: list[str] = []
    for d in out:
        if type(d) is Content:
            run.append(d.text)
            continue
        if run:
            joined.append(Content("".join(run)))
            run = []
        joined.append(d)
    if run:
        joined.append(Content("".join(run)))
    return joined


def assemble(deltas: Sequence[Delta], incomplete: bool = False) -> Parsed:
    """Join streamed deltas into the non-streamed :class:`Parsed` shape."""
    content: list[str] = []
    starts: dict[int, CallStart] = {}
    args: dict[int, list[str]] = {}
    for d in deltas:
        if isinstance(d, Content):
            content.append(d.text)
        elif isinstance(d, CallStart):
            starts[d.index] = d
            args.setdefault(d.index, [])
        else:
            args.setdefault(d.index, []).append(d.text)
    calls = [
        ToolCall(i, starts[i].id, starts[i].name, "".join(args[i]) or "{}") for i in sorted(starts)
    ]
    return Parsed("".join(content), calls, incomplete)
