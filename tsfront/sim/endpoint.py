"""The engine side of the handshake, written once for every engine tsfront makes.

A headless TokenSpeed rank dials its frontend (CONTRACT §1.2): a handshake DEALER with the
rank's identity sends HELLO, waits for INIT, sends READY; an input DEALER with the same
identity connects to INIT's ``inputs[0]`` and sends one registration frame; an output PUSH
connects to ``outputs[0]``; the handshake DEALER closes. :class:`EngineEndpoint` is that
sequence, one step per method, and :meth:`EngineEndpoint.dial` runs them in order. The
simulator (:class:`tsfront.sim.SimEngine`), the replay engine of the throughput suite
(:mod:`tsfront.bench.replay`) and the tests' hand-driven rank all use it.

The steps take the bytes they send as arguments (HELLO, READY and the registration default
to well-formed frames), and ``configure_input`` sees the input DEALER before it connects, so
an engine that must lie (a malformed registration, a READY that is not one, a queue of one
message) says so with an argument rather than its own copy of the handshake.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq

from tsfront.wire import (
    EngineRegistration,
    HandshakeInit,
    decode_init,
    encode_hello,
    encode_ready,
    encode_registration,
    engine_identity,
)

__all__ = ["EngineEndpoint", "HandshakeFailed", "HandshakeTimeout"]

_POLL_SLICE_S = 0.02
"""Longest one wait for INIT blocks before ``should_stop`` is asked again."""


class HandshakeTimeout(TimeoutError):
    """No INIT arrived within the handshake timeout (the engine's 600 s, CONTRACT §1.6)."""


class HandshakeFailed(Exception):
    """An INIT the engine cannot use: undecodable, or without input or output addresses."""


class EngineEndpoint:
    """One rank's end of the handshake and the input / output sockets it leaves behind.

    ``context`` makes the handshake and input sockets; the output PUSH may live in another
    context (``connect_output(context=...)``), so that closing it can wait for its frames
    without waiting for the rest. The endpoint owns every socket it made: :meth:`close`
    closes them (the input and handshake at once, the output with ``output_linger_ms``).
    """

    def __init__(self, context: zmq.Context, handshake_address: str, engine_index: int) -> None:
        self.context = context
        self.handshake_address = handshake_address
        self.engine_index = engine_index
        self.identity = engine_identity(engine_index)
        self.init: HandshakeInit | None = None
        #: INIT's ``(inputs[0], outputs[0])`` once `ready` has checked them.
        self.addresses: tuple[str, str] | None = None
        self.handshake: zmq.Socket | None = None
        self.input: zmq.Socket | None = None
        self.output: zmq.Socket | None = None

    # -- the steps, in order -------------------------------------------------------------------

    def hello(self, frame: bytes | None = None) -> None:
        """Connect the handshake DEALER and send HELLO (``frame``: send these bytes instead)."""
        hs = self.context.socket(zmq.DEALER)
        hs.setsockopt(zmq.IDENTITY, self.identity)
        hs.setsockopt(zmq.LINGER, 0)
        hs.connect(self.handshake_address)
        self.handshake = hs
        hs.send(encode_hello() if frame is None else frame)

    def wait_init(
        self, timeout_s: float, should_stop: Callable[[], None] | None = None
    ) -> HandshakeInit:
        """Wait for INIT and decode its last frame (CONTRACT §1.2 step 2).

        ``should_stop`` is called between 20 ms polls and may raise to abandon the wait.

        Raises:
            HandshakeTimeout: no INIT within ``timeout_s``.
            HandshakeFailed: INIT did not decode.
        """
        hs = self._socket(self.handshake, "hello()")
        deadline = time.monotonic() + timeout_s
        while not hs.poll(int(min(_POLL_SLICE_S, timeout_s) * 1000)):
            if should_stop is not None:
                should_stop()
            if time.monotonic() >= deadline:
                raise HandshakeTimeout(f"engine {self.engine_index}: no INIT within {timeout_s}s")
        try:
            self.init = decode_init(hs.recv_multipart()[-1])
        except Exception as exc:
            raise HandshakeFailed(f"engine {self.engine_index}: bad INIT: {exc}") from exc
        return self.init

    def ready(self, frame: bytes | None = None) -> tuple[str, str]:
        """Send READY, then check INIT's addresses, as the engine does (a bad INIT still gets
        its READY, CONTRACT §1.2 step 5); returns ``(inputs[0], outputs[0])``.

        Raises:
            HandshakeFailed: INIT named no input or no output address.
        """
        hs = self._socket(self.handshake, "hello()")
        if self.init is None:
            raise RuntimeError("wait_init() first")
        hs.send(encode_ready() if frame is None else frame)
        inputs, outputs = self.init.addresses.inputs, self.init.addresses.outputs
        if not inputs or not outputs:
            raise HandshakeFailed(f"engine {self.engine_index}: INIT without inputs/outputs")
        self.addresses = (inputs[0], outputs[0])
        return self.addresses

    def register(
        self,
        registration: EngineRegistration | bytes,
        *,
        legacy_block_size: bool = False,
        configure_input: Callable[[zmq.Socket], None] | None = None,
    ) -> zmq.Socket:
        """Connect the input DEALER (same identity) and send the registration frame.

        ``registration`` is encoded (``legacy_block_size``: Aug3's 18-key map) unless it is
        already bytes, which are sent as they are. ``configure_input`` is called with the
        DEALER after its identity is set and before it connects (socket options, a monitor).
        """
        if self.addresses is None:
            raise RuntimeError("ready() first")
        inp = self.context.socket(zmq.DEALER)
        inp.setsockopt(zmq.IDENTITY, self.identity)
        inp.setsockopt(zmq.LINGER, 0)
        self.input = inp
        if configure_input is not None:
            configure_input(inp)
        inp.connect(self.addresses[0])
        if isinstance(registration, EngineRegistration):
            registration = encode_registration(registration, legacy_block_size=legacy_block_size)
        inp.send(registration)
        return inp

    def connect_output(
        self,
        *,
        context: zmq.Context | None = None,
        linger_ms: int = 1000,
        sndhwm: int | None = None,
    ) -> zmq.Socket:
        """Connect the output PUSH to ``outputs[0]`` (in ``context``, by default the
        endpoint's); ``sndhwm`` replaces libzmq's 1000 (0: never block)."""
        if self.addresses is None:
            raise RuntimeError("ready() first")
        out = (context or self.context).socket(zmq.PUSH)
        out.setsockopt(zmq.LINGER, linger_ms)
        if sndhwm is not None:
            out.setsockopt(zmq.SNDHWM, sndhwm)
        out.connect(self.addresses[1])
        self.output = out
        return out

    def close_handshake(self) -> None:
        """Close the handshake DEALER: there is never a second handshake."""
        if self.handshake is not None:
            self.handshake.close(linger=0)
            self.handshake = None

    def dial(
        self,
        registration: EngineRegistration | bytes,
        *,
        timeout_s: float,
        should_stop: Callable[[], None] | None = None,
        legacy_block_size: bool = False,
        configure_input: Callable[[zmq.Socket], None] | None = None,
        connect_output: bool = True,
        output_linger_ms: int = 1000,
    ) -> zmq.Socket:
        """The whole handshake: HELLO, INIT, READY, registration, output PUSH (unless
        ``connect_output`` is false: `connect_output` later), handshake closed. Returns the
        input DEALER. Raises what the steps raise; the sockets made so far stay owned by the
        endpoint, so `close` releases them either way."""
        self.hello()
        self.wait_init(timeout_s, should_stop)
        self.ready()
        inp = self.register(
            registration, legacy_block_size=legacy_block_size, configure_input=configure_input
        )
        if connect_output:
            self.connect_output(linger_ms=output_linger_ms)
        self.close_handshake()
        return inp

    # -- teardown --------------------------------------------------------------------------------

    def close_output(self, linger_ms: int | None = None) -> None:
        """Close the output PUSH (``linger_ms``: how long queued frames may still flush;
        ``None``: the socket's own LINGER)."""
        if self.output is not None:
            self.output.close(linger=linger_ms)
            self.output = None

    def close(self, output_linger_ms: int | None = None) -> None:
        """Close every socket the endpoint made (the context is the caller's)."""
        self.close_handshake()
        if self.input is not None:
            self.input.close(linger=0)
            self.input = None
        self.close_output(output_linger_ms)

    def _socket(self, sock: zmq.Socket | None, step: str) -> zmq.Socket:
        if sock is None:
            raise RuntimeError(f"{step} first")
        return sock
