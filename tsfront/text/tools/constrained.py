"""Tool calls under constrained decoding: the engine schemas and parsing their output back.

With ``tool_choice: "required"`` the engine is given :func:`required_schema` (vLLM's form: an
array of ``{"name": NAME, "parameters": {…}}`` objects, one ``anyOf`` branch per tool,
``"maxItems": 1`` when ``parallel_tool_calls`` is false); with a named tool
(``{"type": "function", "function": {"name": …}}``) it is given that function's
``parameters`` schema itself (:func:`named_schema`). The output is then JSON and no tool
markup: :class:`RequiredToolParser` and :class:`NamedToolParser` are tool parsers over it, with
the same streaming interface and rules as the format parsers (arguments stream as canonical
JSON text; the named tool's call starts with the output's first ``{``). ``tool_choice:
"auto"`` is not constrained: it uses the format parser.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from tsfront.text.tools.base import CUT, NOT, Parsed, ToolCallError, ToolParser, tool_parameters
from tsfront.text.tools.hermes import read_call_list
from tsfront.text.tools.reading import TRUNCATED, Cursor, NoCall, Reader, blank

__all__ = [
    "NamedToolParser",
    "RequiredToolParser",
    "named_schema",
    "parse_named",
    "parse_required",
    "required_schema",
]

_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def _parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(dict(params)) if params else dict(_EMPTY_OBJECT)


def required_schema(
    tools: Sequence[Mapping[str, Any]], parallel_tool_calls: bool = True
) -> dict[str, Any]:
    """The engine ``json_schema`` for ``tool_choice: "required"``.

    Raises :class:`ToolCallError` when ``tools`` names no function.
    """
    params = tool_parameters(tools)
    if not params:
        raise ToolCallError("tool_choice 'required' needs at least one function in 'tools'")
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [name]},
                        "parameters": _parameters(p),
                    },
                    "required": ["name", "parameters"],
                }
                for name, p in params.items()
            ],
        },
    }
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    return schema


def named_schema(tools: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    """The engine ``json_schema`` for a named tool: its ``parameters`` (an empty object's
    schema when it has none). Raises :class:`ToolCallError` when ``tools`` has no ``name``."""
    params = tool_parameters(tools)
    if name not in params:
        raise ToolCallError(f"tool_choice names function {name!r}, which 'tools' does not define")
    return _parameters(params[name])


class RequiredToolParser(ToolParser):
    """The output of :func:`required_schema`: ``[{"name": …, "parameters": {…}}, …]``."""

    name = "required"
    leading = "["

    def _read(self, c: Cursor) -> Reader:
        got = yield from read_call_list(self, c, ("parameters", "arguments"))
        if got == CUT:
            return TRUNCATED
        return NoCall(c.offset) if got == NOT else None


class NamedToolParser(ToolParser):
    """The output of :func:`named_schema`: the arguments object of function ``function``."""

    name = "named"
    leading = "{"

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None, function: str) -> None:
        super().__init__(tools)
        self.function = function

    def _spawn(self) -> ToolParser:
        return NamedToolParser(self.tools_given, self.function)

    def _read(self, c: Cursor) -> Reader:
        if not (yield from blank(c)):
            return TRUNCATED
        if c.text[c.pos] != "{":
            return NoCall(c.offset + 1)
        yield from self.stream_call(c, self.function)
        return None


def parse_required(text: str) -> Parsed:
    """The calls of a whole ``tool_choice: "required"`` output."""
    return RequiredToolParser(None).parse(text)


def parse_named(function: str, text: str) -> Parsed:
    """The call of a whole named-tool output."""
    return NamedToolParser(None, function).parse(text)
