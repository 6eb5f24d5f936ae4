"""A block of invocations: the reader that MiniMax's, DeepSeek's DSML and Kimi-K3's formats share.

These formats hold a turn's calls in one block, each call an element whose attribute names
the function, its parameters elements inside it::

    START
    INVOKE name="get_weather">
    PARAMETER name="city">Paris PARAMETER_END
    INVOKE_END
    END

(MiniMax-M2: ``<minimax:tool_call>``, ``<invoke``, ``<parameter``; DeepSeek's DSML: the same
tags with its DSML token; MiniMax-M3: each tag after its namespace token, its parameters
elements named after them; Kimi-K3: channels, ``<|open|>call tool="…"<|sep|>``.) The block is
one region, the format's call section from its start: text in it between invocations is
dropped, an invocation without a name is dropped, and an output that ends inside the block is
truncated (:attr:`~tsfront.text.tools.base.ToolParser.incomplete`). Each invocation is a call,
starting at the end of its opening tag; its parameters are tagged values
(:func:`~tsfront.text.tools.params.read_arguments`) unless the format reads them otherwise.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any, ClassVar

from tsfront.text.tools.base import ToolParser, valid_name
from tsfront.text.tools.params import ParamTags, ParamValue, read_arguments
from tsfront.text.tools.reading import TRUNCATED, Cursor, Reader, Step, attributes, until

__all__ = ["InvocationBlockParser"]


class InvocationBlockParser(ToolParser):
    """Formats whose calls are the invocations of one block (see the module doc).

    A format sets the tags (``block_start``, ``block_end``, ``invoke``, ``invoke_end``,
    ``params``), how an opening tag's attributes are written (``attribute_end``: what ends
    them; ``entities``: values escape as XML's do), the attributes that name the function
    (``name_attribute``) and a parameter (``key_attribute``), and :meth:`_value`; or reads an
    invocation its own way (:meth:`_invoke`).
    """

    block_start: ClassVar[str] = ""
    block_end: ClassVar[str] = ""
    invoke: ClassVar[str] = ""
    invoke_end: ClassVar[str] = ""
    params: ClassVar[ParamTags]
    attribute_end: ClassVar[str] = ">"
    entities: ClassVar[bool] = False
    name_attribute: ClassVar[str] = "name"
    key_attribute: ClassVar[str] = "name"

    def _read(self, c: Cursor) -> Reader:
        c.pos += len(self.block_start)
        self.commit()
        close = self.block_end
        while True:
            found = yield from until(c, (self.invoke, close))
            if found < 0:
                return TRUNCATED
            if found == 1:
                return None
            attrs = yield from attributes(c, self.entities, self.attribute_end)
            name = (attrs or {}).get(self.name_attribute, "").strip()
            if attrs is None or not valid_name(name):
                if (yield from until(c, (self.invoke_end, close))) == 1:
                    c.pos -= len(close)
                continue
            yield from self._invoke(c, name)

    def _invoke(self, c: Cursor, name: str) -> Step:
        """The invocation of ``name`` after its opening tag, to its end (or the block's)."""
        yield from read_arguments(self, c, name, self.params, self.read_parameter)

    def read_parameter(
        self, c: Cursor, props: Mapping[str, Any]
    ) -> Generator[None, None, ParamValue | None]:
        """A parameter's head: its attributes, up to and past the tag's end."""
        attrs = yield from attributes(c, self.entities, self.attribute_end)
        key = (attrs or {}).get(self.key_attribute)
        if attrs is None or key is None:
            return None
        return self._value(key, props, attrs)

    def _value(self, key: str, props: Mapping[str, Any], attrs: Mapping[str, str]) -> ParamValue:
        """The value parameter ``key`` opens (``attrs``: its tag's attributes)."""
        raise NotImplementedError
