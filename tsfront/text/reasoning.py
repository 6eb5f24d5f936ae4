"""Reasoning sections split from the streamed text: ``<think>…</think>`` → ``reasoning_content``.

A :class:`ReasoningParser` sits between the detokenizer and the tool parser (if any); each
:meth:`~ReasoningParser.feed` returns ``(reasoning text, content text)``, and the content part
is what a tool parser is fed next, so a call after ``</think>`` is parsed::

    reasoning = make_reasoning_parser("deepseek_r1",
                                      starts_in_reasoning=starts_in_reasoning(prompt))
    for text in stream:
        thought, text = reasoning.feed(text)
        deltas = tools.feed(text)          # or, without tools, text is the content
    thought, text = reasoning.finish()

Parsers (the tags are the same, ``<think>`` and ``</think>``):

- ``deepseek_r1``: DeepSeek-R1 and its distills, QwQ. The output may open the section itself
  (``<think>`` as its first non-blank text) or start inside it when the chat template put
  ``<think>`` at the end of the prompt (``starts_in_reasoning``; :func:`starts_in_reasoning`
  decides it from the rendered prompt). Without ``</think>`` everything after the open is
  reasoning (a truncated thought).
- ``qwen3``: Qwen3 (thinking and hybrid). The same, and ``enable_thinking=False`` (from the
  request's ``chat_template_kwargs``) means the template already closed the section in the
  prompt: the whole output is content.

The section is the first one only: after ``</think>`` everything is content, a later
``<think>`` included. Text that could be the start of a tag is held back, so a tag split across
deltas never shows in either field; blank text before an opening ``<think>`` is dropped, and so
is a bare ``</think>`` the output starts with (a turn without reasoning). The other families
(:data:`FAMILIES`: DeepSeek-V4, GLM, Kimi-K2, MiniMax, Nemotron, LongCat) follow the same
rules with their tags (DeepSeek-V3.1 and V3.2 take ``deepseek_r1``: the same tags and rules).

Cost: linear in the output, whatever it is. What is held back is at most a tag's length but
for the blanks before the output opens (or not) its section: those are kept as the deltas they
came in, never joined or re-read per delta.
"""

from __future__ import annotations

__all__ = [
    "REASONING_PARSERS",
    "ReasoningParser",
    "make_reasoning_parser",
    "starts_in_reasoning",
]

START = "<think>"
END = "</think>"

# States: a table of what each one does is in ReasoningParser.feed.
_BEFORE = 0  # nothing but blanks yet: the output may open the section
_REASONING = 1  # inside the section: text is reasoning until END
_CONTENT = 2  # after the section (or none): text is content


def starts_in_reasoning(prompt: str, start: str = START) -> bool:
    """Whether the rendered ``prompt`` leaves the output inside a reasoning section: its
    last non-blank text is the open tag (DeepSeek-R1's and QwQ's templates end the
    generation prompt with ``<think>\\n``)."""
    return prompt.rstrip().endswith(start)


