"""``glm45`` and ``glm47``: GLM-4.5 / 4.6 and GLM-4.7 / GLM-5 tool calls.

The models' chat templates write (and ask for) one block per call, the function's name, then
key and value pairs::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

GLM-4.7 and GLM-5 drop the newlines (``<tool_call>get_weather<arg_key>city</arg_key>…``); one
reader takes both (``glm47`` is ``glm45``'s class under vLLM's name for the later family). The
template writes a string value as it is and any other value as JSON (``tojson``): a value is
typed by the tool's schema (:mod:`~tsfront.text.tools.params`: a string-typed or unknown
parameter is a JSON string, streamed as it arrives; others converted when the value ends).
The call starts at the end of its name (a newline, ``<arg_key>`` or ``</tool_call>``). A block
with no name is content (if no call came before).
"""

from __future__ import annotations

from typing import Any

from tsfront.text.tools.base import ToolParser, valid_name
from tsfront.text.tools.params import ParamValue, json_key, read_param
from tsfront.text.tools.reading import (
    TRUNCATED,
    Cursor,
    NoCall,
    Reader,
    Step,
    blank,
    literal,
    until,
)

__all__ = ["Glm45Parser", "Glm47Parser", "KeyValueParser"]


class KeyValueParser(ToolParser):
    """Formats of one block per call: ``START NAME (KEY k KEY_END VALUE v VALUE_END)* END``
    (GLM's tags; LongCat's are the same with a prefix)."""

    start = "<tool_call>"
    end = "</tool_call>"
    key = "<arg_key>"
    key_end = "</arg_key>"
    value = "<arg_value>"
    value_end = "</arg_value>"

    def _read(self, c: Cursor) -> Reader:
        c.pos += len(self.start)
        return (yield from self.read_block(c))

    def read_block(self, c: Cursor) -> Reader:
        """The block after its start tag: the name, then the arguments."""
        if not (yield from blank(c)):
            return TRUNCATED
        parts: list[str] = []
        found = yield from until(c, ("\n", self.key, self.end), parts.append)
        name = "".join(parts).strip()
        if found < 0:
            return TRUNCATED
        if found > 0:
            c.pos -= len((self.key, self.end)[found - 1])
        if not valid_name(name):
            if (yield from until(c, (self.end,))) < 0:
                return TRUNCATED
            return NoCall(c.offset)
        yield from self._arguments(c, name)
        return None

    def _arguments(self, c: Cursor, name: str) -> Step:
        schema: Any = self.tools.get(name, {})
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(props, dict):
            props = {}
        self.open_call(name)
        self.call_args("{")
        count = 0
        ends = (self.value_end, self.key, self.end)
        while True:
            found = yield from until(c, (self.key, self.end))
            if found < 0:
                return  # cut: the call stays open
            if found == 1:
                self.call_args("}")
                self.close_call()
                return
            parts: list[str] = []
            if (yield from until(c, (self.key_end,), parts.append)) < 0:
                return
            key = "".join(parts).strip()
            if not ((yield from blank(c)) and (yield from literal(c, self.value))):
                if not c.final:
                    self.break_call()
                    yield from until(c, (self.end,))
                return
            value = ParamValue(key, props, null_word=False)
            self.call_args(json_key(key, count == 0))
            count += 1
            ended = yield from read_param(self, c, value, ends)
            if ended < 0:
                return
            if ended > 0:
                c.pos -= len(ends[ended])


class Glm45Parser(KeyValueParser):
    """``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>``."""

    name = "glm45"
    markers = ("<tool_call>",)
    special = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
               "</arg_value>")  # fmt: skip


class Glm47Parser(Glm45Parser):
    """GLM-4.7 / GLM-5: the same without the newlines."""

    name = "glm47"
