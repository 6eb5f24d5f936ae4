"""``kimi_k3``: Kimi-K3's XTML tool calls.

Kimi-K3's chat template writes an assistant message as channels, each between
``<|open|>NAME ATTRS<|sep|>`` and ``<|close|>NAME<|sep|>`` (the three bars are special
tokens): the thought (``think``), the answer (``response``), then the calls (``tools``)::

    <|open|>response<|sep|>Let me check.<|close|>response<|sep|>
    <|open|>tools<|sep|>
    <|open|>call tool="get_weather" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
    <|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>
    <|close|>call<|sep|>
    <|close|>tools<|sep|><|close|>message<|sep|>

A ``call``'s arguments are ``argument`` channels (``type="string"``: text as it is, streamed
as a JSON string; any other type: JSON, read when it ends, else kept as text) or one ``json``
channel holding the arguments object (``<|open|>json type="object"<|sep|>{…}<|close|>json
<|sep|>``, streamed as it comes). Attribute values escape ``&`` and ``"`` as XML does. The
``response`` and ``message`` channel tags around the answer are markup, never content (the
answer inside them is); so are ``think``'s when no reasoning parser takes the thought. Each
call starts when its first argument (or its end) shows which form it has; ``index`` is not
read (indices are the calls' order, as the server numbers them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tsfront.text.tools.invocations import InvocationBlockParser
from tsfront.text.tools.params import ParamTags, ParamValue, read_arguments
from tsfront.text.tools.reading import Cursor, Reader, Step, attributes, blank, until

__all__ = ["WRAPPERS", "KimiK3Parser"]

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
TOOLS = f"{OPEN}tools{SEP}"
TOOLS_END = f"{CLOSE}tools{SEP}"
CALL = f"{OPEN}call"
CALL_END = f"{CLOSE}call{SEP}"
ARGUMENT = f"{OPEN}argument"
ARGUMENT_END = f"{CLOSE}argument{SEP}"
JSON_ARGS = f"{OPEN}json"
JSON_END = f"{CLOSE}json{SEP}"
#: The channel tags around the answer: markup whose inside is content.
WRAPPERS = (
    f"{OPEN}response{SEP}",
    f"{CLOSE}response{SEP}",
    f"{CLOSE}message{SEP}",
    f"{OPEN}think{SEP}",
    f"{CLOSE}think{SEP}",
)
# What a call's first channel may be: an argument, the json channel, or the call's end.
_FIRST = (ARGUMENT, JSON_ARGS, CALL_END, TOOLS_END)


class KimiK3Parser(InvocationBlockParser):
    """``<|open|>tools<|sep|><|open|>call tool=…<|sep|>…<|close|>tools<|sep|>``."""

    name = "kimi_k3"
    markers = (TOOLS, *WRAPPERS)
    special = (OPEN, CLOSE, SEP, "<|end_of_msg|>")
    block_start, block_end, invoke, invoke_end = TOOLS, TOOLS_END, CALL, CALL_END
    attribute_end, entities = SEP, True
    name_attribute, key_attribute = "tool", "key"
    # An argument left open ends at the call's (or the block's) end; a json channel after
    # arguments is no call of this shape.
    params = ParamTags(
        ARGUMENT, (ARGUMENT_END, CALL_END, TOOLS_END), (CALL_END, TOOLS_END), (JSON_ARGS,)
    )

    def _read(self, c: Cursor) -> Reader:
        for wrapper in WRAPPERS:
            if c.text.startswith(wrapper, c.pos):
                c.pos += len(wrapper)  # markup, content around it goes on
                return None
        return (yield from super()._read(c))

    def _invoke(self, c: Cursor, name: str) -> Step:
        # The call starts when its first channel shows which form its arguments have.
        found = yield from until(c, _FIRST)
        if found < 0:
            return  # cut
        if found != 1:
            c.pos -= len(_FIRST[found])
            yield from read_arguments(self, c, name, self.params, self.read_parameter)
            return
        # The arguments as one JSON object: the call starts at its {.
        if (yield from attributes(c, end=SEP)) is None or not (yield from blank(c)):
            return
        if c.text[c.pos] == "{":
            yield from self.stream_call(c, name)
        yield from until(c, (CALL_END,))

    def _value(self, key: str, props: Mapping[str, Any], attrs: Mapping[str, str]) -> ParamValue:
        string = attrs.get("type", "string") == "string"
        return ParamValue(key, props, string=string, json=True, null_word=False)
