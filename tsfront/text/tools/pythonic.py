"""``pythonic``: Python-call-list tool calls (Llama-3.2 / Llama-4 pythonic templates, ToolACE).

::

    [get_weather(city="Paris", days=3), get_time(tz='UTC')]

Only keyword arguments whose values are literals are a call (``ast.literal_eval`` of each
value: strings, numbers, ``True``/``False``/``None``, lists, dicts, tuples); anything else (a
name, an operation, a call as a value, ``**kwargs``, positional arguments) is no call, and
the text is content if nothing of a call went out. Nothing is ever evaluated. A call starts
when its first argument is read (or at its ``)`` without arguments), and each argument is
written as it ends. A ``[`` opens a call list only as the first non-blank text of the output
(or after a call); Llama-4's ``<|python_start|>…<|python_end|>`` wrapper opens one anywhere.
Python's triple-quoted strings are not handled.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Generator

from tsfront.text.tools.base import ToolParser
from tsfront.text.tools.jsontext import value_text
from tsfront.text.tools.params import json_key
from tsfront.text.tools.reading import TRUNCATED, Cursor, NoCall, Reader, blank, run, until

__all__ = ["PythonicParser"]

START = "<|python_start|>"
END = "<|python_end|>"
_DOTTED = re.compile(r"[^\W\d][\w.]*")
_IDENT = re.compile(r"[^\W\d]\w*")
_DOTTED_MORE = re.compile(r"[\w.]+")
_IDENT_MORE = re.compile(r"\w+")
# The start of a call list with blanks removed: "[", "[name", "[name(…".
_CALL_PREFIX = re.compile(r"\[(?:[A-Za-z_][\w.]*(?:\(.*)?)?\Z", re.DOTALL)
_OPEN = "([{"
_CLOSE = ")]}"


def _dotted(node: ast.expr) -> str | None:
    # A loop, not a recursion: the parser builds attribute chains far deeper than the
    # interpreter's recursion limit (``a.a.…(2,000 times).f``).
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _function_name(text: str) -> str | None:
    """``text`` if it is a (dotted) Python name that Python's parser builds, else ``None``
    (deeper than it builds: no call)."""
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return _dotted(node)


def _literal(text: str) -> str | None:
    """The JSON text of the Python literal ``text``, or ``None``."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value_text(value)  # (a tuple is an array; too deep to write: None)


def _value(c: Cursor) -> Generator[None, None, str | None]:
    """The text of a keyword argument's value, to (not past) the ``,`` or ``)`` that ends it
    at depth 0; ``None`` if the output ends first."""
    parts: list[str] = []
    depth, quote, escaped = 0, "", False
    while True:
        text, start = c.text, c.pos
        i, n = start, len(text)
        while i < n:
            ch = text[i]
            if quote:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch in _OPEN:
                depth += 1
            elif ch in _CLOSE:
                if depth == 0:
                    break
                depth -= 1
            elif ch == "," and depth == 0:
                break
            i += 1
        parts.append(text[start:i])
        c.pos = i
        if i < n:
            return "".join(parts)
        if c.final:
            return None
        yield


class PythonicParser(ToolParser):
    """``[f(a=1), g(b="x")]``."""

    name = "pythonic"
    markers = (START,)
    leading = "["
    special = (START, END)

    def _read(self, c: Cursor) -> Reader:
        wrapped = c.text.startswith(START, c.pos)
        if wrapped:
            c.pos += len(START)
        if not (yield from blank(c)):
            return TRUNCATED
        listed = c.text[c.pos] == "["
        if listed:
            c.pos += 1
        while True:
            if not (yield from blank(c)):
                return self._cut()
            if listed and c.text[c.pos] == "]" and self.committed:
                c.pos += 1
                break
            ok = yield from self._call(c)
            if not ok:
                if c.final:
                    return self._cut()
                return None if self.committed else NoCall(c.offset)
            if not listed:
                break
            if not (yield from blank(c)):
                return None  # (the list's "]" missing at the end: its calls are whole)
            ch = c.text[c.pos]
            c.pos += 1
            if ch == "]":
                break
            if ch != ",":
                return None
        if wrapped:
            yield from until(c, (END,))
        return None

    def _cut(self) -> object:
        """At the end: a cut call list is truncated; text that never looked like one is
        content."""
        if self.committed:
            return TRUNCATED
        text = self.region_text()
        if text.startswith(START) or _CALL_PREFIX.match("".join(text[:200].split())):
            return TRUNCATED
        return NoCall(len(text))

    def _call(self, c: Cursor) -> Generator[None, None, bool]:
        """One ``name(k=v, …)``; ``True`` if it was a call (emitted)."""
        name = yield from run(c, _DOTTED, _DOTTED_MORE)
        if not name or _function_name(name) is None:
            return False
        if not (yield from blank(c)) or c.text[c.pos] != "(":
            return False
        c.pos += 1
        opened = False
        while True:
            if not (yield from blank(c)):
                return False
            if c.text[c.pos] == ")":
                c.pos += 1
                if not opened:
                    self.open_call(name)
                    self.call_args("{")
                self.call_args("}")
                self.close_call()
                return True
            key = yield from run(c, _IDENT, _IDENT_MORE)
            if not key or not (yield from blank(c)) or c.text[c.pos] != "=":
                return self._bad(opened)
            c.pos += 1
            text = yield from _value(c)
            value = _literal(text) if text is not None and text.strip() else None
            if value is None:
                return self._bad(opened)
            if not opened:
                self.open_call(name)
                self.call_args("{")
            self.call_args(json_key(key, not opened) + value)
            opened = True
            if c.text[c.pos] == ",":
                c.pos += 1

    def _bad(self, opened: bool) -> bool:
        if opened:
            self.break_call()
        return False
