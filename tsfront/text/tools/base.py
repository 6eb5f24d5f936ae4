"""The one streaming interface every tool-call format implements, and its shared pieces.

A :class:`ToolParser` sits after the detokenizer (and after a reasoning parser, if any) and
turns the streamed text of one choice into :data:`Delta` values: :class:`Content` (text for
``message.content``), :class:`CallStart` (a call's index, id and function name) and
:class:`CallArgs` (a fragment of that call's ``arguments`` JSON text)::

    parser = make_tool_parser("hermes", tools)
    for text in stream:
        for delta in parser.feed(text):
            ...                      # Content / CallStart / CallArgs
    for delta in parser.finish():    # what was held back
        ...
    parser.called, parser.incomplete, parser.broken

Rules every parser keeps, whatever the split of the text into deltas:

- **No part of a call's markup is ever content.** Text that could still grow into a start
  marker is held back (as :class:`~tsfront.text.stop.StopMatcher` holds a stop string).
- **Arguments stream as the model writes them.** A call's :class:`CallStart` goes out as soon
  as its name is known and its arguments have begun (the ``{`` of a JSON object; for formats
  whose arguments are tagged values, the name's end); then :class:`CallArgs` fragments as the
  text arrives. JSON arguments are written in their *canonical* form as they are read
  (:mod:`~tsfront.text.tools.jsontext`: blanks dropped, strings re-escaped, numbers as Python
  writes them, a lone surrogate as its escape; nothing but what could still end the value is
  held); tagged values are written as JSON by the tool's schema
  (:mod:`~tsfront.text.tools.params`). The fragments of a call concatenate to its
  ``arguments``, and :meth:`ToolParser.parse` (the whole text at once) gives the same text.
- **Content is the text before the first call.** Text between and after calls is dropped,
  as vLLM's non-streamed parsers drop it.
- **Markup that is no call falls back to content** (its raw text, markup included) when no
  call came before it and nothing of a call went out yet: bad JSON before the arguments
  begin, no name, arguments that are not an object. After a call such text is dropped.
- **A call the model breaks after its start went out** (its arguments stop being JSON, a tag
  out of place, the stream ending inside it) *stays a call*, with the arguments written so
  far and nothing more: an unclosed JSON object, which no JSON parser accepts, so a client
  never runs a tool with half its arguments (an agent loop hands the parse error back to the
  model instead). Its index is in :attr:`ToolParser.broken`; a call cut by the end of the
  output (``max_tokens``) also sets :attr:`ToolParser.incomplete`, so the server keeps
  ``finish_reason: "length"``.

:meth:`ToolParser.parse` is the non-streamed result: the whole text fed to a fresh parser,
so it equals the concatenated deltas of every split by construction.

How a format is written: it names the ``markers`` that open a call region (and ``leading``
characters that open one as the first non-blank text), and reads a region with a generator
method ``_read(cursor)`` made of the readers in :mod:`~tsfront.text.tools.reading` and the
ones here (:meth:`ToolParser.call_object`, :meth:`ToolParser.stream_call`); it emits with
:meth:`ToolParser.open_call`, :meth:`ToolParser.call_args`, :meth:`ToolParser.close_call`.

Cost: while no call is in progress and nothing is held, :meth:`ToolParser.feed` returns at
once for a delta in which no marker's first character occurs (``str`` membership, in C).
Whatever the text, a stream costs time linear in its length: a region is read once (each
reader consumes what it looked at); held text is bounded by a marker's length; a delta longer
than :data:`STEP` characters is taken in slices of that size, so what is scanned again after
each call is bounded too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tsfront.ids import call_id
from tsfront.text.errors import TextError
from tsfront.text.tools.jsontext import DONE, ERROR, JsonCanon
from tsfront.text.tools.reading import (
    TRUNCATED,
    Cursor,
    NoCall,
    Reader,
    blank,
    json_string,
    literal,
)

__all__ = [
    "BROKE",
    "CALL",
    "CUT",
    "NOT",
    "STEP",
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

# `str.isspace`'s characters (both are Py_UNICODE_ISSPACE), skipped in C.
_BLANKS = re.compile(r"\s*")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The longest slice of a delta :meth:`ToolParser.feed` works on at once (see the module doc).
STEP = 1024

# What `ToolParser.call_object` found.
CALL = 0  #: a call, emitted whole (its arguments closed)
NOT = 1  #: no call; nothing was emitted (the caller may fall back to content)
BROKE = 2  #: a call whose start went out, then broken by the model (in `broken`)
CUT = 3  #: the output ended inside it (a call started is left open: the region end cuts it)


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
    """A whole output parsed: ``content`` (text before the first call), the calls, whether
    the output ended inside a call (``incomplete``), and the indices of the calls broken
    after their start went out (``broken``: their arguments are an unclosed object)."""

    content: str
    calls: list[ToolCall]
    incomplete: bool
    broken: list[int] = field(default_factory=list)


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


def valid_name(name: str | None) -> bool:
    """Whether ``name`` can name a function: not empty, no surrogate (an escape the model
    wrote decodes to one; no UTF-8 text can carry it)."""
    return bool(name) and _SURROGATE.search(name or "") is None


class ToolParser:
    """Base of every tool-call format: the text state, the call regions, emission.

    A format sets ``name``, ``markers`` (strings that open a call region anywhere in the
    text), ``leading`` (characters that open one only as the first non-blank text of the
    output, or after a call, e.g. ``"{"`` for Llama-3 JSON), ``special`` (its tokens a
    tokenizer may hold as special tokens: the server's detokenizer hands them to the parser
    even when special tokens are skipped) and implements :meth:`_read`.

    Args:
        tools: the request's OpenAI ``tools`` (function schemas; formats that type their
            values, e.g. ``qwen3_coder``, read them).
    """

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()
    leading: ClassVar[str] = ""
    special: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.tools_given = tools
        self.tools = tool_parameters(tools)
        markers = type(self).markers
        self._longest = max((len(m) for m in markers), default=0)
        self._prefixes = frozenset(m[:k] for m in markers for k in range(1, len(m)))
        self._first = "".join(dict.fromkeys(m[0] for m in markers))
        self._first_after = "".join(dict.fromkeys(self._first + self.leading))
        self._hold = ""  # text that could start a marker, held back
        self._begin = bool(self.leading)  # no non-blank text yet (leading characters count)
        self._blanks: list[str] = []  # the blank deltas before the first non-blank (begin)
        self._region: Reader | None = None  # the format's reader of the region being read
        self._cursor: Cursor | None = None
        self._raw: list[str] | None = None  # the region's text until a call of it went out
        self._out: list[Delta] = []  # what the current feed / finish returns
        self._parts: list[str] = []  # the open call's argument text not put in a delta yet
        self._section = False  # a call (or a format's call section) came: content has ended
        self._count = 0
        self._open = -1  # the index of the call whose arguments are being written
        self._final = False
        self._finished = False
        #: Whether the output ended inside a call or its markup (the server keeps ``length``).
        self.incomplete = False
        #: The indices of calls whose start went out and that the model then broke (their
        #: arguments are what was written: an unclosed object). See the module doc.
        self.broken: list[int] = []

    @property
    def called(self) -> bool:
        """Whether at least one call was emitted."""
        return self._count > 0

    # -- the interface ----------------------------------------------------------------------

    def feed(self, text: str) -> list[Delta]:
        """Add the next delta of text; return the deltas now known."""
        if self._region is None and not self._hold and not self._begin:
            # Fast path (plain text): no character of the delta can start a call.
            for c in self._first_after if self._section else self._first:
                if c in text:
                    break
            else:
                return [Content(text)] if text and not self._section else []
        if len(text) > STEP:
            # A long text (a whole output) in slices, so what is scanned again after each
            # region is bounded; each slice takes the path below.
            out: list[Delta] = []
            for i in range(0, len(text), STEP):
                out += self.feed(text[i : i + STEP])
            return _joined(out)
        out = self._out = []
        self._run(text)
        self._flush()
        return out

    def finish(self, length: bool = False) -> list[Delta]:
        """At the end of the stream: what was held back; a call the end cut is left as it
        went out and sets :attr:`incomplete`.

        ``length``: the engine stopped at ``max_tokens`` (``finish_reason: "length"``), so
        held-back text that could start a marker is a cut-off start tag: it is dropped (and
        sets :attr:`incomplete`) instead of becoming content.
        """
        if self._finished:
            return []
        self._finished = True
        self._final = True
        out = self._out = []
        if self._begin and self._blanks:
            self._begin = False
            blanks = "".join(self._blanks)
            self._blanks.clear()
            self._run(blanks)
        if self._region is not None:
            assert self._cursor is not None
            self._cursor.final = True
            self._run("")
        if self._hold:
            rest, self._hold = self._hold, ""
            if length and self._held(rest) == len(rest):
                self.incomplete = True
            else:
                self._content(rest)
        self._flush()
        return out

    def parse(self, text: str, length: bool = False) -> Parsed:
        """The non-streamed result of ``text``: ``text`` fed to a fresh parser at once."""
        fresh = self._spawn()
        deltas = fresh.feed(text) + fresh.finish(length)
        return assemble(deltas, fresh.incomplete, fresh.broken)

    def _spawn(self) -> ToolParser:
        """A parser that has seen nothing, configured as this one."""
        return type(self)(self.tools_given)

    # -- what a format implements -----------------------------------------------------------

    def _read(self, c: Cursor) -> Reader:
        """Read the region that ``c`` starts with (at a marker or a leading character)."""
        raise NotImplementedError
        yield  # (a generator)

    def _new_id(self) -> str:
        return random_call_id()

    # -- what a format's reader emits with ---------------------------------------------------

    def open_call(self, name: str, id: str | None = None) -> None:
        """A call starts: its :class:`CallStart` goes out (the region can no longer fall back
        to content)."""
        self._flush()
        if self._open >= 0:
            self._open = -1
        self._raw = None
        self._section = True
        index = self._count
        self._count += 1
        self._open = index
        self._out.append(CallStart(index, id or self._new_id(), name))

    def call_args(self, text: str) -> None:
        """The next fragment of the open call's arguments."""
        if text and self._open >= 0:
            self._parts.append(text)

    def close_call(self) -> None:
        """The open call's arguments are complete."""
        self._flush()
        self._open = -1

    def break_call(self) -> None:
        """The model broke the open call: it stays as it went out (see the module doc)."""
        self._flush()
        if self._open >= 0:
            self.broken.append(self._open)
            self._open = -1

    def commit(self) -> None:
        """The region is the format's call section even before a call of it: it is not
        content, and text after it is dropped (as after a call)."""
        self._raw = None
        self._section = True

    @property
    def committed(self) -> bool:
        """Whether the region being read can no longer fall back to content."""
        return self._raw is None

    def region_text(self) -> str:
        """The region's text so far (before it commits; ``""`` after)."""
        return "".join(self._raw) if self._raw is not None else ""

    # -- readers a format's reader is made of -------------------------------------------------

    def read_json(
        self, c: Cursor, top: str = "", take: Callable[[str], object] | None = None
    ) -> Generator[None, None, bool]:
        """The JSON value at ``c.pos``, read; its canonical text given to ``take`` in pieces,
        as it is read (or dropped). ``True`` when it closed; ``False`` when it broke (not
        JSON, or the output ended inside it: ``c.final``)."""
        canon = JsonCanon(top)
        out = canon.out
        while True:
            c.pos = canon.feed(c.text, c.pos)
            if out:
                if take is not None:
                    take("".join(out))
                out.clear()
            if canon.state == DONE:
                return True
            if canon.state == ERROR:
                return False
            if c.final:
                canon.finish()
                if out and take is not None:
                    take("".join(out))
                return canon.state == DONE
            yield

    def stream_call(
        self, c: Cursor, name: str, call_id: str | None = None
    ) -> Generator[None, None, bool]:
        """Call ``name``, whose JSON arguments object starts at ``c.pos``: its start goes out
        at once, then the arguments as they are read (canonical). ``True`` when they closed
        (the call is complete); ``False`` when the model broke them (the call stays as it
        went out, in :attr:`broken`) or the output ended inside them (``c.final``: the call
        stays open, the region's end cuts it)."""
        self.open_call(name, call_id)
        if (yield from self.read_json(c, "{", self.call_args)):
            self.close_call()
            return True
        if not c.final:
            self.break_call()
        return False

    def call_object(
        self,
        c: Cursor,
        keys: tuple[str, ...] = ("arguments", "parameters"),
        call_id: str | None = None,
    ) -> Generator[None, None, int]:
        """The call object at ``c.pos`` (its ``{``): ``{"name": NAME, KEY: {…}}`` for the
        first of ``keys`` present (``{}`` when none is; ``null`` too; a JSON string holding
        an object is parsed). Other keys are read and ignored.

        The call starts when the name is known and the arguments begin (arguments written
        before the name are held, then sent with the start). Returns `CALL`, `NOT` (nothing
        emitted: no name, not JSON, arguments that are not an object), `BROKE` or `CUT` (the
        output ended before the object's ``}``; a call already whole stays emitted).
        """
        c.pos += 1
        name: str | None = None
        held: str | None = None  # the arguments' text, read before the name
        called = False
        first = True
        while True:
            if not (yield from blank(c)):
                return CUT
            ch = c.text[c.pos]
            if ch == "}" and first:
                c.pos += 1
                break
            if ch != '"':
                return CALL if called else NOT
            key = yield from json_string(c)
            if key is None:
                return CUT if c.final else (CALL if called else NOT)
            first = False
            if not (yield from blank(c)):
                return CUT
            if c.text[c.pos] != ":":
                return CALL if called else NOT
            c.pos += 1
            if not (yield from blank(c)):
                return CUT
            ch = c.text[c.pos]
            if key == "name" and name is None:
                if ch != '"':
                    return CALL if called else NOT
                value = yield from json_string(c)
                if value is None:
                    return CUT if c.final else (CALL if called else NOT)
                if not valid_name(value):
                    return CALL if called else NOT
                name = value
                if held is not None:
                    self.open_call(name, call_id)
                    self.call_args(held)
                    self.close_call()
                    called = True
            elif key in keys and held is None and not called:
                if ch == "{":
                    if name is not None:
                        if not (yield from self.stream_call(c, name, call_id)):
                            return CUT if c.final else BROKE
                        called = True
                    else:
                        sink: list[str] = []
                        if not (yield from self.read_json(c, "{", sink.append)):
                            return CUT if c.final else NOT
                        held = "".join(sink)
                elif ch == '"':
                    value = yield from json_string(c)
                    if value is None:
                        return CUT if c.final else NOT
                    try:
                        text = canonical_arguments(loads_json(value) if value.strip() else {})
                    except ValueError:
                        text = None
                    if text is None:
                        return NOT
                    held = text
                elif ch == "n":
                    if not (yield from literal(c, "null")):
                        return CUT if c.final else NOT
                    held = "{}"
                else:
                    return NOT
                if held is not None and name is not None:
                    self.open_call(name, call_id)
                    self.call_args(held)
                    self.close_call()
                    called = True
            elif not (yield from self.read_json(c)):
                return CUT if c.final else (CALL if called else NOT)
            if not (yield from blank(c)):
                return CUT
            ch = c.text[c.pos]
            if ch == ",":
                c.pos += 1
                continue
            if ch == "}":
                c.pos += 1
                break
            return CALL if called else NOT
        if called:
            return CALL
        if name is None:
            return NOT
        self.open_call(name, call_id)
        self.call_args(held if held is not None else "{}")
        self.close_call()
        return CALL

    # -- the machinery ----------------------------------------------------------------------

    def _flush(self) -> None:
        if self._parts:
            self._out.append(CallArgs(self._open, "".join(self._parts)))
            self._parts.clear()

    def _content(self, text: str) -> None:
        if text and not self._section:
            out = self._out
            if out and type(out[-1]) is Content:
                out[-1] = Content(out[-1].text + text)
            else:
                out.append(Content(text))

    def _run(self, text: str) -> None:
        # Text state and regions, in turn, until the text is used up (or held).
        while True:
            if self._region is None:
                started = self._scan(text)
                if started is None:
                    return
                text = started
            rest = self._resume(text)
            if rest is None:
                return
            text = rest

    def _scan(self, text: str) -> str | None:
        """The text state: content until a region starts. Returns the text from the
        region's start (the region is set up), or ``None`` (all used or held)."""
        if self._begin:
            if not text or text.isspace():
                if text:
                    self._blanks.append(text)  # kept as they came, joined once
                return None
            self._begin = False
            if self._blanks:
                self._blanks.append(text)
                text = "".join(self._blanks)
                self._blanks.clear()
            if text[skip_blank(text, 0)] in self.leading:
                self._start()
                return text
        buf = self._hold + text if self._hold else text
        self._hold = ""
        pos = self._find(buf)
        if pos >= 0:
            self._content(buf[:pos])
            self._start()
            return buf[pos:]
        keep = self._held(buf)
        self._content(buf[: len(buf) - keep])
        self._hold = buf[len(buf) - keep :]
        return None

    def _start(self) -> None:
        self._cursor = Cursor("", self._final)
        self._raw = []
        self._region = self._read(self._cursor)

    def _resume(self, text: str) -> str | None:
        """Give the region ``text`` and run its reader; the text after the region when it
        ended, else ``None``."""
        c = self._cursor
        assert c is not None and self._region is not None
        if text:
            c.add(text)
            if self._raw is not None:
                self._raw.append(text)
        try:
            next(self._region)
        except StopIteration as stop:
            return self._end(stop.value)
        if c.final:
            return self._end(TRUNCATED)  # a reader still waiting at the end: cut
        return None

    def _end(self, outcome: object) -> str:
        c, raw = self._cursor, self._raw
        assert c is not None
        self._region = self._cursor = self._raw = None
        if self._open >= 0:
            # The region ended with a call's arguments unfinished: cut by the end of the
            # output, or broken by the model.
            if c.final:
                self.incomplete = True
            self.break_call()
        if isinstance(outcome, NoCall) and raw is not None:
            whole = "".join(raw)
            n = min(max(outcome.n, 1), len(whole))
            self._content(whole[:n])
            return whole[n:]
        if outcome is TRUNCATED:
            self.incomplete = True
            return ""
        return c.rest()

    def _find(self, buf: str) -> int:
        """The earliest marker (or, after a call, leading character) in ``buf``."""
        best = -1
        for m in self.markers:
            i = buf.find(m)
            if i >= 0 and (best < 0 or i < best):
                best = i
        if self._section:
            for ch in self.leading:
                i = buf.find(ch)
                if i >= 0 and (best < 0 or i < best):
                    best = i
        return best

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
    """``out`` with each run of `Content` deltas as one, and each run of one call's
    `CallArgs` as one (joined once, not per piece)."""
    if len(out) < 2:
        return out
    joined: list[Delta] = []
    head: Content | CallArgs | None = None  # the first delta of the run being joined
    run: list[str] = []
    for d in out:
        if head is not None and (
            (type(d) is Content and type(head) is Content)
            or (type(d) is CallArgs and type(head) is CallArgs and d.index == head.index)
        ):
            run.append(d.text)
            continue
        if head is not None:
            joined.append(_with_text(head, "".join(run)))
            head = None
        if type(d) is Content or type(d) is CallArgs:
            head, run = d, [d.text]
        else:
            joined.append(d)
    if head is not None:
        joined.append(_with_text(head, "".join(run)))
    return joined


def _with_text(delta: Content | CallArgs, text: str) -> Delta:
    return Content(text) if type(delta) is Content else CallArgs(delta.index, text)  # type: ignore[union-attr]


def assemble(
    deltas: Sequence[Delta], incomplete: bool = False, broken: Sequence[int] = ()
) -> Parsed:
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
    return Parsed("".join(content), calls, incomplete, list(broken))
