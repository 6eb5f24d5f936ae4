"""``pythonic``: Python-call-list tool calls (Llama-3.2 / Llama-4 pythonic templates, ToolACE).

::

    [get_weather(city="Paris", days=3), get_time(tz='UTC')]

The list is parsed with :mod:`ast` and only literals are accepted (``ast.literal_eval`` of
each keyword value: strings, numbers, ``True``/``False``/``None``, lists, dicts, tuples);
anything else (a name, an operation, a call as a value, ``**kwargs``, positional arguments) is
no call and the text is content. Nothing is ever evaluated. A ``[`` opens a call only as the
first non-blank text of the output (or after a call); Llama-4's ``<|python_start|>…
<|python_end|>`` wrapper opens one anywhere. Python's triple-quoted strings are not handled.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from tsfront.text.tools.base import Take, ToolParser, canonical_arguments

__all__ = ["PythonicParser", "parse_call_list"]

START = "<|python_start|>"
END = "<|python_end|>"
# The start of a call list with blanks removed: "[", "[name", "[name(…".
_CALL_PREFIX = re.compile(r"\[(?:[A-Za-z_][\w.]*(?:\(.*)?)?\Z", re.DOTALL)


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


def parse_call_list(text: str) -> list[tuple[str, str]] | None:
    """``[f(a=1), g(b="x")]`` (or one call) as ``(name, arguments JSON)``; ``None`` if not."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    node = tree.body
    items = node.elts if isinstance(node, ast.List) else [node]
    calls: list[tuple[str, str]] = []
    for item in items:
        if not isinstance(item, ast.Call) or item.args:
            return None
        name = _dotted(item.func)
        if name is None:
            return None
        args: dict[str, Any] = {}
        for kw in item.keywords:
            if kw.arg is None:
                return None
            try:
                args[kw.arg] = _jsonable(ast.literal_eval(kw.value))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        arguments = canonical_arguments(args)
        if arguments is None:
            return None
        calls.append((name, arguments))
    return calls or None


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


class PythonicParser(ToolParser):
    """``[f(a=1), g(b="x")]``."""

    name = "pythonic"
    markers = (START,)
    leading = "["

    def _take(self, buf: str, final: bool) -> Take:
        if buf.startswith(START):
            end = self.find_resumed(buf, END, len(START))
            if end < 0:
                if final:
                    calls = parse_call_list(buf[len(START) :])
                    return None if calls is None else (len(buf), calls)
                return None
            return end + len(END), parse_call_list(buf[len(START) : end])
        i = self.blank_end(buf, 0)
        end = self.balanced_end(buf, i, python=True)
        if end < 0:
            return None
        return end, parse_call_list(buf[i:end])

    def _unfinished(self, buf: str) -> bool:
        if buf.startswith(START):
            return True
        return _CALL_PREFIX.match("".join(buf[:200].split())) is not None
