"""The one rule that keeps large work off a worker's event loop, sized by the work.

A worker's event loop runs every stream of the worker: a step that takes a second on it
(encoding a long prompt, rendering a long conversation, decoding a long list of tokens) holds
every other client of the worker for that second. `Offload.run` ``(size, fn, *args)`` calls
``fn(*args)`` on the loop when ``size`` is at most `OFFLOAD_CHARS`, else on a thread, one such
call at a time per worker (the next waits for its turn without holding the loop). ``size`` is
the work's own, counted or bounded from above before the work runs, never the size of the
request that asked for it:

=========================================  ==============================================
work                                       its size
=========================================  ==============================================
encode a prompt (completions, tokenize)    the prompt's characters
render and encode a chat request (chat,    the characters the template is given: the
``/v1/responses``, tokenize ``messages``)  body's bytes (at least the characters of every
                                           string in it), the server's default template
                                           variables, and the conversation loaded from the
                                           store (`text_chars`)
detokenize                                 tokens x the longest token's characters (the
                                           most text they can make)
compile stop strings                       4 x their characters
=========================================  ==============================================

Counting reasoning tokens needs no work at all: they are the engine's tokens, counted as they
arrive (`tsfront.serve.core.parsing.OutputParser`). At or under the threshold a step costs about
what the hop to a thread and back does (~0.2 ms), so small requests stay on the loop: no
thread hop, and no coroutine where the caller checks `small` first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["OFFLOAD_CHARS", "Offload", "text_chars"]

#: Work (characters) above which it runs on a thread instead of the event loop: below it the
#: encode (~0.2 ms per 1,000 characters on the test tokenizers) costs about what the hop to a
#: thread and back does (~0.2 ms, measured).
OFFLOAD_CHARS = 2048


class Offload:
    """One worker's turn for large work off its event loop."""

    __slots__ = ("_turn",)

    def __init__(self) -> None:
        self._turn = asyncio.Semaphore(1)

    @staticmethod
    def small(size: int) -> bool:
        """Whether work of ``size`` runs on the loop (a caller may then skip `run`'s
        coroutine)."""
        return size <= OFFLOAD_CHARS

    async def run(self, size: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``: on the loop if ``size`` is small, else on a thread, one at a time;
        what it raises is raised here."""
        if size <= OFFLOAD_CHARS:
            return fn(*args)
        async with self._turn:
            future = asyncio.get_running_loop().run_in_executor(None, fn, *args)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                # The client left; a thread cannot be stopped: hold the turn until it ends.
                await asyncio.wait([future])
                raise


def text_chars(value: Any, limit: int = OFFLOAD_CHARS) -> int:
    """The characters of a decoded JSON ``value``'s strings (keys included; any other value
    counts 1), counted until they pass ``limit``: the size of work on a value that did not come
    with the request's body (a conversation from the store). Iterative, and at most ``limit``
    steps: a value of any size or depth costs at most a few hundred microseconds."""
    total = 0
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack and total <= limit:
        node = pop()
        kind = type(node)
        if kind is str:
            total += len(node) or 1
        elif kind is dict:
            total += 1
            for key, child in node.items():
                total += len(key) if type(key) is str else 1
                push(child)
                if total > limit:
                    break
        elif kind is list:
            total += 1
            stack.extend(node[: limit - total + 1])  # each item counts at least 1
        else:
            total += 1
    return total
