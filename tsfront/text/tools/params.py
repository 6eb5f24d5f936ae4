"""Parameter values of the XML-style formats, typed by the tool's JSON schema, written as JSON.

Formats such as ``qwen3_coder``, GLM, MiniMax and DeepSeek's DSML write a call's arguments as
one tagged value per parameter. The JSON of the arguments is built as the values arrive
(:class:`ParamValue`, one per value):

- a parameter whose schema type is a string type (or one the schema does not name, or of a
  tool not in ``tools``) is a JSON string, written as its text arrives, escaped (a trailing
  newline the format trims is held until the value's end says);
- any other value is converted when its end tag comes, by its schema type
  (:func:`convert_parameter`, vLLM's rules for ``qwen3_coder``): integers, numbers,
  booleans, objects and arrays (as JSON, then as a Python literal), else its text.

``null`` (any case) is JSON null for any type in the formats that say so (``null_word``):
such a string value is held while it could still be ``null``.

:func:`read_arguments` reads a call's parameters, tagged as its :class:`ParamTags` say, to the
call's end, and writes its arguments object as they come (the format reads each parameter's
head: its name, and what its attributes say of the value).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from tsfront.text.tools.base import BROKE, CALL, CUT, ToolParser, loads_json
from tsfront.text.tools.jsontext import escape_text, value_text
from tsfront.text.tools.reading import Cursor, until

__all__ = [
    "STRING_TYPES",
    "ParamTags",
    "ParamValue",
    "convert_parameter",
    "is_string_param",
    "json_key",
    "properties",
    "read_arguments",
    "read_param",
    "schema_type",
]

#: The schema types whose values are written as JSON strings.
STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INTS = ("int", "uint", "long", "short", "unsigned")
_NULL = "null"


def schema_type(schema: Any) -> str:
    """The JSON-schema ``type`` of a parameter, lowercased (the first non-null of a list;
    ``"string"`` when there is none)."""
    if not isinstance(schema, Mapping):
        return "string"
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if not isinstance(kind, str):
        return "string"
    return kind.strip().lower()


def is_string_param(name: str, properties: Mapping[str, Any]) -> bool:
    """Whether parameter ``name`` is written as a JSON string: its schema type is a string
    type, or the schema does not name it."""
    return name not in properties or schema_type(properties[name]) in STRING_TYPES


def convert_parameter(value: str, name: str, properties: Mapping[str, Any]) -> Any:
    """Convert parameter ``name``'s text ``value`` by its schema in ``properties``."""
    if value.lower() == _NULL:
        return None
    if name not in properties:
        return value
    kind = schema_type(properties[name])
    if kind in STRING_TYPES:
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


