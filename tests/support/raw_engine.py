"""A rank driven by hand, for tests that need exact control of what an engine sends and when.

`RawEngine` runs the HELLO → INIT → READY → registration handshake through
`tsfront.sim.endpoint.EngineEndpoint`, the simulator's own (``hello``, ``ready`` and
``registration`` replace the frames it sends, for an engine that lies), then lets the test
read the ADD/ABORT frames the I/O process sends it and push any output frame (well-formed or
not) on its output PUSH, connect that PUSH late, or close it abruptly. It does nothing on its
own: no steps, no threads, no timers. No tests of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import zmq

from support.core_fixtures import DEADLINE
from tsfront import ClientConfig, EngineClient, IOProcess
from tsfront.sim.endpoint import EngineEndpoint
from tsfront.wire import (
    ABORT,
    ADD,
    ENGINE_CORE_DEAD,
    BatchTokenIDOutSlim,
    EngineRegistration,
    TokenizedGenerateReqInput,
    decode_abort,
    decode_add,
    encode_output,
)


class RawEngine:
    """One hand-driven rank (identity ``index``) of an I/O process."""

    def __init__(
        self,
        ctx: zmq.Context,
        handshake: str,
        index: int,
        *,
        rank: int = 0,
        size: int = 1,
        connect_output: bool = True,
        stuck: bool = False,
        hello: bytes | None = None,
        ready: bytes | None = None,
        registration: EngineRegistration | bytes | None = None,
    ) -> None:
        self.ctx = ctx
        self.index = index
        self.endpoint = endpoint = EngineEndpoint(ctx, handshake, index)
        try:
            endpoint.hello(hello)
            endpoint.wait_init(DEADLINE)
            endpoint.ready(ready)
        finally:
            endpoint.close_handshake()
        assert endpoint.addresses is not None
        self.output_address = endpoint.addresses[1]

        def configure(inp: zmq.Socket) -> None:
            if stuck:
                # An engine that stops reading: its queue and socket buffer hold very little.
                inp.setsockopt(zmq.RCVHWM, 1)
                inp.setsockopt(zmq.RCVBUF, 4096)

        if registration is None:
            registration = EngineRegistration(
                max_model_len=1 << 20, data_parallel_rank=rank, data_parallel_size=size
            )
        self.input = endpoint.register(registration, configure_input=configure)
        self.output: zmq.Socket | None = None
        if connect_output:
            self.connect_output()

    def connect_output(self) -> None:
        """Connect the output PUSH (the engine does this right after registering).

        It lives in a context of its own, so that `close_output` can wait until every frame
        pushed has been written to the connection before it closes."""
        self._output_ctx = zmq.Context(1)
        # A test's burst never blocks, whoever is not reading.
        self.output = self.endpoint.connect_output(
            context=self._output_ctx, linger_ms=5000, sndhwm=0
        )

    def recv_add(self, timeout: float = DEADLINE) -> TokenizedGenerateReqInput:
        """The next ADD the I/O process sent (ABORTs before it are skipped)."""
        while True:
            kind, payload = self._recv(timeout)
            if kind == ADD:
                return decode_add(payload)

    def recv_any(self, timeout: float) -> tuple[str, list[str]] | None:
        """The next frame as ``("add", [rid])`` or ``("abort", rids)``; None if none came."""
        try:
            kind, payload = self._recv(timeout)
        except TimeoutError:
            return None
        if kind == ADD:
            return "add", [decode_add(payload).rid]
        if kind == ABORT:
            return "abort", decode_abort(payload)
        return "other", []

    def _recv(self, timeout: float) -> tuple[bytes, bytes]:
        if not self.input.poll(int(timeout * 1000)):
            raise TimeoutError(f"raw engine {self.index}: nothing on the input within {timeout}s")
        frames = self.input.recv_multipart()
        return frames[0], frames[-1]

    def tokens_frame(
        self,
        rid: str,
        tokens: list[int],
        completion: int,
        finish: str = "",
        *,
        prompt: int = 3,
        num_running: int = 1,
        kv_total: int = 1000,
    ) -> bytes:
        """One 0.1.1 output frame with a single row for ``rid``."""
        return encode_output(
            BatchTokenIDOutSlim(
                rids=[rid],
                output_ids=[tokens],
                finished_reasons=[finish],
                prompt_tokens=[prompt],
                completion_tokens=[completion],
                cached_tokens=[0],
                output_token_logprobs_val=[[]],
                output_token_logprobs_idx=[[]],
                engine_index=self.index,
                num_running=num_running,
                kv_total_pages=kv_total,
            )
        )

    def push(self, *frames: bytes) -> None:
        """Send output frames on the PUSH, in order."""
        assert self.output is not None, "connect_output() first"
        for frame in frames:
            self.output.send(frame)

    def push_dead(self) -> None:
        """Send the ``ENGINE_CORE_DEAD`` sentinel."""
        self.push(ENGINE_CORE_DEAD)

    def close_output(self) -> None:
        """Close the PUSH once every queued frame is written to the connection (at most 5 s);
        the I/O process then sees the frames, then the disconnect."""
        if self.output is not None:
            self.endpoint.close_output(5000)
            self.output = None
            self._output_ctx.term()

    def close(self) -> None:
        """Close every socket."""
        self.close_output()
        self.endpoint.close()


@contextlib.asynccontextmanager
async def raw_rig(
    num_engines: int = 1, *, connect_output: bool = True, stuck: bool = False, **config: Any
) -> AsyncIterator[tuple[IOProcess, list[RawEngine], EngineClient, zmq.Context]]:
    """An I/O process whose ranks are all `RawEngine` s, and one attached client."""
    private = f"ipc://@tsfront-test-{secrets.token_hex(8)}"
    config.setdefault("input_address", f"{private}-in")
    config.setdefault("output_address", f"{private}-out")
    cfg = ClientConfig(
        handshake_address="tcp://127.0.0.1:0",
        num_engines=num_engines,
        handshake_timeout=DEADLINE,
        **config,
    )
    io = await asyncio.to_thread(IOProcess.start, cfg)
    ctx = zmq.Context()
    engines: list[RawEngine] = []
    client = None
    try:
        for rank in range(num_engines):
            engines.append(
                await asyncio.to_thread(
                    RawEngine,
                    ctx,
                    io.handshake_address,
                    rank,
                    rank=rank,
                    size=num_engines,
                    connect_output=connect_output,
                    stuck=stuck,
                )
            )
        client = await EngineClient.attach(io.address, timeout=DEADLINE)
        yield io, engines, client, ctx
    finally:
        if client is not None:
            await client.close()
        for e in engines:
            e.close()
        ctx.destroy(linger=0)
        await asyncio.to_thread(io.stop)
