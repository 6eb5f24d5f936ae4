"""``deepseek_v3`` and ``deepseek_v31``: DeepSeek-V3 / R1-0528 and DeepSeek-V3.1 tool calls.

DeepSeek-V3 (and R1-0528) wrap every call's arguments in a fenced JSON block::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁call▁begin｜>…<｜tool▁call▁end｜><｜tool▁calls▁end｜>

DeepSeek-V3.1 drops the type and the fence::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>

(one line in the output).

(The bars are U+FF5C, the blanks U+2581, as in DeepSeek's tokenizer.) Each call is emitted at
its ``<｜tool▁call▁end｜>``; an output that ends after ``<｜tool▁calls▁begin｜>`` without
``<｜tool▁calls▁end｜>`` is truncated (:attr:`incomplete`), even after complete calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tsfront.text.tools.base import Take, ToolParser, canonical_arguments, loads_json

__all__ = ["DeepSeekV3Parser", "DeepSeekV31Parser"]

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


def _args(text: str) -> str | None:
    try:
        return canonical_arguments(loads_json(text.strip()) if text.strip() else {})
    except ValueError:
        return None


class DeepSeekV3Parser(ToolParser):
    """``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```<｜tool▁call▁end｜>``."""

    name = "deepseek_v3"
    markers = (CALLS_BEGIN, CALL_BEGIN, CALLS_END)

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._open = False

    def _take(self, buf: str, final: bool) -> Take:
        if buf.startswith(CALLS_BEGIN):
            self._open = True
            return len(CALLS_BEGIN), []
        if buf.startswith(CALLS_END):
            self._open = False
            return len(CALLS_END), []
        end = self.find_resumed(buf, CALL_END, len(CALL_BEGIN))
        if end < 0:
            return None
        call = self._call(buf[len(CALL_BEGIN) : end])
        return end + len(CALL_END), None if call is None else [call]

    def _unclosed(self) -> bool:
        return self._open

    def _call(self, body: str) -> tuple[str, str] | None:
        _kind, sep, rest = body.partition(SEP)
        if not sep:
            return None
        name, _, args = rest.partition("\n")
        args = args.strip()
        if args.startswith("```json"):
            args = args[len("```json") :]
        elif args.startswith("```"):
            args = args[3:]
        if args.endswith("```"):
            args = args[:-3]
        text = _args(args)
        return None if text is None or not name.strip() else (name.strip(), text)


class DeepSeekV31Parser(DeepSeekV3Parser):
    """``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>``."""

    name = "deepseek_v31"

    def _call(self, body: str) -> tuple[str, str] | None:
        name, sep, args = body.partition(SEP)
        if not sep or not name.strip():
            return None
        text = _args(args)
        return None if text is None else (name.strip(), text)