def _held(buf: str, tag: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``tag``."""
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if tag.startswith(buf[-k:]):
            return k
    return 0


class ReasoningParser:
    """Splits one stream into reasoning and content at ``start``/``end`` tags.

    Args:
        starts_in_reasoning: the prompt opened the section (the output has only the end tag).
        enabled: ``False`` when the template disabled thinking: everything is content.
    """

    name = "deepseek_r1"
    start = START
    end = END
    #: Its tags, which a tokenizer may hold as special tokens (the server's detokenizer hands
    #: them to the parser whatever ``skip_special_tokens`` says).
    special: tuple[str, ...] = (START, END)

    __slots__ = ("_blanks", "_buf", "_initial", "_state")

    def __init__(self, *, starts_in_reasoning: bool = False, enabled: bool = True) -> None:
        if not enabled:
            self._state = _CONTENT
        else:
            self._state = _REASONING if starts_in_reasoning else _BEFORE
        self._initial = self._state
        self._buf = ""
        # _BEFORE: the blank deltas before anything else (content if no section opens).
        self._blanks: list[str] = []

    @classmethod
    def prompt_opens(cls, prompt: str) -> bool:
        """Whether the rendered ``prompt`` leaves the output inside this format's section
        (:func:`starts_in_reasoning` with its open tag)."""
        return starts_in_reasoning(prompt, cls.start)

    @property
    def in_reasoning(self) -> bool:
        """Whether the stream is inside the reasoning section right now."""
        return self._state == _REASONING

    def feed(self, text: str) -> tuple[str, str]:
        """Add the next delta; return ``(reasoning, content)`` now known."""
        state = self._state
        if state == _CONTENT:
            return "", text
        if state == _REASONING and not self._buf and self.end[0] not in text:
            return text, ""
        if state == _BEFORE and not self._buf and text.isspace():
            self._blanks.append(text)
            return "", ""
        self._buf += text
        return self._advance(False)

    def finish(self) -> tuple[str, str]:
        """At the end of the stream: the held-back text, in the field it belongs to."""
        if self._blanks and not self._buf:
            # Only blanks: the output's content.
            return "", self._take_blanks("")
        return self._advance(True)

    def _take_blanks(self, text: str) -> str:
        """The blanks held before ``text``, joined once, then ``text``."""
        if not self._blanks:
            return text
        self._blanks.append(text)
        joined = "".join(self._blanks)
        self._blanks.clear()
        return joined

    def _advance(self, final: bool) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        buf = self._buf
        while buf:
            if self._state == _BEFORE:
                # buf: from the first delta with a non-blank on (the blanks before it are in
                # _blanks), so at most that delta and a tag's length.
                stripped = buf.lstrip()
                if stripped.startswith(self.start):
                    buf = stripped[len(self.start) :]
                    self._blanks.clear()
                    self._state = _REASONING
                    continue
                if stripped.startswith(self.end):
                    # A bare close tag first: a turn without reasoning (MiniMax-M3 writes
                    # one when thinking is off).
                    buf = stripped[len(self.end) :]
                    self._blanks.clear()
                    self._state = _CONTENT
                    continue
                if stripped and (
                    final or not (self.start.startswith(stripped) or self.end.startswith(stripped))
                ):
                    self._state = _CONTENT
                    buf = self._take_blanks(buf)
                    continue
                if final:
                    content.append(self._take_blanks(buf))
                    buf = ""
                break
            if self._state == _REASONING:
                i = buf.find(self.end)
                if i >= 0:
                    reasoning.append(buf[:i])
                    buf = buf[i + len(self.end) :]
                    self._state = _CONTENT
                    continue
                keep = 0 if final else _held(buf, self.end)
                reasoning.append(buf[: len(buf) - keep])
                buf = buf[len(buf) - keep :]
                break
            content.append(buf)
            buf = ""
        self._buf = buf
        return "".join(reasoning), "".join(content)

    def parse(self, text: str) -> tuple[str, str]:
        """The non-streamed split of a whole output (a fresh parser fed ``text`` at once)."""
        fresh = type(self)(
            starts_in_reasoning=self._initial == _REASONING, enabled=self._initial != _CONTENT
        )
        r1, c1 = fresh.feed(text)
        r2, c2 = fresh.finish()
        return r1 + r2, c1 + c2


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3: ``<think>…</think>``; ``enabled=False`` for ``enable_thinking: false``."""

    name = "qwen3"
    __slots__ = ()


# The other families whose reasoning is one tagged section first, as DeepSeek-R1's: (name,
# open tag, close tag, the models). Each one's chat template opens the section in the
# prompt when thinking is on (the output then has only the close tag: `prompt_opens`) or
# closes it there when off (no section), or lets the model open it; the rules above cover
# the three.
FAMILIES = [
    ("deepseek_v4", START, END, "DeepSeek-V4, V4.1"),
    ("glm45", START, END, "GLM-4.5, 4.6"),
    ("glm47", START, END, "GLM-4.7, GLM-5"),
    ("kimi_k2", START, END, "Kimi-K2-Thinking, K2.5"),
    ("minimax_m2", START, END, "MiniMax-M2 (the prompt opens the section)"),
    ("nemotron_v3", START, END, "Nemotron-3, Nemotron-Nano-v2"),
    ("longcat", "<longcat_think>", "</longcat_think>", "LongCat-Flash-Thinking, LongCat-2.0"),
    ("minimax_m3", "<mm:think>", "</mm:think>", "MiniMax-M3"),
    ("mistral", "[THINK]", "[/THINK]", "Magistral (its tags are special tokens)"),
]


def _family(name: str, start: str, end: str, models: str) -> type[ReasoningParser]:
    return type(
        f"ReasoningParser_{name}",
        (ReasoningParser,),
        {
            "__slots__": (),
            "__doc__": f"{models}: ``{start}…{end}``.",
            "name": name,
            "start": start,
            "end": end,
            "special": (start, end),
        },
    )


class Unwrap:
    """Drops markup tags from a stream of content text: a tag split across deltas is held
    until it is whole (at most a tag's length is held)."""

    __slots__ = ("_first", "_held", "_longest", "_tags")

    def __init__(self, tags: tuple[str, ...]) -> None:
        self._tags = tags
        self._first = "".join(dict.fromkeys(t[0] for t in tags))
        self._longest = max(len(t) for t in tags)
        self._held = ""

    def feed(self, text: str) -> str:
        """The next delta without the tags; what could start one is held."""
        if not self._held and not any(f in text for f in self._first):
            return text
        buf = self._held + text
        for tag in self._tags:
            if tag in buf:
                buf = buf.replace(tag, "")
        keep = 0
        for k in range(min(self._longest - 1, len(buf)), 0, -1):
            tail = buf[-k:]
            if any(t.startswith(tail) for t in self._tags):
                keep = k
                break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def finish(self) -> str:
        held, self._held = self._held, ""
        return held


class KimiK3ReasoningParser(ReasoningParser):
    """Kimi-K3's XTML: the ``think`` channel is the reasoning; the ``response`` and
    ``message`` channel tags around the answer are dropped from the content (the ``tools``
    channel passes on, for the tool parser). The template opens ``think`` in the prompt
    when thinking is on (``thinking``), ``response`` when off."""

    name = "kimi_k3"
    start = "<|open|>think<|sep|>"
    end = "<|close|>think<|sep|>"
    special = ("<|open|>", "<|close|>", "<|sep|>")
    _wrappers = ("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>")

    __slots__ = ("_unwrap",)

    def __init__(self, *, starts_in_reasoning: bool = False, enabled: bool = True) -> None:
        super().__init__(starts_in_reasoning=starts_in_reasoning, enabled=enabled)
        self._unwrap = Unwrap(self._wrappers)

    def feed(self, text: str) -> tuple[str, str]:
        reasoning, content = super().feed(text)
        return reasoning, self._unwrap.feed(content) if content else ""

    def finish(self) -> tuple[str, str]:
        reasoning, content = super().finish()
        return reasoning, self._unwrap.feed(content) + self._unwrap.finish()


class InklingReasoningParser(ReasoningParser):
    """Inkling's TML: every ``<|content_thinking|>`` block, to its ``<|end_message|>``, is
    reasoning (a response may think more than once); the rest, framing tokens included, is
    content for the tool parser (which reads the framing as markup; without one the server
    drops it as skipped special tokens)."""

    name = "inkling"
    start = "<|content_thinking|>"
    end = "<|end_message|>"
    special = (
        "<|message_model|>",
        "<|content_text|>",
        "<|content_thinking|>",
        "<|content_invoke_tool_json|>",
        "<|content_invoke_tool_text|>",
        "<|end_message|>",
        "<|content_model_end_sampling|>",
    )

    __slots__ = ()

    def __init__(self, *, starts_in_reasoning: bool = False, enabled: bool = True) -> None:
        super().__init__(starts_in_reasoning=starts_in_reasoning, enabled=enabled)
        self._state = self._initial = _REASONING if starts_in_reasoning else _CONTENT

    def feed(self, text: str) -> tuple[str, str]:
        if not self._buf:
            if self._state == _CONTENT and self.start[0] not in text:
                return "", text
            if self._state == _REASONING and self.end[0] not in text:
                return text, ""
        self._buf += text
        return self._blocks(False)

    def finish(self) -> tuple[str, str]:
        return self._blocks(True)

    def _blocks(self, final: bool) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        buf = self._buf
        while buf:
            inside = self._state == _REASONING
            tag = self.end if inside else self.start
            out = reasoning if inside else content
            i = buf.find(tag)
            if i >= 0:
                out.append(buf[:i])
                buf = buf[i + len(tag) :]
                self._state = _CONTENT if inside else _REASONING
                continue
            keep = 0 if final else _held(buf, tag)
            out.append(buf[: len(buf) - keep])
            buf = buf[len(buf) - keep :]
            break
        self._buf = buf
        return "".join(reasoning), "".join(content)


_CLASSES: list[type[ReasoningParser]] = [
    ReasoningParser,
    Qwen3ReasoningParser,
    KimiK3ReasoningParser,
    InklingReasoningParser,
    *(_family(*f) for f in FAMILIES),
]
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {cls.name: cls for cls in _CLASSES}
"""``--reasoning-parser`` name → parser class."""


def make_reasoning_parser(
    name: str, *, starts_in_reasoning: bool = False, enabled: bool = True
) -> ReasoningParser:
    """A fresh reasoning parser ``name`` for one choice. Raises ``ValueError`` naming the
    known parsers for an unknown ``name``."""
    cls = REASONING_PARSERS.get(name)
    if cls is None:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r}: use one of {known}")
    return cls(starts_in_reasoning=starts_in_reasoning, enabled=enabled)
