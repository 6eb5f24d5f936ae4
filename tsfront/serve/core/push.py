"""The streamed hot path: a token's SSE event written from the worker's drain.

Without it every token of a streamed response takes a round of the event loop: the drain
queues a chunk and wakes the response's task, the task resumes two generators (the stream's
and the response's) and awaits the ASGI ``send``. `Pusher` is the stream's sink (see
`tsfront.client.stream.RequestStream.set_sink`): for plain tokens of a response with one choice, no
stop strings and no logprobs, it turns them into text and the event bytes and steps the ASGI
``send`` coroutine itself, right there. ``send`` completes without suspending unless the
server applies back-pressure (the client reads slower than we write); then the rest of that
send runs in a task, and until it is done the sink declines, so later tokens queue as chunks
for the response's task, which waits for the send in flight (`settle`) before its own. The
order of events on the wire is the order of tokens either way.

The native step (``TSFRONT_SERVE_NATIVE``, on unless ``0``): for a stream decoded by the
table detokenizer and a response served by tsfront serve's protocol (`tsfront.serve.edge.cycle`) or
uvicorn's httptools one (an embedding server's), one C call
(``tsfront._native.token_event``) does the detokenizer's step, the JSON string, the event and
the HTTP/1.1 chunk around it, and the chunk goes to the connection's transport, as the cycle's
``send`` would write it (the drain's native pass, ``tsfront._native.push_batch``, sends it on
the connection's socket itself while the transport holds nothing, as the transport's own
write would first do: `direct_target`, plain TCP only, never TLS). Only while the cycle's own
``send`` would write it at once: the response started, chunked, not complete, the client still
there and the transport not paused for back-pressure; otherwise the ASGI ``send`` is stepped
as above. The end of the body always goes through ``send`` (keep-alive, the cycle's state).
docs/PERFORMANCE.md, "Worker per token: the native path" and "... the direct send", has what
they save.

Everything else (the first and last events, errors, a client that goes away) stays with the
response's task (`tsfront.serve.edge.asgi`).

`ParsedPusher` is the same sink for a choice whose text is parsed (tools, reasoning: an agent's
every answer): its tokens' text goes through the choice's `OutputParser` and the dialect's
`Format.pieces` there, in the drain, and the events it makes (none while the parser holds text
back) are sent by stepping ``send`` as above; no native step. What the parser raises on the
model's output is kept (the choice's ``failure``) and the engine request aborted: the
response's task, woken by that, ends the response with the parse step's error
(`tsfront.serve.core.service`).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import msgspec

from tsfront import _native
from tsfront.serve.edge.transport import ConnectionTransport, socket_target

if TYPE_CHECKING:
    from tsfront.serve.core.choice import Choice
    from tsfront.serve.core.shape import Format

__all__ = ["ParsedPusher", "Pusher", "direct_target"]

_JSON = msgspec.json.Encoder()
_token_event = _native.token_event

#: The native step (see above); ``TSFRONT_SERVE_NATIVE=0`` turns it off, to measure what it
#: saves (``tsfront bench serve --stacks python``) or to rule it out.
NATIVE = os.environ.get("TSFRONT_SERVE_NATIVE", "1") != "0"


@functools.cache
def _cycle_types() -> tuple[type, ...]:
    # The classes whose ``send`` the native step stands in for: tsfront serve's own cycle, and
    # uvicorn's httptools one (an embedding server's), looked up on first use: uvicorn is the
    # serve extra's.
    from tsfront.serve.edge.cycle import RequestCycle

    try:
        from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    except ImportError:
        return (RequestCycle,)
    return (RequestCycle, RequestResponseCycle)


def _native_cycle(send: Callable[..., Any]) -> Any:
    """The connection cycle whose ``send`` this is, when the native step can stand in for it
    (tsfront serve's or uvicorn's httptools one, a chunked body; not HEAD), else None."""
    cycle: Any = getattr(send, "__self__", None)
    if type(cycle) not in _cycle_types():
        return None
    if cycle.chunked_encoding is not True or cycle.scope.get("method") == "HEAD":
        return None
    return cycle


def direct_target(transport: Any) -> tuple[Any, int]:
    """The transport the drain's native pass may send an event past, and its socket's
    descriptor: the connection's own transport (behind tsfront serve's head writer, if that
    stands in front of it; under tsfront serve, the `ConnectionTransport` whose clean flag the
    pass keeps, which finds its descriptor once per connection), when it is a plain TCP one;
    ``(None, -1)`` for anything else (`tsfront.serve.edge.transport.socket_target`)."""
    if not isinstance(transport, ConnectionTransport):
        transport = getattr(transport, "connection_transport", transport)
    if isinstance(transport, ConnectionTransport):
        return transport.direct()
    return socket_target(transport)


class Pusher(_native.PusherBase):
    """The sink of one streamed choice: writes its plain-token events straight to ``send``.

    Its native step's state (the cycle, flow control, the detokenizer's table and decoder, the
    event's head and tail, the choice) and ``inflight``/``error`` are fields of the native
    base, which the worker's drain reads directly: an update that `__call__` would write with
    the native step is written by ``tsfront._native.push_batch`` without calling it (see
    `tsfront.client.stream.deliver_all`); `__call__` is what runs for everything else.

    Args:
        choice: the response's one choice (its detokenizer step counts its tokens).
        head: the event's bytes before the JSON-encoded text.
        tail: the event's bytes after it.
        send: the ASGI ``send`` of the response (whose start was sent already).
    """

    # The rest are the native base's: _choice, _cycle, _decoder, _errors, _fd, _flow, _head,
    # _pieces, _sock, _tail, direct_sends, error, inflight.
    __slots__ = ("_coro", "_message", "_send", "_text")

    def __init__(
        self,
        choice: Choice,
        head: bytes,
        tail: bytes,
        send: Callable[[dict[str, Any]], Coroutine[Any, Any, None]],
    ) -> None:
        self._choice = choice
        self._text = choice.plain
        self._head = head
        self._tail = tail
        self._send = send
        #: The connection cycle whose transport the native step writes to (None: no
        #: native step for this response; every event through ``send``).
        self._cycle: Any = None
        self._flow: Any = None  # its connection's flow control (one per connection)
        self._pieces: list[bytes] = []
        self._decoder: Any = None
        self._errors = ""
        state = choice.detok.native_state() if NATIVE else None
        cycle = _native_cycle(send) if state is not None else None
        if state is not None and cycle is not None:
            self._cycle = cycle
            self._flow = cycle.flow
            self._pieces, self._decoder, self._errors = state
            # The drain's native pass sends on this socket while the transport holds nothing.
            self._sock, self._fd = direct_target(cycle.transport)
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

    @property
    def native(self) -> bool:
        """Whether this response's events take the native step (see the module's doc)."""
        return self._cycle is not None

    def __call__(self, tokens: list[int]) -> bool:
        # native/push.c (``take``) makes the native step's checks and calls in this order for
        # the drain's common case: a change here is a change there.
        if self.inflight is not None or self.error is not None:
            return False  # the response's task takes them, after the send in flight
        cycle = self._cycle
        if (
            cycle is not None
            and not self._flow.write_paused
            and not cycle.disconnected
            and not cycle.response_complete
        ):
            # What the cycle's send would write now, made and written in one go.
            chunk = _token_event(
                self._pieces, self._decoder, tokens, self._head, self._tail, self._errors, True
            )
            self._choice.tokens += len(tokens)  # after: a step that raised changed nothing
            if chunk is not None:
                try:
                    # The cycle's transport as its send writes to it, looked up per event:
                    # `tsfront.serve.edge.cycle` swaps it for a writer that holds the response's
                    # head to the next loop turn, and then back once the head is out (a write
                    # bound before that would defer every event to a loop turn of its own).
                    cycle.transport.write(chunk)
                except Exception as exc:  # as a send that raised: the response ends with it
                    self.error = exc
            return True
        text = self._text(tokens)
        if not text:
            return True  # an incomplete character: nothing to send yet
        return self._send_event(self._head + _JSON.encode(text) + self._tail)

    def _send_event(self, body: bytes) -> bool:
        # ``body`` as the response's next event, through ``send``; a send the server suspends
        # (back-pressure) is finished by a task of its own, ``inflight``.
        message = self._message
        message["body"] = body
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


class ParsedPusher(Pusher):
    """The sink of one streamed choice whose text is parsed (the module's doc): the pieces of
    its plain tokens' text written straight to ``send``, in ``fmt``'s shape.

    Args:
        choice: the response's one choice (with its parser).
        fmt: the response's shape (`Format.pieces` makes the events).
        send: the ASGI ``send`` of the response (whose start was sent already).
    """

    __slots__ = ("_fmt",)

    def __init__(
        self,
        choice: Choice,
        fmt: Format,
        send: Callable[[dict[str, Any]], Coroutine[Any, Any, None]],
    ) -> None:
        super().__init__(choice, b"", b"", send)
        self._cycle = None  # no native step: the drain hands every update to `__call__`
        self._fmt = fmt

    def __call__(self, tokens: list[int]) -> bool:
        if self.inflight is not None or self.error is not None:
            return False  # the response's task takes them, after the send in flight
        choice = self._choice
        if choice.failure is not None:
            return True  # the response is ending: nothing more of it is parsed
        parser = choice.parser
        assert parser is not None
        text = self._text(tokens)
        try:  # the parse step's boundary (as the response's task has it)
            body = self._fmt.pieces(choice.index, parser.feed(text, len(tokens), tokens))
        except Exception as exc:
            choice.failure = exc
            choice.stream.abort()  # wakes the response's task, which sends the error
            return True
        if not body:
            return True  # held back (a marker's start), or markup: nothing to send yet
        return self._send_event(body)
