"""The streamed hot path: a token's SSE event written from the worker's drain.

Without it every token of a streamed response takes a round of the event loop: the drain
queues a chunk and wakes the response's task, the task resumes two generators (the stream's
and the response's) and awaits the ASGI ``send``. `Pusher` is the stream's sink (see
`tsfront.stream.RequestStream.set_sink`): for plain tokens of a response with one choice, no
stop strings and no logprobs, it turns them into text and the event bytes and steps the ASGI
``send`` coroutine itself, right there. ``send`` completes without suspending unless the
server applies back-pressure (the client reads slower than we write); then the rest of that
send runs in a task, and until it is done the sink declines, so later tokens queue as chunks
for the response's task, which waits for the send in flight (`settle`) before its own. The
order of events on the wire is the order of tokens either way.

Everything else (the first and last events, errors, a client that goes away) stays with the
response's task (`tsfront.serve.asgi`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

__all__ = ["Pusher"]

_JSON = msgspec.json.Encoder()


class Pusher:
    """The sink of one streamed choice: writes its plain-token events straight to ``send``.

    Args:
        text: turns token ids into the next piece of text (the choice's detokenizer step,
            which also counts its tokens).
        head: the event's bytes before the JSON-encoded text.
        tail: the event's bytes after it.
        send: the ASGI ``send`` of the response (whose start was sent already).
    """

    __slots__ = ("_coro", "_head", "_message", "_send", "_tail", "_text", "error", "inflight")

    def __init__(
        self,
        text: Callable[[list[int]], str],
        head: bytes,
        tail: bytes,
        send: Callable[[dict[str, Any]], Coroutine[Any, Any, None]],
    ) -> None:
        self._text = text
        self._head = head
        self._tail = tail
        self._send = send
        self._message: dict[str, Any] = {
            "type": "http.response.body",
            "body": b"",
            "more_body": True,
        }
        #: The task finishing a send that the server suspended (back-pressure), or None.
        self.inflight: asyncio.Task | None = None
        self._coro: Coroutine[Any, Any, None] | None = None  # that send
        #: What a pushed send raised (a broken connection): the response ends with it.
        self.error: BaseException | None = None

    def __call__(self, tokens: list[int]) -> bool:
        if self.inflight is not None or self.error is not None:
            return False  # the response's task takes them, after the send in flight
        text = self._text(tokens)
        if not text:
            return True  # an incomplete character: nothing to send yet
        message = self._message
        message["body"] = self._head + _JSON.encode(text) + self._tail
        coro = self._send(message)
        try:
            waiting = coro.send(None)
        except StopIteration:
            return True
        except Exception as exc:  # consumed: never raise from here (RequestStream.set_sink)
            self.error = exc
            return True
        # Suspended (back-pressure): the server holds ``message``; a fresh one for the next.
        self._message = {"type": "http.response.body", "body": b"", "more_body": True}
        self._coro = coro
        self.inflight = asyncio.ensure_future(self._finish(coro, waiting))
        return True

    async def _finish(self, coro: Coroutine[Any, Any, None], waiting: Any) -> None:
        # Drive the suspended send to its end: await what it waits for, then resume it.
        try:
            while True:
                if waiting is None:
                    await asyncio.sleep(0)  # a bare yield
                else:
                    # What a coroutine yields is a future marked as being awaited; a Task
                    # clears the mark before it waits on it, and so must we (else awaiting it
                    # raises "await wasn't used with future").
                    waiting._asyncio_future_blocking = False
                    await waiting
                waiting = coro.send(None)
        except StopIteration:
            pass
        except Exception as exc:
            self.error = exc
        finally:
            self.inflight = self._coro = None

    async def settle(self) -> None:
        """Wait for a pushed send still in flight; raise what a pushed send raised."""
        inflight = self.inflight
        if inflight is not None:
            await asyncio.shield(inflight)
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        """Stop a pushed send still in flight (the response is over)."""
        inflight, coro = self.inflight, self._coro
        self.inflight = self._coro = None
        if inflight is not None:
            inflight.cancel()
        if coro is not None:
            coro.close()
