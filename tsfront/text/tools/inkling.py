"""``inkling``: Thinking Machines' Inkling, its TML blocks' tool calls.

Inkling writes typed blocks, each ``<|message_model|>`` (an optional header: the tool's name),
a content-type token, the block, ``<|end_message|>``; its generation prompt ends with
``<|message_model|>``. A call is a block of JSON::

    <|content_text|>Let me check.<|end_message|>
    <|message_model|>get_weather<|content_invoke_tool_json|>{"name": "get_weather",
    "args": {"city": "Paris"}}<|end_message|><|content_model_end_sampling|>

(as SMG's and vLLM's ``inkling`` parsers and TokenSpeed's structural tag read it; the model's
own template was not found in the stores this was written from). The call object streams from
its arguments' ``{`` (``"args"``, or ``"arguments"``). The framing tokens (``<|message_model|>``
and its header, ``<|content_text|>``, ``<|content_thinking|>``, ``<|end_message|>``,
``<|content_model_end_sampling|>``) are markup: the text between them is content. A text-mode
invocation (``<|content_invoke_tool_text|>``) cannot be an OpenAI call: its block is dropped,
as SMG drops it. A JSON block that is no call is dropped too (it is protocol data).
"""

from __future__ import annotations

from tsfront.text.tools.base import CUT, NOT, ToolParser
from tsfront.text.tools.reading import TRUNCATED, Cursor, Reader, blank, until

__all__ = ["CONTROL", "InklingParser"]

MESSAGE = "<|message_model|>"
TEXT = "<|content_text|>"
THINKING = "<|content_thinking|>"
CALL = "<|content_invoke_tool_json|>"
TEXT_CALL = "<|content_invoke_tool_text|>"
END = "<|end_message|>"
END_SAMPLING = "<|content_model_end_sampling|>"
#: Inkling's control tokens in model output.
CONTROL = (MESSAGE, TEXT, THINKING, CALL, TEXT_CALL, END, END_SAMPLING)


class InklingParser(ToolParser):
    """``<|content_invoke_tool_json|>{"name": …, "args": {…}}<|end_message|>``."""

    name = "inkling"
    markers = CONTROL
    special = CONTROL

    def _read(self, c: Cursor) -> Reader:
        if c.text.startswith(MESSAGE, c.pos):
            # A block's header: its name (a tool's, for a call) is not content.
            c.pos += len(MESSAGE)
            found = yield from until(c, (TEXT, THINKING, CALL, TEXT_CALL, END))
            if found < 0:
                return TRUNCATED
            c.pos -= len((TEXT, THINKING, CALL, TEXT_CALL, END)[found])
            return None
        if c.text.startswith(TEXT_CALL, c.pos):
            c.pos += len(TEXT_CALL)
            return None if (yield from until(c, (END,))) >= 0 else TRUNCATED
        if not c.text.startswith(CALL, c.pos):
            for tag in (TEXT, THINKING, END, END_SAMPLING):
                if c.text.startswith(tag, c.pos):
                    c.pos += len(tag)  # framing: the text around it goes on
                    return None
        c.pos += len(CALL)
        self.commit()
        if not (yield from blank(c)):
            return TRUNCATED
        got = NOT
        if c.text[c.pos] == "{":
            got = yield from self.call_object(c, ("args", "arguments"))
        if got == CUT:
            return TRUNCATED
        yield from until(c, (END,))
        return None
