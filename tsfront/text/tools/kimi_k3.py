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

from typing import Any

from tsfront.text.tools.base import ToolParser, valid_name
from tsfront.text.tools.params import ParamValue, json_key, read_param
from tsfront.text.tools.reading import (
    TRUNCATED,
    Cursor,
    Reader,
    Step,
    attributes,
    blank,
    until,
)

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


class KimiK3Parser(ToolParser):
    """``<|open|>tools<|sep|><|open|>call tool=…<|sep|>…<|close|>tools<|sep|>``."""

    name = "kimi_k3"
    markers = (TOOLS, *WRAPPERS)
    special = (OPEN, CLOSE, SEP, "<|end_of_msg|>")

    def _read(self, c: Cursor) -> Reader:
        for wrapper in WRAPPERS:
            if c.text.startswith(wrapper, c.pos):
                c.pos += len(wrapper)  # markup, content around it goes on
                return None
        c.pos += len(TOOLS)
        self.commit()
        while True:
            found = yield from until(c, (CALL, TOOLS_END))
            if found < 0:
                return TRUNCATED
            if found == 1:
                return None
            attrs = yield from attributes(c, entities=True, end=SEP)
            name = (attrs or {}).get("tool", "").strip()
            if attrs is None or not valid_name(name):
                if (yield from until(c, (CALL_END, TOOLS_END))) == 1:
                    c.pos -= len(TOOLS_END)
                continue
            yield from self._call(c, name)

    def _call(self, c: Cursor, name: str) -> Step:
        schema: Any = self.tools.get(name, {})
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(props, dict):
            props = {}
        count = 0
        opened = False
        while True:
            found = yield from until(c, (ARGUMENT, JSON_ARGS, CALL_END, TOOLS_END))
            if found < 0:
                return  # cut (a call started stays open: the region's end cuts it)
            if not opened:
                if found == 1:  # the arguments as one JSON object: the call starts at its {
                    if (yield from attributes(c, end=SEP)) is None or not (yield from blank(c)):
                        return
                    if c.text[c.pos] == "{":
                        self.open_call(name)
                        if (yield from self.stream_json(c)):
                            self.close_call()
                        elif not c.final:
                            self.break_call()
                    yield from until(c, (CALL_END,))
                    return
                self.open_call(name)
                opened = True
                self.call_args("{")
            if found >= 2:
                if found == 3:
                    c.pos -= len(TOOLS_END)
                self.call_args("}")
                self.close_call()
                return
            if found == 1:  # a json channel after arguments: not a call this shape has
                if not c.final:
                    self.break_call()
                return
            attrs = yield from attributes(c, entities=True, end=SEP)
            key = (attrs or {}).get("key")
            if attrs is None or key is None:
                if not c.final:
                    self.break_call()
                return
            value = ParamValue(
                key, props, string=attrs.get("type", "string") == "string", json=True,
                null_word=False,
            )  # fmt: skip
            self.call_args(json_key(key, count == 0))
            count += 1
            ends = (ARGUMENT_END, CALL_END, TOOLS_END)
            ended = yield from read_param(self, c, value, ends)
            if ended < 0:
                return
            if ended > 0:
                c.pos -= len(ends[ended])
