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

from collections.abc import Mapping
from typing import Any

from tsfront.text.tools.invocations import InvocationBlockParser
from tsfront.text.tools.params import ParamTags, ParamValue

__all__ = ["DeepSeekV4Parser", "DeepSeekV32Parser"]

DSML = "｜DSML｜"
INVOKE = f"<{DSML}invoke"
INVOKE_END = f"</{DSML}invoke>"
PARAMETER = f"<{DSML}parameter"
PARAMETER_END = f"</{DSML}parameter>"


def _params(block_end: str) -> ParamTags:
    # A value left open ends at the next parameter or the invocation's (or block's) end.
    return ParamTags(
        PARAMETER, (PARAMETER_END, PARAMETER, INVOKE_END, block_end), (INVOKE_END, block_end)
    )


class DeepSeekV32Parser(InvocationBlockParser):
    """``<｜DSML｜function_calls><｜DSML｜invoke name=…>…</｜DSML｜function_calls>``."""

    name = "deepseek_v32"
    markers = (f"<{DSML}function_calls>",)
    special = (DSML, f"<{DSML}", f"</{DSML}")
    block_start, block_end = markers[0], f"</{DSML}function_calls>"
    invoke, invoke_end = INVOKE, INVOKE_END
    params = _params(block_end)

    def _value(self, key: str, props: Mapping[str, Any], attrs: Mapping[str, str]) -> ParamValue:
        string = attrs.get("string", "true") != "false"
        return ParamValue(key, props, string=string, json=True, null_word=False)


class DeepSeekV4Parser(DeepSeekV32Parser):
    """``<｜DSML｜tool_calls><｜DSML｜invoke name=…>…</｜DSML｜tool_calls>`` (V4, V4.1)."""

    name = "deepseek_v4"
    markers = (f"<{DSML}tool_calls>",)
    block_start, block_end = markers[0], f"</{DSML}tool_calls>"
    params = _params(block_end)