def properties(schema: Any) -> Mapping[str, Any]:
    """A JSON schema's ``properties`` (none: empty)."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return props if isinstance(props, Mapping) else {}


class ParamValue:
    """One parameter's value: its text given in pieces (`add`), its JSON returned in pieces.

    Args:
        name: the parameter.
        properties: the tool's schema ``properties``.
        trim: remove one newline at each end of the value (``qwen3_coder`` writes them).
        null_word: ``null`` (any case) is JSON null whatever the type.
        string: force the kind (``True``: a JSON string; ``False``: converted whole);
            ``None``: by the schema.
        json: a value converted whole is JSON text the model wrote (DeepSeek's
            ``string="false"``, Kimi-K3's typed arguments): read as JSON, else kept as text;
            not converted by the schema.
    """

    __slots__ = ("_first", "_held", "_json", "_kind", "_null", "_open", "_parts", "_props",
                 "_trim", "name")  # fmt: skip

    def __init__(
        self,
        name: str,
        properties: Mapping[str, Any],
        *,
        trim: bool = False,
        null_word: bool = True,
        string: bool | None = None,
        json: bool = False,
    ) -> None:
        self.name = name
        self._json = json
        self._props = properties
        self._kind = is_string_param(name, properties) if string is None else string
        self._trim = trim
        self._null = null_word
        self._first = True  # no character of the value seen yet (a leading newline to trim)
        self._open = False  # the string's opening quote went out
        self._held = ""  # text not written yet: a trailing newline, or a possible "null"
        self._parts: list[str] = []  # a converted value's text

    def add(self, text: str) -> str:
        """The next piece of the value's text; returns the JSON text to send now."""
        if not text:
            return ""
        if self._first:
            self._first = False
            if self._trim and text[0] == "\n":
                text = text[1:]
                if not text:
                    return ""
        if not self._kind:
            self._parts.append(text)
            return ""
        if self._open:
            text = self._held + text
            self._held = ""
        else:
            held = self._held + text
            if self._null and len(held) <= len(_NULL) + 1 and _could_be_null(held):
                self._held = held
                return ""
            self._held = ""
            self._open = True
            text = held
            if self._trim and text.endswith("\n"):
                self._held = "\n"
                text = text[:-1]
            return '"' + escape_text(text)
        if self._trim and text.endswith("\n"):
            self._held = "\n"
            text = text[:-1]
        return escape_text(text)

    def close(self) -> str:
        """The value ended: the JSON text that completes it."""
        if not self._kind:
            text = "".join(self._parts)
            if self._trim and text.endswith("\n"):
                text = text[:-1]
            if self._json:
                try:
                    value: Any = loads_json(text)
                except ValueError:
                    value = text
            else:
                value = convert_parameter(text, self.name, self._props)
            out = value_text(value)  # (a literal's tuples are arrays)
            return out if out is not None else '"' + escape_text(text) + '"'
        if self._open:
            return '"'  # a held trailing newline is the one trimmed
        held = self._held
        if self._trim and held.endswith("\n"):
            held = held[:-1]
        if self._null and held.lower() == _NULL:
            return "null"
        return '"' + escape_text(held) + '"'

    def cut(self) -> str:
        """The output ended inside the value: nothing more is sent (the call is cut: its
        arguments stay as they went out, a prefix of what they would have been)."""
        return ""


def _could_be_null(text: str) -> bool:
    # Whether a string value written so far may still turn out to be the word null
    # (with the trailing newline a trimming format removes).
    low = text.lower()
    return _NULL.startswith(low) or low == _NULL + "\n"


def json_key(name: str, first: bool) -> str:
    """The JSON text of an arguments object's key ``name`` (after a comma unless
    ``first``)."""
    return ("" if first else ",") + '"' + escape_text(name) + '":'


def read_param(
    parser: ToolParser, c: Cursor, value: ParamValue, ends: tuple[str, ...]
) -> Generator[None, None, int]:
    """Read a value's text up to the first of ``ends``, written to the open call's arguments
    as it arrives; return the index of the end found, or -1 when the output ended inside the
    value (what could be sent of it was). ``ends[0]``, the value's close tag, is consumed;
    another end (a tag that ends a value left open) is left for the caller to read."""

    def take(piece: str) -> None:
        parser.call_args(value.add(piece))

    found = yield from until(c, ends, take)
    parser.call_args(value.close() if found >= 0 else value.cut())
    if found > 0:
        c.pos -= len(ends[found])
    return found


@dataclass(frozen=True, slots=True)
class ParamTags:
    """How a format tags a call's parameters, for :func:`read_arguments`.

    In each tuple the first tag is consumed when it comes and the others are left unread
    (what follows reads them).

    Args:
        parameter: the tag that opens a parameter (its head follows: a name, attributes).
        value_ends: what ends a value: its close tag, then the tags that end a value left
            open (the next parameter's, the call's end).
        call_ends: what ends the arguments: the call's close tag, then the tags that end a
            call left open (its block's end).
        breaks: tags that break a call whose arguments began (a shape the format does not
            mix with tagged parameters).
    """

    parameter: str
    value_ends: tuple[str, ...]
    call_ends: tuple[str, ...]
    breaks: tuple[str, ...] = ()


Head = Callable[[Cursor, Mapping[str, Any]], Generator[None, None, ParamValue | None]]
"""A format's reader of a parameter's head (after its tag): the value it opens, typed by the
tool's ``properties``; ``None`` when the head is no parameter's."""


def read_arguments(
    parser: ToolParser, c: Cursor, name: str, tags: ParamTags, head: Head
) -> Generator[None, None, int]:
    """Call ``name``, whose tagged parameters start at ``c.pos``: its start goes out at once,
    then its arguments object as the parameters arrive, to the call's end. Returns `CALL`
    (it ended), `BROKE` (a parameter's head that is none, or a tag of ``tags.breaks``: the
    call stays as it went out, in `ToolParser.broken`) or `CUT` (the output ended first:
    the call stays open, the region's end cuts it)."""
    props = properties(parser.tools.get(name))
    parser.open_call(name)
    parser.call_args("{")
    first = True
    marks = (tags.parameter, *tags.call_ends, *tags.breaks)
    last_end = len(tags.call_ends)
    while True:
        found = yield from until(c, marks)
        if found < 0:
            return CUT
        if found == 0:
            value = yield from head(c, props)
            if value is not None:
                parser.call_args(json_key(value.name, first))
                first = False
                if (yield from read_param(parser, c, value, tags.value_ends)) < 0:
                    return CUT
                continue
        elif found <= last_end:
            if found > 1:
                c.pos -= len(marks[found])
            parser.call_args("}")
            parser.close_call()
            return CALL
        if c.final:
            return CUT
        parser.break_call()
        return BROKE
