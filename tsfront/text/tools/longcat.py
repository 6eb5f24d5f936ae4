"""``longcat``: Meituan LongCat-Flash (Chat, Thinking, Lite, 2.0) tool calls.

Two bodies inside the same block, as the LongCat models write them: LongCat-Flash-Chat and
-Thinking's template asks for a JSON call object (as ``hermes``)::

    <longcat_tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </longcat_tool_call>

and the later models write the name then key and value pairs (as GLM's, with the tags
prefixed)::

    <longcat_tool_call>get_weather
    <longcat_arg_key>city</longcat_arg_key>
    <longcat_arg_value>Paris</longcat_arg_value>
    </longcat_tool_call>

A body that starts with ``{`` is the first; any other the second (values typed by the tool's
schema, :mod:`~tsfront.text.tools.params`).
"""

from __future__ import annotations

from tsfront.text.tools.glm import KeyValueParser, key_value_tags
from tsfront.text.tools.hermes import read_call_block
from tsfront.text.tools.reading import TRUNCATED, Cursor, Reader, blank

__all__ = ["LongcatParser"]

START = "<longcat_tool_call>"
END = "</longcat_tool_call>"


class LongcatParser(KeyValueParser):
    """``<longcat_tool_call>`` with a JSON call object or ``NAME<longcat_arg_key>…``."""

    name = "longcat"
    markers = (START,)
    start, end = START, END
    key, key_end = "<longcat_arg_key>", "</longcat_arg_key>"
    value, value_end = "<longcat_arg_value>", "</longcat_arg_value>"
    special = (START, END, key, key_end, value, value_end)
    params = key_value_tags(key, value_end, end)

    def _read(self, c: Cursor) -> Reader:
        c.pos += len(START)
        if not (yield from blank(c)):
            return TRUNCATED
        if c.text[c.pos] != "{":
            return (yield from self.read_block(c))
        return (yield from read_call_block(self, c, END))
