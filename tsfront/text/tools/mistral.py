"""``mistral``: Mistral / Mixtral / Mistral-Small / Devstral / Magistral tool calls.

Both forms after the ``[TOOL_CALLS]`` control token:

- up to tokenizer v7 (Mistral-7B-Instruct-v0.3, Mixtral, Mistral-Nemo): one JSON array,
  ``[TOOL_CALLS] [{"name": "f", "arguments": {…}}, {"name": "g", "arguments": {…}}]``;
- from v11 (Mistral-Small-3.x, Devstral, Magistral): one marker per call, the name, then the
  arguments object, ``[TOOL_CALLS]f[ARGS]{…}[TOOL_CALLS]g[ARGS]{…}``; ``[ARGS]`` may be
  missing (``[TOOL_CALLS]f{…}``, v11's first form) and a ``[CALL_ID]id`` may stand before it.

Ids are 9 letters and digits, as Mistral's own validator requires (a ``[CALL_ID]`` the model
wrote is used when it is that shape). ``[TOOL_CALLS]`` is a special token: the server hands it
to the parser whatever ``skip_special_tokens`` says.
"""

from __future__ import annotations

import re

from tsfront.text.tools.base import CUT, NOT, ToolParser, random_call_id
from tsfront.text.tools.hermes import read_call_list
from tsfront.text.tools.reading import TRUNCATED, Cursor, NoCall, Reader, blank, literal, run

__all__ = ["MistralParser"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ID = re.compile(r"[A-Za-z0-9]+")


def _cut_tag(rest: str) -> bool:
    # At the end of the output: whether what is left is the start of a tag (cut there).
    return bool(rest) and (CALL_ID.startswith(rest) or ARGS.startswith(rest))


class MistralParser(ToolParser):
    """``[TOOL_CALLS] [{…}]`` and ``[TOOL_CALLS]NAME[ARGS]{…}``."""

    name = "mistral"
    markers = (TOOL_CALLS,)
    special = (TOOL_CALLS, ARGS, CALL_ID)

    def _new_id(self) -> str:
        return random_call_id(9, "")

    def _read(self, c: Cursor) -> Reader:
        c.pos += len(TOOL_CALLS)
        if not (yield from blank(c)):
            return TRUNCATED
        if c.text[c.pos] in "[{":
            got = yield from read_call_list(self, c)
            if got == CUT:
                return TRUNCATED
            return NoCall(c.offset) if got == NOT else None
        name = yield from run(c, _NAME)
        if not name:
            return NoCall(len(TOOL_CALLS))
        if c.pos >= len(c.text):
            return TRUNCATED
        given = None
        before = c.offset
        if (yield from literal(c, CALL_ID)):
            given = yield from run(c, _ID)
            if not given:
                return TRUNCATED if c.final else NoCall(before)
        if not (yield from literal(c, ARGS)) and c.final and _cut_tag(c.rest()):
            return TRUNCATED
        if not (yield from blank(c)):
            return TRUNCATED
        if c.text[c.pos] != "{":
            return NoCall(c.offset)
        yield from self.stream_call(c, name, given if len(given or "") == 9 else None)
        return None
