"""JSON text written as it is read: the canonical form of a streamed JSON value.

A model writes a call's arguments as JSON text, token by token. :class:`JsonCanon` reads that
text incrementally and writes, as it goes, the *canonical* text of the same value: what
``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` writes for it (blanks
between tokens dropped, strings re-escaped, numbers written as Python writes them), with the
one rule of :func:`~tsfront.text.tools.base.canonical_arguments` on top: a lone surrogate is
written as its ``\\uXXXX`` escape. So the fragments it gives out while the model writes are
the final arguments in pieces, and their concatenation is the same whatever the split.

What it refuses, at the character where it becomes certain (the fragments written before stay
written): anything that is not JSON (``json.loads``' strict grammar: no ``NaN``,
``Infinity``, comments, single quotes, trailing commas, raw control characters in strings),
a number Python cannot read or that is not finite (``1e999``; an integer of over 4,300
digits), and nesting deeper than :data:`MAX_DEPTH`. Not done: duplicate keys stay as the
model wrote them (``{"a":1,"a":2}``: valid JSON text, whose last value JSON parsers keep), as
a streamed value cannot take back what it wrote.

:func:`close_object` reads such arguments back: the object a JSON text cut short stood for
(a call the model broke, sent back in a conversation's history), closed where it was cut.

Cost: strings are copied in runs (one regular-expression match per run of plain characters),
so a token of a long string argument costs a match and a few appends; each structural
character is one step of a small loop. A number, an escape or a literal cut by the end of a
delta is kept (a few characters) until its end comes.

:class:`JsonWriter` is the other direction, for the formats whose arguments are not JSON
(XML parameters): an arguments object written key by key, a string value as its text
arrives (:func:`escape_text`), any other value whole (:func:`value_text`).
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring
from typing import Any

__all__ = ["MAX_DEPTH", "JsonCanon", "JsonWriter", "close_object", "escape_text", "value_text"]

#: The deepest nesting of arrays and objects read (deeper is refused: many JSON parsers,
#: Python's among them, recurse per level).
MAX_DEPTH = 512

_BLANK = " \t\n\r"  # JSON's whitespace (json.loads' as well)
# A run of string characters written as they are: not a quote, a backslash, a control
# character (refused raw, written escaped) or a surrogate (written as its escape).
_RUN = re.compile(r'[^"\\\x00-\x1f\ud800-\udfff]+')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_WORDS = {"true": "true", "false": "false", "null": "null"}
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE = {'"': '\\"', "\\": "\\\\", "/": "/", "b": "\\b", "f": "\\f", "n": "\\n", "r": "\\r",
           "t": "\\t"}  # fmt: skip
_SURROGATE = re.compile("[\ud800-\udfff]")

# States (what the next character may be); the loop in `JsonCanon.feed` is their table.
_VALUE = 0  # a value
_FIRST = 1  # a value or "]" (just after "[")
_KEY = 2  # a key string (after "," in an object)
_FIRST_KEY = 3  # a key string or "}" (just after "{")
_COLON = 4  # ":" after a key
_AFTER = 5  # "," or the container's closer, after a value
_STRING = 6  # inside a string
_ESCAPE = 7  # inside an escape of a string (``self._pending`` holds it)
_NUMBER_STATE = 8  # inside a number (``self._pending``)
_WORD = 9  # inside true / false / null (``self._pending``)
DONE = 10
ERROR = 11


def _char(code: int) -> str:
    """The canonical text of one string character decoded from an escape (not a high
    surrogate: see `JsonCanon._escape`)."""
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    return encode_basestring(chr(code))[1:-1]


def _surrogate_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escape_text(text: str) -> str:
    """``text`` as the inside of a canonical JSON string (quotes, backslashes and control
    characters escaped, a surrogate as its escape, everything else as it is)."""
    out = encode_basestring(text)[1:-1]
    if not out.isascii() and _SURROGATE.search(out):
        out = _SURROGATE.sub(_surrogate_escape, out)
    return out


def value_text(value: Any) -> str | None:
    """The canonical JSON text of ``value``, or ``None`` if it has none (not finite, not a
    JSON type, nested past what ``json.dumps`` can write)."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    if not text.isascii() and _SURROGATE.search(text):
        text = _SURROGATE.sub(_surrogate_escape, text)
    return text


