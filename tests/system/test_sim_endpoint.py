"""The engine side of the handshake (tsfront.sim.endpoint), against a hand-driven frontend.

A raw ROUTER stands in for the frontend's handshake socket and ROUTER/PULL for its data
sockets, so every frame the endpoint sends is read back as bytes: HELLO and READY as the
contract has them, the registration on the input with the same identity, READY sent even for
an INIT without addresses (the engine checks them only after READY), a bad INIT or none at
all as typed errors, and the frames a lying engine passes in sent unchanged.
"""

from __future__ import annotations

import threading

import msgspec
import pytest
import zmq
from support.core_fixtures import DEADLINE

from tsfront.sim.endpoint import EngineEndpoint, HandshakeFailed, HandshakeTimeout
from tsfront.wire import (
    EngineRegistration,
    decode_ready_message,
    decode_registration,
    encode_init,
    engine_identity,
)


class Frontend:
    """A handshake ROUTER, an input ROUTER and an output PULL on loopback TCP."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.hs = ctx.socket(zmq.ROUTER)
        self.hs.bind("tcp://127.0.0.1:0")
        self.address = self.hs.getsockopt_string(zmq.LAST_ENDPOINT)
        self.inp = ctx.socket(zmq.ROUTER)
        self.inp.bind("tcp://127.0.0.1:0")
        self.out = ctx.socket(zmq.PULL)
        self.out.bind("tcp://127.0.0.1:0")
        self.addresses = (
            self.inp.getsockopt_string(zmq.LAST_ENDPOINT),
            self.out.getsockopt_string(zmq.LAST_ENDPOINT),
        )

    def recv(self, sock: zmq.Socket) -> list[bytes]:
        assert sock.poll(int(DEADLINE * 1000)), "nothing arrived"
        return sock.recv_multipart()

    def close(self) -> None:
        for s in (self.hs, self.inp, self.out):
            s.close(linger=0)


@pytest.fixture
def frontend():
    ctx = zmq.Context()
    fe = Frontend(ctx)
    yield ctx, fe
    fe.close()
    ctx.term()


def test_dial_sends_hello_ready_registration_and_connects_the_output(frontend) -> None:
    ctx, fe = frontend
    ep = EngineEndpoint(ctx, fe.address, 258)
    reg = EngineRegistration(max_model_len=4096, data_parallel_rank=1, data_parallel_size=2)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(ep.dial(reg, timeout_s=DEADLINE)))
    t.start()
    try:
        ident, hello = fe.recv(fe.hs)
        assert ident == engine_identity(258) == b"\x02\x01"
        assert decode_ready_message(hello).status == "HELLO"
        fe.hs.send_multipart([ident, encode_init(*([a] for a in fe.addresses))])
        ident2, ready = fe.recv(fe.hs)
        assert ident2 == ident and decode_ready_message(ready).status == "READY"
        ident3, registration = fe.recv(fe.inp)
        assert ident3 == ident
        assert decode_registration(registration) == reg
        t.join(DEADLINE)
        assert result == [ep.input] and ep.handshake is None  # closed: never a second one
        assert ep.addresses == fe.addresses
        assert ep.output is not None
        ep.output.send(b"frame")
        assert fe.recv(fe.out) == [b"frame"]
    finally:
        t.join(DEADLINE)
        ep.close()


def test_no_init_is_a_handshake_timeout_and_should_stop_can_end_the_wait(frontend) -> None:
    ctx, fe = frontend
    ep = EngineEndpoint(ctx, fe.address, 0)
    try:
        ep.hello()
        with pytest.raises(HandshakeTimeout):
            ep.wait_init(0.2)

        class Stop(Exception):
            pass

        def stop() -> None:
            raise Stop

        with pytest.raises(Stop):
            ep.wait_init(DEADLINE, should_stop=stop)
    finally:
        ep.close()


@pytest.mark.parametrize("init", [b"\xc1", msgspec.msgpack.encode({"parallel_config": {}})])
def test_an_undecodable_init_is_handshake_failed(frontend, init: bytes) -> None:
    ctx, fe = frontend
    ep = EngineEndpoint(ctx, fe.address, 0)
    try:
        ep.hello()
        ident, _ = fe.recv(fe.hs)
        fe.hs.send_multipart([ident, init])
        with pytest.raises(HandshakeFailed, match="bad INIT"):
            ep.wait_init(DEADLINE)
    finally:
        ep.close()


def test_init_without_addresses_still_gets_its_ready_then_fails(frontend) -> None:
    ctx, fe = frontend
    ep = EngineEndpoint(ctx, fe.address, 0)
    try:
        ep.hello()
        ident, _ = fe.recv(fe.hs)
        fe.hs.send_multipart([ident, msgspec.msgpack.encode({"addresses": {"inputs": []}})])
        ep.wait_init(DEADLINE)
        with pytest.raises(HandshakeFailed, match="without inputs/outputs"):
            ep.ready()
        _, ready = fe.recv(fe.hs)
        assert decode_ready_message(ready).status == "READY"
    finally:
        ep.close()


def test_a_lying_engine_sends_its_own_frames_unchanged(frontend) -> None:
    ctx, fe = frontend
    ep = EngineEndpoint(ctx, fe.address, 7)
    seen: list[int] = []
    try:
        ep.hello(b"not hello")
        ident, hello = fe.recv(fe.hs)
        assert hello == b"not hello"
        fe.hs.send_multipart([ident, encode_init([fe.addresses[0]], [fe.addresses[1]])])
        ep.wait_init(DEADLINE)
        ep.ready(b"\x90")
        assert fe.recv(fe.hs)[1] == b"\x90"
        ep.register(b"\xc1garbage", configure_input=lambda s: seen.append(s.getsockopt(zmq.LINGER)))
        assert fe.recv(fe.inp) == [ident, b"\xc1garbage"]
        assert seen == [0]  # configured before it connected, identity and linger already set
    finally:
        ep.close()
