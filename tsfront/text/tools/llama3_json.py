"""``llama3_json``: Llama 3.1 / 3.2 / 3.3 JSON tool calls (the JSON-based tool template).

The output is the call itself, optionally after ``<|python_tag|>``; several calls are
separated by ``;``::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": …}

A bare ``{`` opens a call only as the first non-blank text of the output (or after a call),
as vLLM's parser requires the output to start with it; ``<|python_tag|>`` (a special token:
the server hands it to the parser whatever ``skip_special_tokens`` says) opens one anywhere.
An object without a string ``name`` is content (a plain JSON answer). Llama's built-in tools
(``<|python_tag|>brave_search.call(query=…)``) are not parsed: that text is content.
"""

from __future__ import annotations

from tsfront.text.tools.base import CUT, NOT, ToolParser
from tsfront.text.tools.reading import TRUNCATED, Cursor, NoCall, Reader, blank

__all__ = ["Llama3JsonParser"]

TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    """``{"name": …, "parameters": {…}}`` calls, ``;``-separated."""

    name = "llama3_json"
    markers = (TAG,)
    leading = "{"
    special = (TAG,)

    def _read(self, c: Cursor) -> Reader:
        tagged = c.text.startswith(TAG, c.pos)
        if tagged:
            c.pos += len(TAG)
        if not (yield from blank(c)):
            return TRUNCATED
        if c.text[c.pos] != "{":
            return NoCall(len(TAG) if tagged else c.offset + 1)
        got = yield from self.call_object(c, ("parameters", "arguments"))
        if got == NOT:
            return NoCall(c.offset)
        if got == CUT and not self.committed:
            return TRUNCATED if self._unfinished(self.region_text()) else NoCall(c.offset)
        return None if got != CUT else TRUNCATED

    @staticmethod
    def _unfinished(text: str) -> bool:
        """At the end, whether the cut region looked like a call (else it is an answer)."""
        if TAG in text:
            return True
        compact = "".join(text[:64].split())
        return compact.startswith('{"name"') or '{"name"'.startswith(compact)
