"""``minimax_m3``: MiniMax-M3's namespaced XML tool calls.

MiniMax-M3's chat template prefixes every tag of a call block with its namespace token
``]<]minimax[>[`` (one special token) and writes each parameter as an element named after it;
an object's members are elements too, an array's items ``<item>`` elements::

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="get_weather">
    ]<]minimax[>[<city>Paris]<]minimax[>[</city>
    ]<]minimax[>[<filters>]<]minimax[>[<a>1]<]minimax[>[</a>]<]minimax[>[</filters>
    ]<]minimax[>[<tags>]<]minimax[>[<item>x]<]minimax[>[</item>]<]minimax[>[</tags>
    ]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

The tool's schema says how an element reads: an object with ``properties`` as members, an
array as items, a string (or a parameter the schema does not name) as its text (streamed as a
JSON string), anything else converted when its element ends (JSON; else its text). Each
``invoke`` is a call, starting at its ``>``. The block is one region: an invocation without a
name is dropped, an output that ends inside the block is truncated (:attr:`incomplete`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from tsfront.text.tools.invocations import InvocationBlockParser
from tsfront.text.tools.params import (
    STRING_TYPES,
    ParamValue,
    json_key,
    properties,
    read_param,
    schema_type,
)
from tsfront.text.tools.reading import Cursor, Step, literal, tag_name, until

__all__ = ["MinimaxM3Parser"]

NS = "]<]minimax[>["
START = f"{NS}<tool_call>"
END = f"{NS}</tool_call>"
INVOKE = f"{NS}<invoke"
INVOKE_END = f"{NS}</invoke>"
# What ends the name of a tag whose "<" (or "</") was read: its ">"; the namespace token
# of the next tag first is a tag out of place.
TAG_ENDS = (">", NS)


class MinimaxM3Parser(InvocationBlockParser):
    """``]<]minimax[>[<tool_call>]<]minimax[>[<invoke name=…>…``."""

    name = "minimax_m3"
    markers = (START,)
    special = (NS, "<tool_call>", "</tool_call>")
    block_start, block_end, invoke, invoke_end = START, END, INVOKE, INVOKE_END

    def _invoke(self, c: Cursor, name: str) -> Step:
        schema: Any = self.tools.get(name, {})
        self.open_call(name)
        ok = yield from self._members(c, schema if isinstance(schema, Mapping) else {})
        if ok:
            self.close_call()
        elif not c.final:
            self.break_call()
            yield from until(c, (INVOKE_END,))

    def _members(
        self, c: Cursor, schema: Mapping[str, Any], first: str | None = None, nested: bool = False
    ) -> Generator[None, None, bool]:
        """An object's elements up to the close tag that ends it (``first``: the first
        element's name, already read; ``nested``: inside a parameter); ``True`` when it
        ended."""
        props = properties(schema)
        self.call_args("{")
        count = 0
        key = first
        while True:
            if key is None:
                if (yield from until(c, (NS,))) < 0:
                    return False
                if (yield from literal(c, "</")):
                    if (yield from tag_name(c, TAG_ENDS)) is None:
                        return False
                    self.call_args("}")
                    return True
                if not (yield from literal(c, "<")):
                    return False
                key = yield from tag_name(c, TAG_ENDS)
                if not key:
                    return False
            self.call_args(json_key(key, count == 0))
            count += 1
            prop = props.get(key)
            if not (yield from self._element(c, key, prop, {key: prop}, nested)):
                return False
            key = None

    def _items(self, c: Cursor, schema: Any, first: bool = False) -> Generator[None, None, bool]:
        """An array's ``<item>`` elements up to the close tag that ends it (``first``: the
        first item's tag was read); ``True`` when it ended."""
        self.call_args("[")
        count = 0
        while True:
            if not first:
                if (yield from until(c, (NS,))) < 0:
                    return False
                if (yield from literal(c, "</")):
                    if (yield from tag_name(c, TAG_ENDS)) is None:
                        return False
                    self.call_args("]")
                    return True
                if not (yield from literal(c, "<")) or (yield from tag_name(c, TAG_ENDS)) != "item":
                    return False
            first = False
            if count:
                self.call_args(",")
            count += 1
            if not (yield from self._element(c, "item", schema, {"item": schema}, True)):
                return False

    def _element(
        self, c: Cursor, key: str, schema: Any, props: Mapping[str, Any], nested: bool = False
    ) -> Generator[None, None, bool]:
        """The element ``key``'s value, read to its close tag (consumed) and written as JSON;
        ``True`` when it ended. A parameter the schema does not name is text; an element
        inside one whose schema says nothing of it is JSON if it reads as JSON (the template
        writes numbers, booleans and null bare), else text."""
        kind = schema_type(schema) if isinstance(schema, Mapping) else None
        close = f"{NS}</{key}>"
        if kind in STRING_TYPES or kind not in (None, "object", "array"):
            # A string streams; a number, boolean, null is converted when it ends.
            value = ParamValue(key, props, string=kind in STRING_TYPES, null_word=False)
            return (yield from read_param(self, c, value, (close,))) == 0
        # An object, an array, or a parameter the schema does not name: the template writes
        # a mapping's members and a list's items as elements, the rest as text.
        if (yield from literal(c, NS)):
            if (yield from literal(c, "</")):
                if (yield from tag_name(c, TAG_ENDS)) is None:
                    return False
                self.call_args("[]" if kind == "array" else '""' if kind is None else "{}")
                return True
            if not (yield from literal(c, "<")):
                return False
            child = yield from tag_name(c, TAG_ENDS)
            if not child:
                return False
            spec = schema if isinstance(schema, Mapping) else {}
            if child == "item":
                return (yield from self._items(c, spec.get("items"), first=True))
            return (yield from self._members(c, spec, child, nested=True))
        if kind is None and nested:
            value = ParamValue(key, props, string=False, json=True, null_word=False)
        else:
            value = ParamValue(key, props, string=kind is None, null_word=False)
        return (yield from read_param(self, c, value, (close,))) == 0
