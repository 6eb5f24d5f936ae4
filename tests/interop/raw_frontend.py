"""A hand-rolled frontend for the interop tests: raw pyzmq sockets and hand-built msgpack arrays.

Deliberately independent of ``tsfront.wire`` (built in parallel): it binds the
three frontend sockets, runs HELLO → INIT → READY → registration by hand, and
encodes ADD/ABORT payloads as plain positional arrays per the wire contract
(§2.2, §2.3), so the harness can be checked against the contract itself.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
ADD = b"\x00"
ABORT = b"\x01"
ADD_TAG = "TokenizedGenerateReqInput"
OUTPUT_TAG = "BatchTokenIDOutSlim"
#: Output array positions (contract §3.1).
RIDS, OUTPUT_IDS, FINISHED, PROMPT, COMPLETION, CACHED, LP_VAL, LP_IDX, ENGINE_INDEX = range(1, 10)


def identity(engine_index: int) -> bytes:
    """ROUTER identity of an engine: u16 little-endian."""
    return struct.pack("<H", engine_index)


def sampling_array(
    *,
    max_new_tokens: int | None = None,
    stop_token_ids: list[int] | None = None,
    top_p: float = 1.0,
    ignore_eos: bool = False,
    stream_interval: int | None = None,
    n: int = 1,
) -> list[Any]:
    """A full 29-element ``SamplingParams`` array with the engine defaults elsewhere."""
    return [
        max_new_tokens, None, stop_token_ids, 1.0, top_p, -1, 0.0, 0.0, 0.0, 1.0, 0,
        None, None, None, None, ignore_eos, True, True, False, None, None,
        stream_interval, None, None, None, n, None, 0, False,
    ]  # fmt: skip


def add_payload(
    rid: str,
    input_ids: list[int],
    sampling: list[Any] | None = None,
    *,
    stream: bool = True,
    return_logprob: bool = False,
) -> bytes:
    """Shortest valid ``TokenizedGenerateReqInput`` array (11 elements, up to ``stream``)."""
    sp = sampling if sampling is not None else sampling_array()
    return msgspec.msgpack.encode(
        [ADD_TAG, rid, None, None, input_ids, sp, return_logprob, -1, 0, None, stream]
    )


@dataclass
class Registration:
    """What one engine sent during its handshake."""

    hello: dict[str, Any]
    ready: dict[str, Any]
    response: dict[str, Any]


class RawFrontend:
    """Binds handshake ROUTER, input ROUTER and output PULL on 127.0.0.1 (ephemeral ports)."""

    def __init__(self, handshake_endpoint: str = "tcp://127.0.0.1:*") -> None:
        self.ctx = zmq.Context()
        self.handshake = self._bind(zmq.ROUTER, handshake_endpoint)
        self.inputs = self._bind(zmq.ROUTER)
        # Fail loudly instead of silently dropping a frame to an unknown identity.
        self.inputs.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.outputs = self._bind(zmq.PULL)

    def _bind(self, kind: int, endpoint: str = "tcp://127.0.0.1:*") -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint)
        return sock

    @staticmethod
    def endpoint(sock: zmq.Socket) -> str:
        """The bound endpoint with its real port."""
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def close(self) -> None:
        """Close every socket and the context."""
        self.ctx.destroy(linger=0)

    def _recv(self, sock: zmq.Socket, timeout_s: float) -> list[bytes]:
        if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            raise TimeoutError(f"nothing on {self.endpoint(sock)} within {timeout_s} s")
        return sock.recv_multipart()

    def register(self, count: int, timeout_s: float = 10.0) -> dict[bytes, Registration]:
        """Answer ``count`` HELLOs with INIT and collect READY + registration per identity."""
        init = msgspec.msgpack.encode(
            {
                "addresses": {
                    "inputs": [self.endpoint(self.inputs)],
                    "outputs": [self.endpoint(self.outputs)],
                }
            }
        )
        deadline = time.monotonic() + timeout_s
        hellos: dict[bytes, dict[str, Any]] = {}
        readies: dict[bytes, dict[str, Any]] = {}
        while len(readies) < count:
            ident, payload = self._recv(self.handshake, deadline - time.monotonic())
            message = msgspec.msgpack.decode(payload)
            if message["status"] == "HELLO":
                hellos[ident] = message
                self.handshake.send_multipart([ident, init])
            else:
                readies[ident] = message
        responses: dict[bytes, dict[str, Any]] = {}
        while len(responses) < count:
            ident, payload = self._recv(self.inputs, deadline - time.monotonic())
            responses[ident] = msgspec.msgpack.decode(payload)
        return {i: Registration(hellos[i], readies[i], responses[i]) for i in responses}

    def send_add(self, engine_index: int, payload: bytes) -> None:
        """ADD frame to one engine: ``[identity, 0x00, payload]``, no delimiter."""
        self.inputs.send_multipart([identity(engine_index), ADD, payload])

    def send_abort(self, engine_index: int, rids: list[str]) -> None:
        """ABORT frame to one engine: ``[identity, 0x01, msgpack([rids])]``."""
        self.inputs.send_multipart([identity(engine_index), ABORT, msgspec.msgpack.encode(rids)])

    def recv_output(self, timeout_s: float = 5.0) -> bytes:
        """Frame 0 of the next output message (raw bytes: may be ENGINE_CORE_DEAD)."""
        return self._recv(self.outputs, timeout_s)[0]

    def collect(self, rids: set[str], timeout_s: float = 10.0) -> dict[str, list[list[Any]]]:
        """Decoded output arrays until every rid in ``rids`` has had its terminal frame.

        Returns, per rid, one row per frame: ``[output_ids, finished_reason,
        prompt_tokens, completion_tokens, lp_val, lp_idx, frame]``.
        """
        deadline = time.monotonic() + timeout_s
        rows: dict[str, list[list[Any]]] = {}
        open_rids = set(rids)
        while open_rids:
            raw = self.recv_output(max(deadline - time.monotonic(), 0.001))
            assert raw != ENGINE_CORE_DEAD, "engine died while requests were open"
            frame = msgspec.msgpack.decode(raw)
            assert frame[0] == OUTPUT_TAG
            for i, rid in enumerate(frame[RIDS]):
                row = [
                    frame[OUTPUT_IDS][i],
                    frame[FINISHED][i],
                    frame[PROMPT][i],
                    frame[COMPLETION][i],
                    frame[LP_VAL][i],
                    frame[LP_IDX][i],
                    frame,
                ]
                rows.setdefault(rid, []).append(row)
                if frame[FINISHED][i]:
                    open_rids.discard(rid)
        return rows