class JsonCanon:
    """Reads one JSON value incrementally and writes its canonical text to :attr:`out`.

    ``feed(text, pos)`` reads ``text`` from ``pos`` and returns where it stopped: the end of
    the value (:attr:`state` is :data:`DONE`), the character that broke it (:data:`ERROR`),
    or ``len(text)`` (more is needed; a partial token is kept inside). ``finish()`` says the
    text ended: a number at the very end completes the value; anything else open is an
    error. The caller takes the written pieces from :attr:`out` (and may clear it) between
    calls.

    Args:
        top: what the value must be (``"{"``: an object, as arguments are), or ``""``: any.
    """

    __slots__ = ("_after_key", "_high", "_pending", "_stack", "_top", "out", "state")

    def __init__(self, top: str = "{") -> None:
        self.state = _VALUE
        self.out: list[str] = []
        self._stack: list[str] = []  # the open containers' closers: "}" or "]"
        self._pending = ""  # a number, word or escape not complete yet
        self._after_key = False  # the string being read is a key
        self._high = 0  # a high surrogate's code, decoded from an escape, not written yet
        self._top = top

    @property
    def done(self) -> bool:
        return self.state == DONE

    @property
    def failed(self) -> bool:
        return self.state == ERROR

    def feed(self, text: str, pos: int = 0) -> int:
        """Read ``text[pos:]``; return where reading stopped (see the class doc)."""
        state = self.state
        if state >= DONE:
            return pos
        out = self.out
        stack = self._stack
        n = len(text)
        i = pos
        while i < n:
            if state == _STRING:
                c = text[i]
                if self._high and c != "\\":
                    self._flush_high()
                m = _RUN.match(text, i)
                if m is not None:
                    out.append(m.group())
                    i = m.end()
                    if i >= n:
                        break
                    c = text[i]
                if c == '"':
                    out.append('"')
                    i += 1
                    if self._after_key:
                        self._after_key = False
                        state = _COLON
                    else:
                        state = _AFTER if stack else DONE
                    if state == DONE:
                        break
                elif c == "\\":
                    self._pending = "\\"
                    state = _ESCAPE
                    i += 1
                elif c < " ":
                    state = ERROR  # a raw control character: strict JSON refuses it
                    break
                else:  # a raw surrogate (not from UTF-8 text; written as its escape)
                    out.append(f"\\u{ord(c):04x}")
                    i += 1
                continue
            if state == _ESCAPE:
                i, state = self._escape(text, i, n)
                if state == ERROR:
                    break
                continue
            if state == _NUMBER_STATE:
                j = i
                while j < n and text[j] in _NUMBER_CHARS:
                    j += 1
                self._pending += text[i:j]
                i = j
                if i >= n:
                    break
                state = self._number(stack)
                if state >= DONE:
                    break
                continue
            if state == _WORD:
                j = i
                while j < n and text[j].isalpha() and j - i < 6:
                    j += 1
                word = self._pending + text[i:j]
                i = j
                if word in _WORDS:
                    out.append(word)
                    self._pending = ""
                    state = _AFTER if stack else DONE
                    if state == DONE:
                        break
                    continue
                if i < n or not any(w.startswith(word) for w in _WORDS):
                    state = ERROR
                    break
                self._pending = word
                break
            c = text[i]
            if c in _BLANK:
                i += 1
                continue
            if state == _AFTER:
                closer = stack[-1]
                if c == ",":
                    out.append(",")
                    state = _KEY if closer == "}" else _VALUE
                elif c == closer:
                    out.append(c)
                    stack.pop()
                    state = _AFTER if stack else DONE
                else:
                    state = ERROR
                    break
                i += 1
                if state == DONE:
                    break
                continue
            if state == _COLON:
                if c != ":":
                    state = ERROR
                    break
                out.append(":")
                state = _VALUE
                i += 1
                continue
            if state in (_KEY, _FIRST_KEY):
                if c == '"':
                    out.append('"')
                    self._after_key = True
                    state = _STRING
                elif c == "}" and state == _FIRST_KEY:
                    out.append("}")
                    stack.pop()
                    state = _AFTER if stack else DONE
                else:
                    state = ERROR
                    break
                i += 1
                if state == DONE:
                    break
                continue
            # _VALUE or _FIRST: a value begins (or "]" right after "[").
            if not stack and self._top and c != self._top:
                state = ERROR
                break
            if c == "{" or c == "[":
                if len(stack) >= MAX_DEPTH:
                    state = ERROR
                    break
                out.append(c)
                stack.append("}" if c == "{" else "]")
                state = _FIRST_KEY if c == "{" else _FIRST
            elif c == '"':
                out.append('"')
                state = _STRING
            elif c == "]" and state == _FIRST:
                out.append("]")
                stack.pop()
                state = _AFTER if stack else DONE
            elif c == "-" or "0" <= c <= "9":
                self._pending = ""
                state = _NUMBER_STATE
                continue  # read by the number state, this character included
            elif c in "tfn":
                self._pending = ""
                state = _WORD
                continue
            else:
                state = ERROR
                break
            i += 1
            if state == DONE:
                break
        self.state = state
        return i

    def finish(self) -> None:
        """The text ended: a number still open ends the value; anything else open is an
        error."""
        if self.state == _NUMBER_STATE and not self._stack:
            self.state = self._number(self._stack)
            if self.state != DONE:
                self.state = ERROR
        elif self.state != DONE:
            self.state = ERROR

    def _number(self, stack: list[str]) -> int:
        # The number in _pending is complete (a non-number character follows, or the end).
        token = self._pending
        self._pending = ""
        m = _NUMBER.fullmatch(token)
        if m is None:
            return ERROR
        try:
            value: Any = float(token) if m.group(1) or m.group(2) else int(token)
        except ValueError:  # an integer past Python's 4,300 digits
            return ERROR
        if isinstance(value, float) and (value != value or value in (_INF, -_INF)):
            return ERROR
        self.out.append(repr(value))
        return _AFTER if stack else DONE

    def _escape(self, text: str, i: int, n: int) -> tuple[int, int]:
        # self._pending is the escape read so far ("\\", "\\u", "\\u00", ...). Returns
        # (position, state) once it is decided, or (n, _ESCAPE) to wait for more.
        pending = self._pending
        while i < n:
            pending += text[i]
            i += 1
            k = len(pending)
            if k == 2:
                c = pending[1]
                if c in _SIMPLE:
                    self._flush_high()
                    self.out.append(_SIMPLE[c])
                    self._pending = ""
                    return i, _STRING
                if c != "u":
                    return i, ERROR
                continue
            if pending[-1] not in _HEX:
                return i, ERROR
            if k < 6:
                continue
            code = int(pending[2:], 16)
            self._pending = ""
            if self._high and 0xDC00 <= code <= 0xDFFF:
                high, self._high = self._high, 0
                self.out.append(chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00)))
            else:
                self._flush_high()
                if 0xD800 <= code <= 0xDBFF:
                    self._high = code  # held: the next escape may be its low half
                else:
                    self.out.append(_char(code))
            return i, _STRING
        self._pending = pending
        return i, _ESCAPE

    def _flush_high(self) -> None:
        # A high surrogate not followed by its low half: written as its escape.
        if self._high:
            self.out.append(f"\\u{self._high:04x}")
            self._high = 0


