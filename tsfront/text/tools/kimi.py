"""``kimi_k2``: Kimi-K2 / K2-Thinking / K2.5 tool calls.

Moonshot's tool-call guide for Kimi-K2 (docs/tool_call_guidance.md) and its chat template::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

(one line in the output; each tag is one special token). The call's id is
``functions.NAME:INDEX``; the name is read from it (a ``functions.`` prefix and a ``:INDEX``
suffix dropped). The id a client sees is the model's when it has that shape, as the template
writes a call's ``id`` back into the next prompt (``<|tool_call_begin|>{{ id }}``, and ``##
Return of {{ tool_call_id }}`` before its result) and the model was trained on its own ids;
any other is random. The arguments stream from their ``{``. The section is one region (see
:class:`~tsfront.text.tools.deepseek.SectionParser`); the singular spelling
``<|tool_call_section_begin|>`` some outputs have is read too.
"""

from __future__ import annotations

import re

from tsfront.text.tools.base import valid_name
from tsfront.text.tools.deepseek import SectionParser
from tsfront.text.tools.reading import Cursor, Reader, Step, until

__all__ = ["KimiK2Parser"]

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
# The singular spelling of the section tags (vLLM reads both).
SECTION_BEGIN_1 = "<|tool_call_section_begin|>"
SECTION_END_1 = "<|tool_call_section_end|>"
_ID = re.compile(r"functions\.[^\s:]+:\d+")
_INDEX = re.compile(r":\d+\Z")


def name_of(call_id: str) -> str:
    """The function name of a Kimi call id (``functions.NAME:INDEX``; also ``NAME:INDEX``)."""
    name = _INDEX.sub("", call_id.strip())
    return name.removeprefix("functions.")


class KimiK2Parser(SectionParser):
    """``<|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>{…}<|tool_call_end|>``."""

    name = "kimi_k2"
    markers = (SECTION_BEGIN, SECTION_BEGIN_1, CALL_BEGIN, SECTION_END, SECTION_END_1)
    special = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END,
               SECTION_BEGIN_1, SECTION_END_1)  # fmt: skip
    section_begin, section_end, call_begin, call_end = (
        SECTION_BEGIN,
        SECTION_END,
        CALL_BEGIN,
        CALL_END,
    )

    def _read(self, c: Cursor) -> Reader:
        # The singular spelling is the same section.
        if c.text.startswith(SECTION_BEGIN_1, c.pos) or c.text.startswith(SECTION_END_1, c.pos):
            self.section_begin, self.section_end = SECTION_BEGIN_1, SECTION_END_1
        else:
            self.section_begin, self.section_end = SECTION_BEGIN, SECTION_END
        return (yield from super()._read(c))

    def _call(self, c: Cursor) -> Step:
        parts: list[str] = []
        found = yield from until(c, (ARGUMENT_BEGIN, self.call_end), parts.append)
        call_id = "".join(parts).strip()
        name = name_of(call_id)
        if found != 0 or not valid_name(name):
            if found == 0:
                yield from self.skip_call(c)
            return
        yield from self.read_args(c, name, call_id if _ID.fullmatch(call_id) else None)
