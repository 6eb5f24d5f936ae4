"""``mistral``: Mistral / Mixtral / Mistral-Small / Devstral / Magistral tool calls.

Both forms after the ``[TOOL_CALLS]`` control token:

- up to tokenizer v7 (Mistral-7B-Instruct-v0.3, Mixtral, Mistral-Nemo): one JSON array,
  ``[TOOL_CALLS] [{"name": "f", "arguments": {…}}, {"name": "g", "arguments": {…}}]``;
- from v11 (Mistral-Small-3.x, Devstral, Magistral): one marker per call, the name, then the
  arguments object, ``[TOOL_CALLS]f[ARGS]{…}[TOOL_CALLS]g[ARGS]{…}``; ``[ARGS]`` may be
  missing (``[TOOL_CALLS]f{…}``, v11's first form) and a ``[CALL_ID]id`` may stand before it.

Ids are 9 letters and digits, as Mistral's own validator requires (a ``[CALL_ID]`` the model
wrote is used when it is that shape). ``[TOOL_CALLS]`` is a special token: the server must
detokenize with ``skip_special_tokens=False`` for this parser, as vLLM does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tsfront.text.tools.base import (
    Take,
    ToolParser,
    call_from_object,
    canonical_arguments,
    loads_json,
    random_call_id,
)

__all__ = ["MistralParser"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ID = re.compile(r"[A-Za-z0-9]+")
# What ends a name, an id (the characters the two above do not take).
_AFTER_NAME = re.compile(r"[^A-Za-z0-9_.\-]")
_AFTER_ID = re.compile(r"[^A-Za-z0-9]")


class MistralParser(ToolParser):
    """``[TOOL_CALLS] [{…}]`` and ``[TOOL_CALLS]NAME[ARGS]{…}``."""

    name = "mistral"
    markers = (TOOL_CALLS,)

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._ids: list[str] = []

    def _new_id(self) -> str:
        given = self._ids.pop(0) if self._ids else ""
        return given if len(given) == 9 and given.isalnum() else random_call_id(9, "")

    def _take(self, buf: str, final: bool) -> Take:
        i = self.blank_end(buf, len(TOOL_CALLS))
        if i >= len(buf):
            return None
        if buf[i] in "[{":
            end = self.balanced_end(buf, i)
            if end < 0:
                return None
            try:
                obj = loads_json(buf[i:end])
            except ValueError:
                return end, None
            items = obj if isinstance(obj, list) else [obj]
            calls = [call_from_object(item) for item in items]
            if not calls or any(c is None for c in calls):
                return end, None
            self._ids = [""] * len(calls)
            return end, [c for c in calls if c is not None]
        name = _NAME.match(buf, i)
        if name is None:
            return len(TOOL_CALLS), None
        j = name.end()
        if j == len(buf):
            self.wait_outside(_AFTER_NAME)
            return None
        call_id = ""
        if buf.startswith(CALL_ID, j):
            k = j + len(CALL_ID)
            ident = _ID.match(buf, k)
            if ident is None:
                return None if k == len(buf) else (j, None)
            if ident.end() == len(buf):
                self.wait_outside(_AFTER_ID)
                return None
            call_id, j = ident.group(), ident.end()
        elif j < len(buf) and CALL_ID.startswith(buf[j:]):
            return None
        if buf.startswith(ARGS, j):
            j += len(ARGS)
        elif ARGS.startswith(buf[j:]):
            return None
        j = self.blank_end(buf, j)
        if j >= len(buf):
            return None
        if buf[j] != "{":
            return j, None
        end = self.balanced_end(buf, j)
        if end < 0:
            return None
        try:
            args = canonical_arguments(loads_json(buf[j:end]))
        except ValueError:
            args = None
        if args is None:
            return end, None
        self._ids = [call_id]
        return end, [(name.group(), args)]
