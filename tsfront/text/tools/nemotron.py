"""``nemotron``: NVIDIA Nemotron tool calls, both shapes its models write.

Nemotron-3 (Nano, Super: the Nemotron-H models) writes Qwen3-Coder's XML calls
(:mod:`~tsfront.text.tools.qwen3_coder`); Nemotron-Nano-v2 and Llama-Nemotron write a JSON
array in one block, as their templates ask::

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>

Both are read (the markers differ).
"""

from __future__ import annotations

from tsfront.text.tools.hermes import read_call_block
from tsfront.text.tools.qwen3_coder import Qwen3CoderParser
from tsfront.text.tools.reading import Cursor, Reader

__all__ = ["NemotronParser"]

START = "<TOOLCALL>"
END = "</TOOLCALL>"


class NemotronParser(Qwen3CoderParser):
    """``<TOOLCALL>[{…}]</TOOLCALL>`` and Qwen3-Coder's XML."""

    name = "nemotron"
    markers = (START, *Qwen3CoderParser.markers)
    special = (START, END, *Qwen3CoderParser.special)

    def _read(self, c: Cursor) -> Reader:
        if not c.text.startswith(START, c.pos):
            return (yield from super()._read(c))
        c.pos += len(START)
        return (yield from read_call_block(self, c, END))
