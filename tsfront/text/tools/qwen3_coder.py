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

from collections.abc import Generator, Mapping
from typing import Any, ClassVar

from tsfront.text.tools.base import ToolParser, valid_name
from tsfront.text.tools.params import ParamTags, ParamValue, convert_parameter, read_arguments
from tsfront.text.tools.reading import TRUNCATED, Cursor, NoCall, Reader, tag_name, until

__all__ = ["Qwen3CoderParser", "convert_parameter"]

START = "<tool_call>"
END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"
# What ends a name in <function=NAME> / <parameter=NAME> ("<" and a newline: a malformed tag).
_NAME_ENDS = (">", "<", "\n")
# A value left open ends at the next parameter or the function's (or block's) end.
PARAMS = ParamTags(PARAMETER, (PARAMETER_END, PARAMETER, FUNCTION_END, END), (FUNCTION_END, END))


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
            name = yield from tag_name(c, _NAME_ENDS)
            if name is None or not valid_name(name):
                if self.committed:
                    if wrapped:
                        yield from until(c, (END,))
                    return None
                return TRUNCATED if c.final else NoCall(c.offset)
            # The parameters, to the function's end (or the block's).
            yield from read_arguments(self, c, name, PARAMS, _parameter)
            if not wrapped:
                return None
            found = yield from until(c, (FUNCTION, END))
            if found != 0:
                return None


def _parameter(c: Cursor, props: Mapping[str, Any]) -> Generator[None, None, ParamValue | None]:
    """A parameter's name, to its ``>``."""
    key = yield from tag_name(c, _NAME_ENDS)
    return None if key is None else ParamValue(key, props, trim=True, null_word=True)
