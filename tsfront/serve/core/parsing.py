"""One choice's text split into reasoning, content and tool calls, streamed.

`OutputParser` chains the two parsers of `tsfront.text`: the reasoning parser (if the server
has ``--reasoning-parser``) splits ``<think>…</think>`` off, and what it calls content goes
to the tool parser (if the request has tools to parse), so a call after ``</think>`` is
parsed. Each `~OutputParser.feed` returns the `Pieces` now known; a non-streamed response is
the same parser fed the whole text at once (`~OutputParser.whole`), so a streamed and a
non-streamed response of one output always agree.

Two rules of the server's own, on top of the parsers':

- *Blank content is held*: while all content so far is blank, it is held back; the next
  non-blank content takes it along. A call (or the end, after reasoning or a call) drops
  it. So ``content`` is ``null`` rather than ``"\\n\\n"`` before a call or after a thought,
  streamed or not.
- ``parallel_tool_calls: false`` keeps the first call only.
- *Markers skipped as special tokens stay out of content*: the detokenizer hands the parsers
  their markers even when the request skips special tokens (``keep``); one the parsers did not
  consume as markup (``<|python_tag|>`` before no call) is dropped from the content, as
  ``skip_special_tokens`` says (`hide`).

It also counts the thought's tokens (``usage.output_tokens_details.reasoning_tokens``) from
the engine's tokens, as they arrive, instead of encoding the thought again: each delta is fed
with the number of tokens it came from; a delta inside the section (or opening it) counts
whole, and the delta that closes it counts the share of its characters up to the end of the
close tag (exact when it is one token, as a stream's deltas are unless a slow reader made the
stream coalesce them).

Blank content held back is kept as the deltas it came in and joined once, so a long run of it
costs time linear in its length. The parsers never raise on any output (tsfront.text's rule);
`tsfront.serve.core.service` still runs this step inside one boundary that turns an exception into a
clean error (``_unparseable``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from tsfront.text.tools import CallArgs, CallStart, Content

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tsfront.text.harmony import HarmonyParser
    from tsfront.text.reasoning import ReasoningParser
    from tsfront.text.tools import Delta, ToolParser

__all__ = ["OutputParser", "Pieces"]


class Pieces:
    """What one delta of output turned into: reasoning text, content text, call deltas."""

    __slots__ = ("calls", "content", "reasoning")

    def __init__(self, reasoning: str = "", content: str = "", calls: list[Delta] | None = None):
        self.reasoning = reasoning
        self.content = content
        #: `CallStart` and `CallArgs` deltas, in order.
        self.calls: list[Delta] = calls if calls is not None else []

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


class OutputParser:
    """The reasoning and tool parsers of one choice (either may be ``None``).

    Args:
        reasoning: a fresh `tsfront.text.reasoning.ReasoningParser`, or ``None``.
        tools: a fresh `tsfront.text.tools.ToolParser`, or ``None``.
        parallel: ``False`` keeps only the first call (``parallel_tool_calls: false``).
        harmony: gpt-oss's parser (`tsfront.text.harmony.HarmonyParser`) instead of the two:
            it reads the engine's token ids (`feed`'s ``ids``), not the text.
    """

    __slots__ = (
        "_blank",
        "_calls",
        "_content",
        "_harmony",
        "_hidden",
        "_parallel",
        "_reasoning",
        "_thought",
        "_tools",
        "has_reasoning",
        "reasoning_tokens",
    )

    def __init__(
        self,
        reasoning: ReasoningParser | None,
        tools: ToolParser | None,
        parallel: bool = True,
        *,
        harmony: HarmonyParser | None = None,
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._parallel = parallel
        self._harmony = harmony
        #: Whether the response reports ``reasoning_content`` (a reasoning parser runs).
        self.has_reasoning = reasoning is not None or harmony is not None
        self._blank: list[str] = []  # blank content held back, as it came
        self._content: list[str] = []  # all content given out (for `whole`)
        self._thought: list[str] = []
        self._calls: dict[int, list[Any]] = {}  # index -> [id, name, argument parts]
        #: The engine tokens of the reasoning section so far (deltas fed with their count).
        self.reasoning_tokens = 0
        self._hidden: re.Pattern[str] | None = None  # `hide`

    def hide(self, markers: tuple[str, ...]) -> OutputParser:
        """Drop these texts (special tokens the request skips, decoded for the parsers) from
        the content; returns the parser."""
        if markers:
            self._hidden = re.compile("|".join(map(re.escape, markers)))
        return self

    @property
    def called(self) -> bool:
        """Whether a call was parsed (``finish_reason: "tool_calls"`` if the engine stopped)."""
        return bool(self._calls)

    def feed(self, text: str, tokens: int = 0, ids: Sequence[int] = ()) -> Pieces:
        """The pieces of the next delta of text (``tokens``: how many engine tokens made it,
        for `reasoning_tokens`; ``ids``: those tokens, which Harmony reads instead of text)."""
        harmony = self._harmony
        if harmony is not None:
            thought, calls = harmony.feed(ids)
            self.reasoning_tokens = harmony.reasoning_tokens
            return self._pieces(thought, "", calls, final=False)
        reasoning_parser = self._reasoning
        if reasoning_parser is not None:
            inside = reasoning_parser.in_reasoning
            reasoning, rest = reasoning_parser.feed(text)
            if tokens and (inside or reasoning or reasoning_parser.in_reasoning):
                if reasoning_parser.in_reasoning or not text:
                    self.reasoning_tokens += tokens
                else:  # the section closed in this delta: ``rest`` is what follows the tag
                    share = tokens * (len(text) - len(rest)) / len(text)
                    self.reasoning_tokens += max(1, round(share))
            text = rest
        else:
            reasoning = ""
        tools = self._tools
        deltas = tools.feed(text) if tools is not None and text else None
        return self._pieces(reasoning, text, deltas, final=False)

    def finish(self, length: bool = False) -> Pieces:
        """What was held back, at the end (``length``: the engine stopped at ``max_tokens``)."""
        if self._harmony is not None:
            thought, calls = self._harmony.finish(length)
            return self._pieces(thought, "", calls, final=True)
        reasoning = content = ""
        if self._reasoning is not None:
            reasoning, content = self._reasoning.finish()
        tools = self._tools
        if tools is None:
            return self._pieces(reasoning, content, None, final=True)
        deltas = tools.feed(content) if content else []
        deltas.extend(tools.finish(length=length))
        return self._pieces(reasoning, content, deltas, final=True)

    def _pieces(self, reasoning: str, text: str, deltas: list[Delta] | None, final: bool) -> Pieces:
        out = Pieces(reasoning)
        if reasoning:
            self._thought.append(reasoning)
        if deltas is None:
            self._add_content(out, text)
        else:
            for delta in deltas:
                if type(delta) is Content:
                    self._add_content(out, delta.text)
                elif type(delta) is CallStart:
                    if delta.index and not self._parallel:
                        continue
                    self._blank.clear()  # blanks before a call are not content
                    self._calls[delta.index] = [delta.id, delta.name, []]
                    out.calls.append(delta)
                elif type(delta) is CallArgs:
                    call = self._calls.get(delta.index)
                    if call is not None:
                        call[2].append(delta.text)
                        out.calls.append(delta)
        if final and self._blank and not (self._calls or self._thought):
            # Only blanks and nothing else at all: that is the answer.
            blank = "".join(self._blank)
            self._blank.clear()
            out.content += blank
            self._content.append(blank)
        return out

    def _add_content(self, out: Pieces, text: str) -> None:
        if self._hidden is not None and text:
            # (A marker is one token: its text arrives whole in one delta.)
            text = self._hidden.sub("", text)
        if not text:
            return
        if not self._content and text.isspace():
            self._blank.append(text)
            return
        if self._blank:
            self._blank.append(text)
            text = "".join(self._blank)
            self._blank.clear()
        self._content.append(text)
        out.content += text

    def whole(self, text: str, length: bool = False) -> None:
        """Parse a whole output (a non-streamed response); read the result from `message`."""
        self.feed(text)
        self.finish(length)

    def message(self) -> dict[str, Any]:
        """The ``message`` of a non-streamed response from everything parsed so far.

        ``content`` is ``null`` when it is empty and there were calls or reasoning;
        ``reasoning_content`` is there when a reasoning parser runs (``null`` if none);
        ``tool_calls`` when a call was parsed.
        """
        content: str | None = "".join(self._content)
        if not content and (self._calls or self._thought):
            content = None
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.has_reasoning:
            message["reasoning_content"] = "".join(self._thought) or None
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": "".join(parts)},
                }
                for call_id, name, parts in (self._calls[i] for i in sorted(self._calls))
            ]
        return message
