"""`OutputChunk` and `RequestStream`: one request's outputs as an async iterator.

A stream is fed by its worker's `Attachment` (tsfront.client.attachment) with the tuples the native
reader copies out of the request's slot (`deliver_all` for a poll's batch: the common case of
the streaming server in one native pass, every other update through `RequestStream.deliver`),
and ended by it or by the slot table (`fail`, `expire`); it never touches shared memory itself.
It ends exactly once: after the chunk that carries a finish reason, or by raising one
`StreamError`. Leaving an ``async for`` early, cancelling the task, calling `abort`, or
dropping the stream aborts the request on its engine and frees its slot, through the one thing
it knows of its worker: a `SlotOwner` (the worker's `tsfront.client.slots.SlotTable`).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from tsfront import _native
from tsfront.errors import (
    DeadlineExceeded,
    EngineDied,
    EngineStalled,
    IOProcessDied,
    PrefillFailed,
    SendTimeout,
    StreamError,
    StreamRejected,
)
from tsfront.ipc import region
from tsfront.wire.request import ENGINE_ABORT_MEMORY_S

log = logging.getLogger("tsfront.client.stream")

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class SlotOwner(Protocol):
    """What a stream asks of the table that holds its slot (`tsfront.client.slots.SlotTable`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop its reader waits on."""
        ...

    @property
    def disaggregated(self) -> bool:
        """Whether prefill and decode are served apart (the errors name the side)."""
        ...

    def release(self, stream: RequestStream) -> None:
        """The stream saw its end in the slot: free the slot."""

    def abort(self, stream: RequestStream, reason: str = "cancelled") -> None:
        """Abort the request on its engine and free the slot (the stream ended early)."""

    def dropped(self, stream: RequestStream) -> None:
        """The unfinished stream is being collected: abort it and free the slot."""


class OutputChunk:
    """One step (or several coalesced steps) of a request's output.

    Attributes:
        rid: the request id.
        output_ids: the token ids generated since the previous chunk (a delta).
        finish_reason: None while running; ``"stop"``, ``"length"`` or ``"abort"`` (the
            engine refused or aborted the request) on the last chunk.
        prompt_tokens: the prompt length as the engine counted it.
        completion_tokens: tokens generated so far (cumulative).
        cached_tokens: prompt tokens served from the prefix cache.
        output_token_logprobs_val / output_token_logprobs_idx: logprobs of the tokens in
            ``output_ids`` (float32 precision) and their token ids, when the request asked for
            ``return_logprob``; else None.
        engine_index: the engine that produced it.
    """

    __slots__ = (
        "cached_tokens",
        "completion_tokens",
        "engine_index",
        "finish_reason",
        "output_ids",
        "output_token_logprobs_idx",
        "output_token_logprobs_val",
        "prompt_tokens",
        "rid",
    )

    def __init__(
        self,
        rid: str,
        output_ids: list[int],
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        output_token_logprobs_val: list[float] | None,
        output_token_logprobs_idx: list[int] | None,
        engine_index: int,
    ) -> None:
        self.rid = rid
        self.output_ids = output_ids
        self.finish_reason = finish_reason
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.cached_tokens = cached_tokens
        self.output_token_logprobs_val = output_token_logprobs_val
        self.output_token_logprobs_idx = output_token_logprobs_idx
        self.engine_index = engine_index

    @property
    def finished(self) -> bool:
        """Whether this is the request's last chunk."""
        return self.finish_reason is not None

    def _absorb(self, later: OutputChunk) -> None:
        # Coalesce a later chunk into this undelivered one (a reader that fell behind).
        self.output_ids.extend(later.output_ids)
        if self.output_token_logprobs_val is not None and later.output_token_logprobs_val:
            self.output_token_logprobs_val.extend(later.output_token_logprobs_val)
            # A chunk with logprobs has both lists (val and idx).
            idx = cast("list[int]", self.output_token_logprobs_idx)
            idx.extend(later.output_token_logprobs_idx or [])
        self.finish_reason = later.finish_reason
        self.prompt_tokens = later.prompt_tokens
        self.completion_tokens = later.completion_tokens
        self.cached_tokens = later.cached_tokens
        self.engine_index = later.engine_index

    def __repr__(self) -> str:
        return (
            f"OutputChunk(rid={self.rid!r}, output_ids={self.output_ids!r}, "
            f"finish_reason={self.finish_reason!r}, completion_tokens={self.completion_tokens}, "
            f"engine_index={self.engine_index})"
        )


def _deadline_error(
    rid: str, engine: int | None, deadline: float | None, where: str = ""
) -> DeadlineExceeded:
    shown = f"{deadline:g} s" if deadline is not None else "its deadline"
    where = where or (f"on engine {engine}" if engine is not None else "before its first token")
    return DeadlineExceeded(
        f"request {rid!r}: not finished within {shown}; aborted {where}. Raise the deadline "
        "or shed load",
        rid=rid,
        engine_index=engine,
        deadline=deadline,
    )


def _stream_error(
    code: int, rid: str, engine: int, deadline: float | None = None, pd: bool = False
) -> StreamError:
    idx = engine if engine >= 0 else None
    if code == region.FIN_PREFILL_DEAD:
        return EngineDied(
            f"request {rid!r}: prefill engine {engine} died while it held the request (or no "
            "prefill engine was live); retry",
            rid=rid,
            engine_index=idx,
            side="prefill",
        )
    if code == region.FIN_PREFILL_SEND_TIMEOUT:
        return SendTimeout(
            f"request {rid!r}: prefill engine {engine} did not take it within send_timeout; "
            "the engine is overloaded or stuck",
            rid=rid,
            engine_index=idx,
            side="prefill",
        )
    if code == region.FIN_PREFILL_ABORTED:
        return PrefillFailed(
            f"request {rid!r}: prefill engine {engine} aborted it (refused, or the KV transfer "
            "to the decode engine failed); retry",
            rid=rid,
            engine_index=idx,
            side="prefill",
        )
    side = "decode" if pd else None
    name = "decode engine" if pd else "engine"
    if code == region.FIN_DEADLINE:
        # The I/O process dropped it unsent from an engine's backlog.
        return _deadline_error(rid, None, deadline, "unsent, while it waited in the I/O process")
    if code == region.FIN_ENGINE_DEAD:
        return EngineDied(
            f"request {rid!r}: {name} {engine} died while serving it; retry on another rank",
            rid=rid,
            engine_index=idx,
            side=side,
        )
    if code == region.FIN_ENGINE_STALLED:
        if engine < 0:
            return EngineStalled(
                f"request {rid!r}: every live {name} is stalled (connected, but no output for "
                "stall_timeout), so none was given it; retry shortly",
                rid=rid,
                side=side,
            )
        return EngineStalled(
            f"request {rid!r}: {name} {engine} is stalled (connected, but no output for "
            "stall_timeout); the request was not served there (aborted on it, if it was sent); "
            "retry, another rank takes it",
            rid=rid,
            engine_index=idx,
            side=side,
        )
    if code == region.FIN_SEND_TIMEOUT:
        return SendTimeout(
            f"request {rid!r}: {name} {engine} did not take it within send_timeout; the engine "
            "is overloaded or stuck",
            rid=rid,
            engine_index=idx,
            side=side,
        )
    if code == region.FIN_DUPLICATE:
        return StreamRejected(
            f"request {rid!r}: a request with this rid is already in flight (another worker); "
            "rids must be unique",
            rid=rid,
        )
    if code == region.FIN_NO_ENGINE:
        return StreamRejected(
            f"request {rid!r}: no live engine could take it when it was routed (its pinned rank "
            "died, or every rank is down)",
            rid=rid,
        )
    if code == region.FIN_RID_ABORTED:
        return StreamRejected(
            f"request {rid!r}: this rid was aborted on engine {engine} less than "
            f"{ENGINE_ABORT_MEMORY_S:.0f} s ago, and the engine silently drops a request that "
            "reuses it; use a fresh rid for every request",
            rid=rid,
            engine_index=idx,
        )
    if code == region.FIN_IO_STOPPING:
        return IOProcessDied(f"request {rid!r}: the I/O process stopped", rid=rid)
    return StreamError(f"request {rid!r}: ended with unknown code {code}", rid=rid)


def deliver_all(updates: list[tuple], refs: list[weakref.ref[RequestStream] | None]) -> None:
    """Hand a `Reader.poll` batch to its streams (``refs``: the streams' weak references by
    local slot, None for a free slot; an update of a slot with no live stream is dropped).

    The common case first, in one native pass (``tsfront._native.push_batch``, native/push.c):
    plain tokens of a stream parked on a `tsfront.serve.core.push.Pusher` with the native step,
    whose checks all pass, are written as `deliver` and the sink would write them, with no
    Python frame per update. That pass reads the stream's ``_push``, ``_waiter`` and sets
    ``engine_index``, as `deliver` does. Every update it leaves goes through `deliver`, in
    order."""
    for update in _push_batch(updates, refs):
        ref = refs[update[0]]
        if ref is not None and (stream := ref()) is not None:
            stream.deliver(update)


_push_batch = _native.push_batch


class RequestStream:
    """The outputs of one request, in order.

    Iterate with ``async for chunk in stream`` (or ``await anext(stream)``): each chunk is an
    `OutputChunk`; the iteration ends after the chunk whose ``finish_reason`` is set, or raises
    one `StreamError`. Use ``async with stream:`` or `abort` to end it early.
    """

    __slots__ = (
        "__weakref__",
        "_deadline",
        "_done",
        "_error",
        "_owner",
        "_pending",
        "_push",
        "_sink",
        "_waiter",
        "engine_index",
        "rid",
        "slot",
        "ticket",
    )

    def __init__(
        self,
        owner: SlotOwner,
        rid: str,
        slot: int,
        ticket: int,
        deadline: float | None = None,
    ) -> None:
        self.rid = rid
        #: The engine that last produced output for it (None before the first chunk).
        self.engine_index: int | None = None
        #: Its local slot in the worker's slot table, and the ticket of this use of the slot.
        self.slot = slot
        self.ticket = ticket
        self._owner = owner
        # A list, not a deque: it never holds more than one chunk (later ones are absorbed), and
        # an empty deque is 760 bytes against 56 (the bulk of a stream's heap).
        self._pending: list[OutputChunk] = []
        self._waiter: asyncio.Future | None = None
        self._done = False  # no more input from the slot
        self._error: StreamError | None = None
        self._deadline = deadline  # seconds, as given (None: none)
        self._sink: Callable[[list[int]], bool] | None = None
        # The sink while the reader is parked with nothing unread and the stream not ended,
        # else None: what `deliver` checks first, one attribute for the state `set_sink`
        # describes (set when the reader parks, cleared by every wake-up).
        self._push: Callable[[list[int]], bool] | None = None

    # -- fed by the attachment and the slot table ---------------------------------------------

    def deliver(self, update: tuple) -> None:
        """Take one update of the slot (a tuple of the native reader's ``poll``): offer plain
        tokens to the sink, else queue them as a chunk for the reader (coalesced with an unread
        one); a finish reason ends the stream and frees the slot, a local end code (engine
        death, the I/O process stopping) ends it with its `StreamError` after any tokens."""
        # native/push.c (``take``, through `deliver_all`) makes these checks, in this order, for
        # plain tokens to a native `Pusher` before this is called: a change here is a change
        # there.
        push = self._push
        if push is not None:
            # The reader is parked with nothing unread (its waiter not cancelled either): plain
            # tokens may go straight to the sink (see `set_sink`), in the worker's drain, with
            # no chunk and no task switch.
            tokens = update[1]
            waiter = self._waiter
            if tokens and not update[4] and update[2] is None and waiter and not waiter.done():
                self.engine_index = update[8]
                try:
                    if push(tokens):
                        return
                except Exception:
                    log.exception(
                        "stream %r: its sink failed; the reader takes its tokens", self.rid
                    )
                    self._sink = self._push = None
        _local, tokens, lp_val, lp_idx, finish, prompt, completion, cached, engine = update
        local_end = finish >= region.FIN_ENGINE_DEAD
        if local_end and not tokens:
            self.fail(_stream_error(finish, self.rid, engine, self._deadline, self._pd()))
            return
        self.engine_index = engine
        # A local end (engine death, the I/O process stopping) can arrive in the same update
        # as the engine's last tokens: they were generated, so they are delivered first, in a
        # chunk without a finish reason, and the error follows it.
        chunk = OutputChunk(
            self.rid,
            tokens,
            region.FINISH_REASONS.get(finish) if finish and not local_end else None,
            prompt,
            completion,
            cached,
            lp_val,
            lp_idx,
            engine,
        )
        if finish and not local_end:
            self._done = True
            self._owner.release(self)
        if self._pending and not self._pending[-1].finished:
            self._pending[-1]._absorb(chunk)
        else:
            self._pending.append(chunk)
        if local_end:
            self.fail(_stream_error(finish, self.rid, engine, self._deadline, self._pd()))
            return
        self._wake()

    def fail(self, error: StreamError) -> None:
        """End the stream with ``error`` after what is unread (nothing to abort: the request
        is over, or its I/O process or client is gone); frees the slot. No-op once ended."""
        if self._done:
            return
        self._done = True
        self._error = error
        log.info("stream %r ended: %s: %s", self.rid, type(error).__name__, error)
        self._owner.release(self)
        self._wake()

    def _pd(self) -> bool:
        return self._owner.disaggregated

    def expire(self) -> None:
        """The deadline passed: what arrived stays readable, then `DeadlineExceeded`; the
        request is aborted on its engine (or dropped unsent by the I/O process) and the slot
        freed, as by `abort`. No-op once ended."""
        if self._done:
            return
        self._done = True
        self._error = _deadline_error(self.rid, self.engine_index, self._deadline)
        self._owner.abort(self, "DeadlineExceeded")
        self._wake()

    def _wake(self) -> None:
        self._push = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- consumer side ----------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[OutputChunk]:
        # A generator, so that leaving the loop early (its aclose at garbage collection) or a
        # cancellation reaches the `finally` and aborts the request.
        try:
            while True:
                try:
                    chunk = await self.__anext__()
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            if not self._done:
                self.abort()

    def take_ready(self) -> list[OutputChunk]:
        """The chunks delivered and not read yet, taken at once without waiting (a consumer
        that reads in batches; the throughput suite's untimed reader). The stream's end and
        its error are still reported by the next ``async for`` step."""
        pending = self._pending
        if not pending:
            return []
        self._pending = []
        return pending

    async def __anext__(self) -> OutputChunk:
        while True:
            if self._pending:
                return self._pending.pop(0)
            if self._error is not None:
                error, self._error = self._error, None
                self._pending = None  # type: ignore[assignment]  # ended: raise only once
                raise error
            if self._done:
                raise StopAsyncIteration
            waiter = self._waiter = self._owner.loop.create_future()
            self._push = self._sink  # parked, nothing unread, not ended (checked above)
            try:
                await waiter
            except asyncio.CancelledError:
                if not self._done:
                    self.abort()
                raise
            finally:
                self._waiter = self._push = None

    def set_sink(self, sink: Callable[[list[int]], bool] | None) -> None:
        """Offer plain tokens to ``sink`` as they arrive, before the reader sees them.

        While the reader is parked in ``async for`` / ``__anext__`` with nothing unread, each
        update that carries tokens and nothing else (no finish reason, no logprobs, no error)
        is passed to ``sink(token_ids)`` synchronously, in the worker's drain of its shared
        memory. If it returns True it has consumed them: they never become an `OutputChunk`
        and the reader stays parked. If it returns False they take the usual way (a chunk
        for the reader). Everything else (the last chunk, errors, logprobs, tokens that
        arrive while the reader is busy) always takes the usual way, so a reader that handles
        every chunk itself stays correct whatever the sink does.

        This is the streaming server's hot path: ``tsfront serve`` writes a token's SSE event
        from the sink, with no task switch per token. A sink must be quick, must not block,
        and must not raise after it has consumed the tokens (an exception is logged, the sink
        dropped, and the tokens go to the reader). ``None`` removes it.
        """
        self._sink = sink
        waiter = self._waiter
        self._push = sink if waiter is not None and not waiter.done() else None

    @property
    def finished(self) -> bool:
        """Whether the stream has ended (its last chunk or error may still be unread)."""
        return self._done

    def abort(self) -> None:
        """Abort the request on its engine and end the stream (idempotent, non-blocking)."""
        if self._done:
            return
        self._done = True
        self._owner.abort(self)
        self._wake()

    async def aclose(self) -> None:
        """Abort if still running (``async with`` calls this)."""
        self.abort()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.abort()

    def __del__(self) -> None:
        if not self._done:
            try:
                self._owner.dropped(self)
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"RequestStream(rid={self.rid!r}, finished={self._done})"
