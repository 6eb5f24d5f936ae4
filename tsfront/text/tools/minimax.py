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

from collections.abc import Mapping
from typing import Any

from tsfront.text.tools.invocations import InvocationBlockParser
from tsfront.text.tools.params import ParamTags, ParamValue

__all__ = ["MinimaxM2Parser"]

START = "<minimax:tool_call>"
END = "</minimax:tool_call>"
INVOKE = "<invoke"
INVOKE_END = "</invoke>"
PARAMETER = "<parameter"
PARAMETER_END = "</parameter>"


class MinimaxM2Parser(InvocationBlockParser):
    """``<minimax:tool_call><invoke name=…><parameter name=…>…</minimax:tool_call>``."""

    name = "minimax_m2"
    markers = (START,)
    special = (START, END)
    block_start, block_end, invoke, invoke_end = START, END, INVOKE, INVOKE_END
    # A value left open ends at the next parameter or the invocation's (or block's) end.
    params = ParamTags(PARAMETER, (PARAMETER_END, PARAMETER, INVOKE_END, END), (INVOKE_END, END))

    def _value(self, key: str, props: Mapping[str, Any], attrs: Mapping[str, str]) -> ParamValue:
        return ParamValue(key, props, null_word=True)
