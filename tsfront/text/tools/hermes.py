"""``hermes``: Hermes-2-Pro, Qwen2.5 and Qwen3 (non-coder) tool calls.

One block per call::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The block's body is one JSON call object (``"arguments"``, or ``"parameters"``, may be
missing: ``{}``; a JSON string holding an object is parsed), or a JSON array of them. The
arguments stream from their ``{`` on. A block the output ends in without ``</tool_call>`` is
still a call when its object closed (models sometimes stop at EOS before the close tag).
A block whose body is no call object is content (markup included) if no call came before.
"""

from __future__ import annotations

from tsfront.text.tools.base import CALL, CUT, NOT, ToolParser
from tsfront.text.tools.reading import TRUNCATED, Cursor, NoCall, Reader, blank, until

__all__ = ["HermesParser", "read_call_block", "read_call_list"]

START = "<tool_call>"
END = "</tool_call>"


def read_call_list(
    parser: ToolParser, c: Cursor, keys: tuple[str, ...] = ("arguments", "parameters")
) -> Reader:
    """The JSON body at ``c.pos`` (after blanks): one call object or an array of them.
    Returns `CALL` (every element a call), `NOT` (no call: not an object or array of them, or
    an empty array), or the `ToolParser.call_object` outcome that stopped it (`BROKE`, `CUT`;
    `NOT` after calls: the rest is dropped)."""
    if not (yield from blank(c)):
        return CUT
    ch = c.text[c.pos]
    if ch == "{":
        return (yield from parser.call_object(c, keys))
    if ch != "[":
        return NOT
    c.pos += 1
    got = NOT
    while True:
        if not (yield from blank(c)):
            return CUT
        ch = c.text[c.pos]
        if ch == "]" and got == NOT:
            c.pos += 1
            return NOT
        if ch != "{":
            return got
        got = yield from parser.call_object(c, keys)
        if got != CALL:
            return got
        if not (yield from blank(c)):
            return CUT
        ch = c.text[c.pos]
        c.pos += 1
        if ch == "]":
            return CALL
        if ch != ",":
            return CALL


def read_call_block(parser: ToolParser, c: Cursor, end: str) -> Reader:
    """A block whose body (at ``c.pos``) is JSON calls (:func:`read_call_list`), read to its
    ``end`` tag. A body that is no call makes the block text, close tag included (if it
    closes); what is left of a block after its calls is dropped."""
    got = yield from read_call_list(parser, c)
    if got == CUT:
        return TRUNCATED
    if got == NOT:
        if (yield from until(c, (end,))) < 0:
            return TRUNCATED
        return NoCall(c.offset)
    yield from until(c, (end,))  # (CALL or BROKE)
    return None


class HermesParser(ToolParser):
    """``<tool_call>{json}</tool_call>`` blocks."""

    name = "hermes"
    markers = (START,)
    special = (START, END)

    def _read(self, c: Cursor) -> Reader:
        c.pos += len(START)
        return (yield from read_call_block(self, c, END))