_INF = float("inf")


class JsonWriter:
    """An arguments object written as its parts become known (for formats whose arguments
    are not JSON): ``open()`` writes ``{``, ``key(k)`` a key (and the comma before it),
    ``text(t)`` a piece of a string value (``begin_string`` / ``end_string`` around them),
    ``raw(j)`` a whole value's JSON text, ``close()`` the ``}``. Each returns the text to
    send."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def open(self) -> str:
        return "{"

    def key(self, name: str) -> str:
        comma = "," if self.count else ""
        self.count += 1
        return f'{comma}"{escape_text(name)}":'

    def close(self) -> str:
        return "}"


def close_object(text: str) -> Any:
    """The object that ``text``, a JSON object cut short (the arguments a call had when the
    model broke it, sent back in a conversation), stood for: closed where it was cut, a
    string value cut inside kept as far as it went, a member without its value dropped.
    ``None`` when ``text`` is not the beginning of an object's JSON text."""
    canon = JsonCanon("{")
    end = canon.feed(text, 0)
    if canon.state == DONE:
        return json.loads("".join(canon.out)) if not text[end:].strip() else None
    if canon.state == ERROR:
        return None  # not the start of one: broken where it stands, not cut short
    written = "".join(canon.out)  # (a number or literal pending at the end is dropped)
    if not written.startswith("{"):
        return None
    # One pass over the canonical prefix: the last place where it can be cut and closed
    # (after a container opens, after a whole member or element, or inside a string value),
    # and the closers the open containers need there.
    stack: list[str] = []
    cut, closers = 0, ""
    in_string = escaped = is_key = False
    expect_key = False  # the next string in this object is a key
    i, n = 0, len(written)
    while i < n:
        c = written[i]
        i += 1
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if not is_key:
                    cut, closers = i, "".join(reversed(stack))
            elif not is_key and not escaped:
                cut, closers = i, '"' + "".join(reversed(stack))
            continue
        if c == '"':
            in_string, is_key = True, expect_key
            expect_key = False
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
            expect_key = c == "{"
            cut, closers = i, "".join(reversed(stack))
        elif c in "}]":
            stack.pop()
            cut, closers = i, "".join(reversed(stack))
        elif c == ",":
            expect_key = bool(stack) and stack[-1] == "}"
        elif c in "0123456789-." or c.isalpha():
            # A number or literal the canonical text holds whole: the member ends with it.
            j = i
            while j < n and written[j] not in ",}]":
                j += 1
            i = j
            cut, closers = i, "".join(reversed(stack))
    try:
        value = json.loads(written[:cut] + closers)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
