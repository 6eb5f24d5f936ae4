"""``minimax_m2``: MiniMax-M2 / M2.1 / M2.5 tool calls.

The model's chat template writes (and asks for) one block holding the calls::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    </minimax:tool_call>

A string value is written as it is, any other as JSON (``tojson``): a value is typed by the
tool's schema (:mod:`~tsfront.text.tools.params`; ``null`` is null for any type, as vLLM's
parser reads it). Each ``invoke`` is a call, starting at its ``>``. The block is one region:
text in it between invocations is dropped, an invocation without a name too, and an output
that ends inside it is truncated (:attr:`incomplete`).
"""

from __future__ import annotations

from typing import Any

from tsfront.text.tools.base import ToolParser, valid_name
from tsfront.text.tools.params import ParamValue, json_key, read_param
from tsfront.text.tools.reading import TRUNCATED, Cursor, Reader, Step, attributes, until

__all__ = ["MinimaxM2Parser"]

START = "<minimax:tool_call>"
END = "</minimax:tool_call>"
INVOKE = "<invoke"
INVOKE_END = "</invoke>"
PARAMETER = "<parameter"
PARAMETER_END = "</parameter>"


class MinimaxM2Parser(ToolParser):
    """``<minimax:tool_call><invoke name=…><parameter name=…>…</minimax:tool_call>``."""

    name = "minimax_m2"
    markers = (START,)
    special = (START, END)

    def _read(self, c: Cursor) -> Reader:
        c.pos += len(START)
        self.commit()
        while True:
            found = yield from until(c, (INVOKE, END))
            if found < 0:
                return TRUNCATED
            if found == 1:
                return None
            attrs = yield from attributes(c)
            name = (attrs or {}).get("name", "").strip()
            if attrs is None or not valid_name(name):
                if (yield from until(c, (INVOKE_END, END))) == 1:
                    c.pos -= len(END)
                continue
            yield from self._invoke(c, name)

    def _invoke(self, c: Cursor, name: str) -> Step:
        schema: Any = self.tools.get(name, {})
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(props, dict):
            props = {}
        self.open_call(name)
        self.call_args("{")
        count = 0
        ends = (PARAMETER_END, PARAMETER, INVOKE_END, END)
        while True:
            found = yield from until(c, (PARAMETER, INVOKE_END, END))
            if found < 0:
                return
            if found > 0:
                if found == 2:
                    c.pos -= len(END)
                self.call_args("}")
                self.close_call()
                return
            attrs = yield from attributes(c)
            key = (attrs or {}).get("name")
            if attrs is None or key is None:
                if not c.final:
                    self.break_call()
                return
            value = ParamValue(key, props, null_word=True)
            self.call_args(json_key(key, count == 0))
            count += 1
            ended = yield from read_param(self, c, value, ends)
            if ended < 0:
                return
            if ended > 0:
                c.pos -= len(ends[ended])
