"""``hermes``: Hermes-2-Pro, Qwen2.5 and Qwen3 (non-coder) tool calls.

One block per call::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The block's body is one JSON object (``"arguments"``, or ``"parameters"``, may be missing:
``{}``; a JSON string holding an object is parsed), or a JSON array of such objects. A block
the output ends in without ``</tool_call>`` is still a call when its body is complete JSON
(models sometimes stop at EOS before the close tag); otherwise it is a truncated call.
"""

from __future__ import annotations

from tsfront.text.tools.base import Take, ToolParser, call_from_object, loads_json

__all__ = ["HermesParser"]

START = "<tool_call>"
END = "</tool_call>"


def parse_json_calls(body: str) -> list[tuple[str, str]] | None:
    """The calls of a JSON body: one call object or an array of them; ``None`` if not."""
    try:
        obj = loads_json(body)
    except ValueError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    calls = [call_from_object(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


class HermesParser(ToolParser):
    """``<tool_call>{json}</tool_call>`` blocks."""

    name = "hermes"
    markers = (START,)

    def _take(self, buf: str, final: bool) -> Take:
        end = self.find_resumed(buf, END, len(START))
        if end < 0:
            if not final:
                return None
            calls = parse_json_calls(buf[len(START) :])
            return None if calls is None else (len(buf), calls)
        return end + len(END), parse_json_calls(buf[len(START) : end])
