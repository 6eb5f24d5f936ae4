"""``deepseek_v32`` and ``deepseek_v4``: DeepSeek's DSML tool calls (V3.2, V4, V4.1).

The model's own template (DeepSeek-V3.2's ``encoding_dsv32``, V4's ``encoding_dsv4``) asks for
one block of invocations::

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

V4 names the block ``<｜DSML｜tool_calls>``; the invocations are the same. A parameter's
``string="true"`` value is text, as it is (a JSON string, streamed as it arrives); a
``string="false"`` value is JSON (numbers, booleans, arrays, objects), read when it ends, and
kept as text if it is not JSON. Each ``invoke`` is a call, starting at its ``>``. The block is
one region: text in it between invocations is dropped, an invocation without a name is
dropped, and an output that ends inside the block is truncated (:attr:`incomplete`).
"""

from __future__ import annotations

from typing import Any

from tsfront.text.tools.base import ToolParser, valid_name
from tsfront.text.tools.params import ParamValue, json_key, read_param
from tsfront.text.tools.reading import TRUNCATED, Cursor, Reader, Step, attributes, until

__all__ = ["DeepSeekV4Parser", "DeepSeekV32Parser"]

DSML = "｜DSML｜"
INVOKE = f"<{DSML}invoke"
INVOKE_END = f"</{DSML}invoke>"
PARAMETER = f"<{DSML}parameter"
PARAMETER_END = f"</{DSML}parameter>"


class DeepSeekV32Parser(ToolParser):
    """``<｜DSML｜function_calls><｜DSML｜invoke name=…>…</｜DSML｜function_calls>``."""

    name = "deepseek_v32"
    block = "function_calls"
    markers = (f"<{DSML}function_calls>",)
    special = (DSML, f"<{DSML}", f"</{DSML}")

    @property
    def _close(self) -> str:
        return f"</{DSML}{self.block}>"

    def _read(self, c: Cursor) -> Reader:
        c.pos += len(self.markers[0])
        self.commit()
        close = self._close
        while True:
            found = yield from until(c, (INVOKE, close))
            if found < 0:
                return TRUNCATED
            if found == 1:
                return None
            attrs = yield from attributes(c)
            name = (attrs or {}).get("name", "").strip()
            if attrs is None or not valid_name(name):
                if (yield from until(c, (INVOKE_END, close))) == 1:
                    c.pos -= len(close)
                continue
            yield from self._invoke(c, name, close)

    def _invoke(self, c: Cursor, name: str, close: str) -> Step:
        schema: Any = self.tools.get(name, {})
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(props, dict):
            props = {}
        self.open_call(name)
        self.call_args("{")
        count = 0
        ends = (PARAMETER_END, PARAMETER, INVOKE_END, close)
        while True:
            found = yield from until(c, (PARAMETER, INVOKE_END, close))
            if found < 0:
                return  # cut: the call stays open
            if found > 0:
                if found == 2:
                    c.pos -= len(close)
                self.call_args("}")
                self.close_call()
                return
            attrs = yield from attributes(c)
            key = (attrs or {}).get("name")
            if attrs is None or key is None:
                if not c.final:
                    self.break_call()
                return
            value = ParamValue(
                key, props, string=attrs.get("string", "true") != "false", json=True,
                null_word=False,
            )  # fmt: skip
            self.call_args(json_key(key, count == 0))
            count += 1
            ended = yield from read_param(self, c, value, ends)
            if ended < 0:
                return
            if ended > 0:
                c.pos -= len(ends[ended])


class DeepSeekV4Parser(DeepSeekV32Parser):
    """``<｜DSML｜tool_calls><｜DSML｜invoke name=…>…</｜DSML｜tool_calls>`` (V4, V4.1)."""

    name = "deepseek_v4"
    block = "tool_calls"
    markers = (f"<{DSML}tool_calls>",)
