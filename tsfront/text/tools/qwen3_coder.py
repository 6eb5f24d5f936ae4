"""``qwen3_coder``: Qwen3-Coder's (and Qwen3.5's, Nemotron-3's) XML-like tool calls.

::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

The call starts at the function name's ``>``; each parameter is written as JSON as it arrives
(:mod:`~tsfront.text.tools.params`: one newline trimmed at each end; a string-typed or unknown
parameter streams as a JSON string, other types are converted by the schema when the value
ends, as vLLM's ``qwen3_coder`` parser converts them; ``null`` is null for any type). A missing
``</parameter>`` ends at the next ``<parameter=`` or ``</function>``; ``</tool_call>`` ends a
function left open. Several ``<function=…>`` in one block are several calls; a
``<function=…>…</function>`` without ``<tool_call>`` around it is a call too. A block with no
function is content (if no call came before).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, ClassVar

from tsfront.text.tools.base import ToolParser, valid_name
from tsfront.text.tools.params import ParamValue, convert_parameter, json_key, read_param
from tsfront.text.tools.reading import TRUNCATED, Cursor, NoCall, Reader, Step, until

__all__ = ["Qwen3CoderParser", "convert_parameter", "read_tag_name"]

START = "<tool_call>"
END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"
# What ends a name in <function=NAME> / <parameter=NAME> ("<" and a newline: a malformed tag).
_NAME_ENDS = (">", "<", "\n")


def read_tag_name(
    c: Cursor, ends: tuple[str, ...] = _NAME_ENDS
) -> Generator[None, None, tuple[str, bool]]:
    """The name of ``<function=NAME>``: ``(name, True)`` when ``>`` ended it, else
    ``(text, False)``."""
    parts: list[str] = []
    found = yield from until(c, ends, parts.append)
    return "".join(parts).strip(), found == 0


class Qwen3CoderParser(ToolParser):
    """``<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>``."""

    name = "qwen3_coder"
    markers: ClassVar[tuple[str, ...]] = (START, FUNCTION)
    special: ClassVar[tuple[str, ...]] = (
        START,
        END,
        FUNCTION,
        FUNCTION_END,
        PARAMETER,
        PARAMETER_END,
    )

    def _read(self, c: Cursor) -> Reader:
        wrapped = c.text.startswith(START, c.pos)
        if wrapped:
            c.pos += len(START)
            found = yield from until(c, (FUNCTION, END))
            if found != 0:  # a block with no function: text (or cut)
                return NoCall(c.offset) if found == 1 else TRUNCATED
        else:
            c.pos += len(FUNCTION)
        while True:
            name, ok = yield from read_tag_name(c)
            if not ok or not valid_name(name):
                if self.committed:
                    if wrapped:
                        yield from until(c, (END,))
                    return None
                return TRUNCATED if c.final else NoCall(c.offset)
            yield from self._function(c, name)
            if not wrapped:
                return None
            found = yield from until(c, (FUNCTION, END))
            if found != 0:
                return None

    def _function(self, c: Cursor, name: str) -> Step:
        """The parameters of a function whose name was read, to its ``</function>`` (or the
        block's end)."""
        schema: Any = self.tools.get(name, {})
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(props, dict):
            props = {}
        self.open_call(name)
        self.call_args("{")
        count = 0
        while True:
            found = yield from until(c, (PARAMETER, FUNCTION_END, END))
            if found == 0:
                key, ok = yield from read_tag_name(c)
                if not ok:
                    if not c.final:  # (cut: the call stays open, the region's end cuts it)
                        self.break_call()
                    return
                value = ParamValue(key, props, trim=True, null_word=True)
                self.call_args(json_key(key, count == 0))
                count += 1
                ended = yield from read_param(self, c, value, (PARAMETER_END, PARAMETER,
                                                               FUNCTION_END, END))  # fmt: skip
                if ended < 0:
                    return  # cut: the call stays open
                if ended > 0:
                    c.pos -= len((PARAMETER_END, PARAMETER, FUNCTION_END, END)[ended])
                continue
            if found < 0:
                return  # cut
            if found == 2:
                c.pos -= len(END)
            self.call_args("}")
            self.close_call()
            return
