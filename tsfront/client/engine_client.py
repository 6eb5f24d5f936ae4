"""`EngineClient` and `ClientListener`: the public face of tsfront.

Two ways in, with the same features:

* embedded — ``await EngineClient.connect(config)`` starts an I/O process owned by this client
  and attaches to it (``ClientListener`` splits that into bind, then accept);
* multi-worker — the server's master runs ``io = IOProcess.start(config)`` and each worker
  process calls ``await EngineClient.attach(io.address)``.

`generate` refuses bad requests before anything is sent; everything after that arrives on the
request's `RequestStream`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import cast

from tsfront.client.attachment import Attachment
from tsfront.client.info import STATE_NAMES, EngineInfo, EngineLoad, load_from_row
from tsfront.client.stream import RequestStream
from tsfront.config import ClientConfig, LoadBalance
from tsfront.errors import (
    ClientClosed,
    DuplicateRequest,
    EngineUnavailable,
    Error,
    InvalidRequest,
    RidRecentlyAborted,
)
from tsfront.ipc import region as shm
from tsfront.ipc.hashes import group_block_tokens, packed_hashes
from tsfront.metrics.recorder import monotonic_ns
from tsfront.metrics.snapshot import FrontendMetrics, read_metrics
from tsfront.process.ioproc import IOProcess
from tsfront.wire import TokenizedGenerateReqInput, encode_add, validate_request
from tsfront.wire.request import ENGINE_ABORT_MEMORY_S, bootstrap_offset

log = logging.getLogger("tsfront.client.engine_client")


class EngineClient:
    """A connection to one engine group: every attention-DP rank's engine.

    One `EngineClient` is one worker of the I/O process; make one per worker process (or per
    event loop). It is not thread-safe: use it from the loop that created it.
    """

    def __init__(self, attachment: Attachment, io: IOProcess | None) -> None:
        self._att = attachment
        self._io = io
        # Each engine's context limit, made once per registration list (the attachment
        # replaces the list when an engine registers again), not per request; see `_limits`.
        self._limits_of: list[EngineInfo] | None = None
        self._limits: list[int | None] = []
        self._least: int | None = None

    @property
    def attachment(self) -> Attachment:
        """This worker's attachment to the I/O process (its sockets, shared memory, slot
        table and drain): for tools that measure the worker side (`tsfront bench`)."""
        return self._att

    # ------------------------------------------------------------------ construction

    @classmethod
    async def connect(cls, config: ClientConfig) -> EngineClient:
        """Start an I/O process for ``config``, wait for every engine, and attach to it.

        Raises `ConfigError` for addresses that cannot be bound, `HandshakeTimeout` if the
        engines do not all register within ``config.handshake_timeout``.
        """
        listener = await ClientListener.bind(config)
        return await listener.accept()

    @classmethod
    async def attach(
        cls, address: str, *, timeout: float | None = None, registered: bool = True
    ) -> EngineClient:
        """Attach this process to a running I/O process (see `IOProcess.start`).

        Returns once every engine has registered; raises `HandshakeTimeout` if they do not
        within the I/O process's handshake timeout (or ``timeout`` seconds), `ClientClosed` if
        no I/O process answers at ``address``. With ``registered=False`` it returns once the
        I/O process answered: until `wait_registered` returns, `registered` is False,
        `engines` and `load` are empty and `generate` raises `EngineUnavailable`, and
        `registration` tells which ranks registered so far (a server answers its health
        probes meanwhile).
        """
        att = Attachment(asyncio.get_running_loop())
        await att.open(address, timeout, registered=registered)
        return cls(att, None)

    async def wait_registered(self, timeout: float | None = None) -> None:
        """Wait until every engine of the group registered (at once if they have); raises
        `HandshakeTimeout` as `attach` does, and the client is then closed."""
        await self._att.wait_registered(timeout)

    @property
    def registered(self) -> bool:
        """Whether every engine of the group registered (`attach` returned, or
        `wait_registered` did)."""
        return self._att.registered

    def registration(self) -> list[str]:
        """Where each rank of the group (its decode group under disaggregated serving) stands
        in the handshake, by rank, read from the engine table now: ``"absent"`` (it has not
        dialed), ``"handshaking"``, ``"live"`` (registered), ``"stalled"`` or ``"dead"``."""
        att = self._att
        if att.closed or att.region is None:
            raise ClientClosed("the client is closed")
        words = att.region.engine_words
        return [
            STATE_NAMES.get(int(words[rank * shm.ENGINE_WORDS + shm.E_STATE]), "unknown")
            for rank in range(att.config.num_engines)
        ]

    # ------------------------------------------------------------------ requests

    async def generate(
        self, request: TokenizedGenerateReqInput, *, deadline: float | None = None
    ) -> RequestStream:
        """Submit a tokenized request; return its output stream.

        ``deadline``: seconds from now the request may take to finish (``None``: the
        config's ``request_deadline``, itself off by default; ``math.inf``: none). When it
        passes, whether the request is still queued, waiting for its first token or
        mid-stream, it is aborted on its engine (a request still queued in the I/O process
        is never sent), its slot freed, and the stream ends with `DeadlineExceeded` after the
        tokens that came before it.

        Refused before anything is sent, each with a typed error: what `validate_request`
        refuses (stop strings included), a rid already in flight in this worker
        (`DuplicateRequest`), a rid this client aborted less than 300 s ago
        (`RidRecentlyAborted`: the engine would drop it silently), a prompt that does not fit
        the engine's context (`PromptTooLong`),
        a pin to an absent or dead rank or no live engine at all (`EngineUnavailable`), a full
        local queue (`Busy`), a closed client (`ClientClosed`). Each refusal is counted in the
        worker's metrics by its class; time to first token is measured from this call.
        """
        t0 = monotonic_ns()
        try:
            stream = self._submit(request, deadline)
        except Error as exc:
            log.info(
                "refused request %r: %s: %s", getattr(request, "rid", None), type(exc).__name__, exc
            )
            if self._att.recorder is not None:
                self._att.recorder.refused(exc)
            raise
        if self._att.recorder is not None:
            self._att.recorder.started(stream.slot, t0)
        return stream

    def _submit(self, request: TokenizedGenerateReqInput, deadline: float | None) -> RequestStream:
        att = self._att
        if att.closed:
            raise ClientClosed(str(att.failure) if att.failure else "the client is closed")
        if not isinstance(request, TokenizedGenerateReqInput):
            raise InvalidRequest(
                "request",
                type(request).__name__,
                "is not a TokenizedGenerateReqInput",
                "build one with tsfront.wire.TokenizedGenerateReqInput(rid=..., input_ids=..., "
                "sampling_params=SamplingParams())",
            )
        if deadline is None:
            deadline = att.config.request_deadline
        elif (
            isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not deadline > 0
        ):
            raise InvalidRequest(
                "deadline",
                deadline,
                "must be a positive number of seconds",
                "pass e.g. deadline=30.0, or math.inf for none",
            )
        if deadline is not None and math.isinf(deadline):
            deadline = None
        pin = request.data_parallel_rank
        limit = self._context_limit(pin)
        validate_request(request, max_model_len=limit)
        if request.rid in att.slots.slot_of:
            raise DuplicateRequest(
                "rid",
                request.rid,
                "a request with this rid is in flight on this client",
                "use a fresh rid for every request (engines remember rids for 300 s)",
            )
        if att.slots.aborted:
            age = att.slots.aborted.age(request.rid, time.monotonic())
            if age is not None:
                raise RidRecentlyAborted(
                    "rid",
                    request.rid,
                    f"was aborted {age:.1f} s ago, and the engine silently drops a request that "
                    f"reuses an aborted rid for {ENGINE_ABORT_MEMORY_S:.0f} s",
                    "use a fresh rid",
                )
        payload = encode_add(request)
        bootstrap_at = 0
        if att.config.routing.is_disaggregated:
            bootstrap_at = _bootstrap_offset(request, payload)
        return att.submit(
            request.rid,
            payload,
            -1 if pin is None else pin,
            bool(request.return_logprob),
            deadline,
            bootstrap_at,
            self._prompt_hashes(cast("list[int]", request.input_ids)),  # validated: a list
        )

    def _prompt_hashes(self, input_ids: list[int]) -> bytes | None:
        # Under prefix affinity the worker hashes the prompt's blocks, so that the one I/O
        # process only looks them up (measured in docs/DESIGN.md, "Prefix affinity").
        config = self._att.config
        if config.routing.load_balance is not LoadBalance.PREFIX_AFFINITY:
            return None
        granularities = [e.prefix_granularity for e in self._att.engines]
        block = group_block_tokens(granularities, config.prefix_block_tokens)
        return packed_hashes(input_ids, block)

    def _context_limit(self, pin: int | None) -> int | None:
        att = self._att
        if not att.engines:  # attached with registered=False, the group not registered yet
            raise EngineUnavailable("the engines have not all registered yet; retry once they have")
        # The engine table's words (mapped while attached): a state is a Python int, read
        # with no array view or scalar per rank.
        words = cast(shm.Region, att.region).engine_words
        # The group requests are placed on (its decode group under disaggregated serving),
        # rows 0..num_engines-1; prefill engines follow it.
        n = att.config.num_engines
        limits = self._group_limits()
        if pin is not None:
            if isinstance(pin, bool) or not isinstance(pin, int) or not 0 <= pin < n:
                raise EngineUnavailable(
                    f"data_parallel_rank={pin!r}: this group has ranks 0..{n - 1} (engines "
                    f"{att.config.first_engine_index}..{att.config.first_engine_index + n - 1})"
                )
            if words[pin * shm.ENGINE_WORDS + shm.E_STATE] not in shm.SERVING_STATES:
                raise EngineUnavailable(
                    f"data_parallel_rank={pin}: engine {att.engines[pin].index} is not live; "
                    "send unpinned or wait for it to restart"
                )
            return limits[pin]
        least: int | None = None
        live = False
        for rank, limit in enumerate(limits):
            # A stalled rank counts (SERVING_STATES): the I/O process answers for it, with
            # EngineStalled when every live rank is stalled.
            if words[rank * shm.ENGINE_WORDS + shm.E_STATE] in shm.SERVING_STATES:
                live = True
                if limit and (least is None or limit < least):
                    least = limit
        if not live:
            raise EngineUnavailable("no engine of the group is live; requests cannot be served")
        return least

    def _group_limits(self) -> list[int | None]:
        """`EngineInfo.context_limit` of each engine of the group, by rank."""
        engines = self._att.engines
        if engines is not self._limits_of:
            self._limits_of = engines
            self._limits = [e.context_limit for e in engines[: self._att.config.num_engines]]
            self._least = min((v for e in engines if (v := e.context_limit)), default=None)
        return self._limits

    @property
    def context_limit(self) -> int | None:
        """The smallest context limit (`EngineInfo.context_limit`) of every registered
        engine, live or not; ``None`` when no engine reports one. Cheap: read per request."""
        self._group_limits()
        return self._least

    def abort(self, rid: str) -> bool:
        """Abort the in-flight request ``rid`` of this client; False if there is none."""
        stream = self._att.slots.stream_of(rid)
        if stream is None:
            return False
        stream.abort()
        return True

    # ------------------------------------------------------------------ introspection

    def engines(self) -> list[EngineInfo]:
        """Every engine of the group, as registered."""
        return list(self._att.engines)

    def load(self) -> list[EngineLoad]:
        """Each engine's latest load and liveness, as the I/O process publishes it."""
        att = self._att
        if att.closed or att.region is None:
            raise ClientClosed("the client is closed")
        return [
            load_from_row(info, att.region.engines[i], att.region.engine_load_ms(i))
            for i, info in enumerate(att.engines)
        ]

    def metrics(self) -> FrontendMetrics:
        """Every figure of the frontend, read from shared memory now: the same numbers the
        Prometheus exposition (`tsfront.metrics`) shows.

        As a mapping it is still the I/O process's counters (``m["frames"]``, ``m["in_flight"]``:
        output frames, rows and tokens it wrote to slots, rows for unknown rids, tokens that
        went through the spill path, eventfd wake-ups, requests in flight, slots spilling now);
        its attributes add the request metrics of every worker (``m.requests``), each engine's
        load, liveness and restarts (``m.engines``) and the attached workers (``m.workers``).
        The I/O loop's own counters are in the mapping too (`tsfront.ipc.region.IO_METRICS`):
        frames whose handler failed, load tails out of range, output connections lost, ADDs
        refused for reusing a recently aborted rid, under prefix affinity the placements
        load took from the longest match and the ADDs the I/O process had to hash itself, and
        the submissions taken from the workers' rings, those that came over ZMQ, the ring
        contents dropped as corrupt and the turns a worker's doorbell woke the I/O process.
        """
        att = self._att
        if att.closed or att.region is None:
            raise ClientClosed("the client is closed")
        return read_metrics(att.region)

    @property
    def address(self) -> str:
        """The I/O process's address: other processes can `attach` to it."""
        return self._att.addresses["address"]

    @property
    def slots(self) -> int:
        """Requests this worker may have in flight at once (``slots_per_worker``)."""
        return self._att.spw

    @property
    def closed(self) -> bool:
        """Whether the client is closed (by `close` or because its I/O process died)."""
        return self._att.closed

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Detach (open streams end with a `StreamError`); stop the I/O process if we own it."""
        self._att.close()
        if self._io is not None:
            io, self._io = self._io, None
            await asyncio.get_running_loop().run_in_executor(None, io.stop)

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ClientListener:
    """The client's sockets, bound and waiting for the engines.

    ``listener = await ClientListener.bind(config)`` starts the I/O process and binds; read
    the real addresses (ports resolved) to tell the engines, then ``await listener.accept()``.
    """

    def __init__(self, io: IOProcess) -> None:
        self._io: IOProcess | None = io
        #: The I/O process's attach address.
        self.address = io.address
        #: The bound handshake endpoint.
        self.handshake_address = io.handshake_address
        #: The input endpoint advertised to engines.
        self.input_address = io.input_address
        #: Each engine's output endpoint, by rank.
        self.output_addresses = io.output_addresses

    @classmethod
    async def bind(cls, config: ClientConfig) -> ClientListener:
        """Start an I/O process for ``config`` and bind its sockets."""
        loop = asyncio.get_running_loop()
        io = await loop.run_in_executor(None, IOProcess.start, config)
        return cls(io)

    async def accept(self) -> EngineClient:
        """Wait for every engine to register; the client owns the I/O process from then on."""
        if self._io is None:
            raise ClientClosed("this listener was already accepted or closed")
        io, self._io = self._io, None
        try:
            att = Attachment(asyncio.get_running_loop())
            await att.open(io.address, None)
        except BaseException:
            await asyncio.get_running_loop().run_in_executor(None, io.stop)
            raise
        return EngineClient(att, io)

    async def close(self) -> None:
        """Stop the I/O process without accepting."""
        if self._io is not None:
            io, self._io = self._io, None
            await asyncio.get_running_loop().run_in_executor(None, io.stop)


def _bootstrap_offset(request: TokenizedGenerateReqInput, payload: bytes) -> int:
    # Under disaggregated serving tsfront owns the bootstrap fields: one per request, from
    # the prefill engine the I/O process picks.
    for name in ("bootstrap_host", "bootstrap_port", "bootstrap_room"):
        if getattr(request, name) is not None:
            raise InvalidRequest(
                name,
                getattr(request, name),
                "is set by tsfront under disaggregated serving (from the prefill engine it "
                "picks and a fresh room per request)",
                "leave bootstrap_host, bootstrap_port and bootstrap_room unset",
            )
    return bootstrap_offset(request, payload)
