"""``llama3_json``: Llama 3.1 / 3.2 / 3.3 JSON tool calls (the JSON-based tool template).

The output is the call itself, optionally after ``<|python_tag|>``; several calls are
separated by ``;``::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": …}

A bare ``{`` opens a call only as the first non-blank text of the output (or after a call),
as vLLM's parser requires the output to start with it; ``<|python_tag|>`` opens one anywhere.
An object without a string ``name`` is content (a plain JSON answer). Llama's built-in tools
(``<|python_tag|>brave_search.call(query=…)``) are not parsed: that text is content. A JSON
answer is held back until its object closes (it cannot be told from a call before).
"""

from __future__ import annotations

from tsfront.text.tools.base import Take, ToolParser, call_from_object, loads_json

__all__ = ["Llama3JsonParser"]

TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    """``{"name": …, "parameters": {…}}`` calls, ``;``-separated."""

    name = "llama3_json"
    markers = (TAG,)
    leading = "{"

    def _take(self, buf: str, final: bool) -> Take:
        tagged = buf.startswith(TAG)
        i = self.blank_end(buf, len(TAG) if tagged else 0)
        if i >= len(buf):
            return None
        if buf[i] != "{":
            return (len(TAG), None) if tagged else (i + 1, None)
        end = self.balanced_end(buf, i)
        if end < 0:
            return None
        try:
            call = call_from_object(loads_json(buf[i:end]), ("parameters", "arguments"))
        except ValueError:
            call = None
        return end, None if call is None else [call]

    def _unfinished(self, buf: str) -> bool:
        if TAG in buf:
            return True
        compact = "".join(buf[:64].split())
        return compact.startswith('{"name"') or '{"name"'.startswith(compact)
