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
"""

from __future__ import annotations

import json
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
    "assemble",
    "call_from_object",
    "canonical_arguments",
    "loads_json",
    "random_call_id",
    "skip_blank",
    "tool_parameters",
]


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


def canonical_arguments(arguments: Any) -> str | None:
    """The compact JSON text of an arguments object, or ``None`` if it is not a JSON object."""
    if not isinstance(arguments, dict):
        return None
    try:
        return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


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
    if not isinstance(name, str) or not name:
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
    n = len(buf)
    while i < n and buf[i].isspace():
        i += 1
    return i


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


class Balance:
    """Incremental matcher of one bracketed value (JSON, or Python literals with ``python``).

    :meth:`scan` continues where the previous call stopped, so a value streamed over many
    deltas is scanned once. Strings are skipped (with backslash escapes); Python's
    triple-quoted strings are not understood.
    """

    __slots__ = ("depth", "escape", "pos", "quote", "quotes", "start")

    _OPEN = frozenset("{[(")
    _CLOSE = frozenset("}])")

    def __init__(self, start: int, *, python: bool = False) -> None:
        self.start = start
        self.pos = start
        self.depth = 0
        self.quote = ""
        self.escape = False
        self.quotes = "\"'" if python else '"'

    def scan(self, buf: str) -> int:
        """The end (exclusive) of the value that starts at ``start``, or -1 if not yet closed."""
        depth, quote, escape = self.depth, self.quote, self.escape
        quotes, opens, closes = self.quotes, self._OPEN, self._CLOSE
        i, n = self.pos, len(buf)
        while i < n:
            c = buf[i]
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
                    self.pos, self.depth, self.quote, self.escape = i, depth, quote, escape
                    return i
        self.pos, self.depth, self.quote, self.escape = i, depth, quote, escape
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
    override :meth:`_unfinished`, :meth:`_unclosed` and :meth:`_new_id`.

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
        self._buf = ""
        self._in_call = False
        self._begin = bool(self.leading)
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

    def find_resumed(self, buf: str, marker: str, start: int) -> int:
        """``buf.find(marker, start)`` for the call being read, resumed where the previous
        search failed, so a long call is searched once, not once per delta."""
        i = buf.find(marker, max(start, self._searched))
        if i < 0:
            self._searched = max(start, len(buf) - len(marker) + 1)
        return i

    def balanced_end(self, buf: str, start: int, *, python: bool = False) -> int:
        """End of the bracketed value at ``buf[start]``, scanned incrementally; -1 if open."""
        bal = self._balance
        if bal is None or bal.start != start:
            bal = self._balance = Balance(start, python=python)
        return bal.scan(buf)

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
                taken = self._take(buf, final)
                if taken is None:
                    break
                n, calls = taken
                n = max(n, 1)
                self._buf = buf[n:]
                self._in_call = False
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
                    break
                self._begin = False
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
