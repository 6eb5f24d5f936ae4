"""``deepseek_v3`` and ``deepseek_v31``: DeepSeek-V3 / R1-0528 and DeepSeek-V3.1 tool calls.

DeepSeek-V3 (and R1-0528) wrap every call's arguments in a fenced JSON block::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁call▁begin｜>…<｜tool▁call▁end｜><｜tool▁calls▁end｜>

DeepSeek-V3.1 drops the type and the fence::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>

(one line in the output).

(The bars are U+FF5C, the blanks U+2581, as in DeepSeek's tokenizer, where each tag is one
special token.) The section is one region: text in it between calls is dropped, a call that
is not one (no separator, no name, arguments that are not an object) is dropped and the
others kept. Each call starts at its arguments' ``{`` and streams. An output that ends
inside the section, even after complete calls, is truncated (:attr:`incomplete`).
"""

from __future__ import annotations

from tsfront.text.tools.base import ToolParser, valid_name
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

__all__ = ["DeepSeekV3Parser", "DeepSeekV31Parser", "SectionParser"]

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


class SectionParser(ToolParser):
    """Formats whose calls stand in a section (``section_begin`` … ``section_end``), each
    call between ``call_begin`` and ``call_end``; a lone call (no section) is read too.
    :meth:`_call` reads one call after its ``call_begin``."""

    section_begin = ""
    section_end = ""
    call_begin = ""
    call_end = ""

    def _read(self, c: Cursor) -> Reader:
        if c.text.startswith(self.section_begin, c.pos):
            c.pos += len(self.section_begin)
            self.commit()
            while True:
                found = yield from until(c, (self.call_begin, self.section_end))
                if found < 0:
                    return TRUNCATED  # the section never closed
                if found == 1:
                    return None
                yield from self._call(c)
        if c.text.startswith(self.section_end, c.pos):
            c.pos += len(self.section_end)  # a stray end: markup, which ends the content
            self.commit()
            return None
        c.pos += len(self.call_begin)
        start = c.offset
        yield from self._call(c)
        if not self.committed:
            return TRUNCATED if c.final else NoCall(start)
        return None

    def _call(self, c: Cursor) -> Step:
        raise NotImplementedError
        yield

    def skip_call(self, c: Cursor) -> Step:
        """Drop the rest of a call that is no call (to its end)."""
        yield from until(c, (self.call_end,))

    def read_args(self, c: Cursor, name: str, call_id: str | None = None) -> Step:
        """The arguments of the call named ``name`` (at ``c.pos``, blanks first) to its end:
        an object streams; none at all (the end right away) is ``{}``."""
        if not (yield from blank(c)):
            return
        if c.text[c.pos] == "{":
            if (yield from self.stream_call(c, name, call_id)) or not c.final:
                yield from self.skip_call(c)
            return
        if (yield from literal(c, self.call_end)):
            self.open_call(name, call_id)
            self.call_args("{}")
            self.close_call()
            return
        yield from self.skip_call(c)


class DeepSeekV3Parser(SectionParser):
    """``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```<｜tool▁call▁end｜>``."""

    name = "deepseek_v3"
    markers = (CALLS_BEGIN, CALL_BEGIN, CALLS_END)
    special = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
    section_begin, section_end, call_begin, call_end = CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END

    def _call(self, c: Cursor) -> Step:
        found = yield from until(c, (SEP, self.call_end))
        if found != 0:
            return
        parts: list[str] = []
        found = yield from until(c, ("\n", self.call_end), parts.append)
        name = "".join(parts).strip()
        if found < 0 or not valid_name(name):
            if found == 0:
                yield from self.skip_call(c)
            return
        if found == 1:
            c.pos -= len(self.call_end)
        if (yield from blank(c)) and not (yield from literal(c, "```json")):
            yield from literal(c, "```")
        yield from self.read_args(c, name)


class DeepSeekV31Parser(DeepSeekV3Parser):
    """``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>``."""

    name = "deepseek_v31"

    def _call(self, c: Cursor) -> Step:
        parts: list[str] = []
        found = yield from until(c, (SEP, self.call_end), parts.append)
        name = "".join(parts).strip()
        if found != 0 or not valid_name(name):
            if found == 0:
                yield from self.skip_call(c)
            return
        yield from self.read_args(c, name)
