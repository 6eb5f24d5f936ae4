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

from collections.abc import Generator, Mapping
from typing import Any, ClassVar

from tsfront.text.tools.base import BROKE, ToolParser, valid_name
from tsfront.text.tools.params import ParamTags, ParamValue, read_arguments
from tsfront.text.tools.reading import (
    TRUNCATED,
    Cursor,
    NoCall,
    Reader,
    blank,
    literal,
    until,
)

__all__ = ["Glm45Parser", "Glm47Parser", "KeyValueParser", "key_value_tags"]


def key_value_tags(key: str, value_end: str, end: str) -> ParamTags:
    """A key and value format's parameters: each opens with its ``key`` tag; a value left
    open ends at the next key or the block's ``end``."""
    return ParamTags(key, (value_end, key, end), (end,))


class KeyValueParser(ToolParser):
    """Formats of one block per call: ``START NAME (KEY k KEY_END VALUE v VALUE_END)* END``
    (GLM's tags; LongCat's are the same with a prefix)."""

    start = "<tool_call>"
    end = "</tool_call>"
    key = "<arg_key>"
    key_end = "</arg_key>"
    value = "<arg_value>"
    value_end = "</arg_value>"
    params: ClassVar[ParamTags] = key_value_tags(key, value_end, end)

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
        if (yield from read_arguments(self, c, name, self.params, self._parameter)) == BROKE:
            yield from until(c, (self.end,))  # what is left of the block, dropped
        return None

    def _parameter(
        self, c: Cursor, props: Mapping[str, Any]
    ) -> Generator[None, None, ParamValue | None]:
        """A parameter's key, to its value's tag."""
        parts: list[str] = []
        if (yield from until(c, (self.key_end,), parts.append)) < 0:
            return None
        if not ((yield from blank(c)) and (yield from literal(c, self.value))):
            return None
        return ParamValue("".join(parts).strip(), props, null_word=False)


class Glm45Parser(KeyValueParser):
    """``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>``."""

    name = "glm45"
    markers = ("<tool_call>",)
    special = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
               "</arg_value>")  # fmt: skip


class Glm47Parser(Glm45Parser):
    """GLM-4.7 / GLM-5: the same without the newlines."""

    name = "glm47"
