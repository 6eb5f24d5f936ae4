"""``qwen3_coder``: Qwen3-Coder's XML-like tool calls.

::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Parameter values are text; one leading and one trailing newline are removed, and the value is
converted by the type the tool's JSON schema gives the parameter, as vLLM's ``qwen3_coder``
parser does: ``null`` is null for any type; string types stay text; integer types
(``int…``, ``uint…``, ``long``, ``short``, ``unsigned``) become ints and number types
(``num…``, ``float…``) numbers (integral values as ints), text that does not convert stays
text; booleans are ``true`` when the text is ``true`` (any case), else false; objects and
arrays are parsed as JSON, then as Python literals, else kept as text. A parameter the schema
does not name (or a tool not in ``tools``) stays text. A missing ``</parameter>`` ends at the
next ``<parameter=`` or ``</function>``. Several ``<function=…>`` in one block are several
calls; a ``<function=…>…</function>`` without ``<tool_call>`` around it is a call too.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from tsfront.text.tools.base import Take, ToolParser, canonical_arguments, loads_json

__all__ = ["Qwen3CoderParser", "convert_parameter"]

START = "<tool_call>"
END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"

# A name stops at "<" too: a name never holds one, and a search that tried each of many
# "<function=" without ">" would otherwise read to the end of the line from each (quadratic).
_FUNCTION_RE = re.compile(r"<function=([^<>\n]*)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAM_RE = re.compile(
    r"<parameter=([^<>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|\Z)", re.DOTALL
)
_STRINGS = ("string", "str", "text", "varchar", "char", "enum")
_INTS = ("int", "uint", "long", "short", "unsigned")


def _schema_type(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "string"
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if not isinstance(kind, str):
        return "string"
    return kind.strip().lower()


def convert_parameter(value: str, name: str, properties: dict[str, Any]) -> Any:
    """Convert parameter ``name``'s text ``value`` by its schema in ``properties``."""
    if value.lower() == "null":
        return None
    if name not in properties:
        return value
    kind = _schema_type(properties[name])
    if kind in _STRINGS:
        return value
    if kind.startswith(_INTS):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        if number != number or number in (float("inf"), float("-inf")):
            return value
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return loads_json(value)
        except ValueError:
            pass
    try:
        literal = ast.literal_eval(value)
        json.dumps(literal, allow_nan=False)
        return literal
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return value


class Qwen3CoderParser(ToolParser):
    """``<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>``."""

    name = "qwen3_coder"
    markers = (START, FUNCTION)

    def _take(self, buf: str, final: bool) -> Take:
        if buf.startswith(START):
            end = self.find_resumed(buf, END, len(START))
            if end >= 0:
                return end + len(END), self._calls(buf[len(START) : end])
            # Ended without </tool_call>: a call only if its function was closed.
            if final and FUNCTION_END in buf:
                return len(buf), self._calls(buf[len(START) :])
            return None
        end = self.find_resumed(buf, FUNCTION_END, 0)
        if end < 0:
            return None
        return end + len(FUNCTION_END), self._calls(buf[: end + len(FUNCTION_END)])

    def _calls(self, body: str) -> list[tuple[str, str]] | None:
        calls: list[tuple[str, str]] = []
        for fn in _FUNCTION_RE.finditer(body):
            name = fn.group(1).strip()
            if not name:
                return None
            schema = self.tools.get(name, {})
            properties = schema.get("properties") if isinstance(schema, dict) else None
            if not isinstance(properties, dict):
                properties = {}
            args: dict[str, Any] = {}
            for param in _PARAM_RE.finditer(fn.group(2)):
                key = param.group(1).strip()
                value = param.group(2)
                if value.startswith("\n"):
                    value = value[1:]
                if value.endswith("\n"):
                    value = value[:-1]
                args[key] = convert_parameter(value, key, properties)
            text = canonical_arguments(args)
            if text is None:
                return None
            calls.append((name, text))
        return calls or None
