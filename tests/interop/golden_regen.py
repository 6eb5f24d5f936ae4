"""Regenerates ``tests/data/golden_vectors.json`` with TokenSpeed 0.1.1's own classes.

Run inside ``.interop-venv`` (``scripts/regen-golden`` does)::

    .interop-venv/bin/python tests/interop/golden_regen.py [--out FILE] [--src FILE]

Keeps ``_meta`` and each entry's ``description``/``direction`` from the
committed copy and regenerates ``frames``/``hex``/``decoded`` for every 0.1.1
entry:

* HELLO, READY and the registration map are captured off real sockets (inproc)
  while the engine's ``connect_msgpack_engine`` runs its handshake;
* INIT and ADD payloads are encoded by the engine's structs
  (``WireHandshakeInitMessage``, ``TokenizedGenerateReqInput`` +
  ``SamplingParams`` through ``io_struct.MsgpackEncoder``), short forms are the
  same arrays with trailing defaults dropped, and every ADD is decoded back
  with ``zmq_wire.decode_request_frames`` (short and full must agree);
* outputs are received from the engine's ``MsgpackSendSocket`` on a PULL
  socket, ``ENGINE_CORE_DEAD`` via its ``send_engine_dead``.

:data:`CARRIED_OVER` entries come from older engine snapshots the 0.1.1
package cannot produce; they are copied unchanged.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import zmq
from engine_outputs import OutputRow, build_batch
from tokenspeed.runtime.engine import zmq_wire
from tokenspeed.runtime.engine.io_struct import MsgpackEncoder, TokenizedGenerateReqInput
from tokenspeed.runtime.engine.request_types import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_MATCHED_TOKEN,
)
from tokenspeed.runtime.engine.zmq_msgpack import MsgpackSendSocket, connect_msgpack_engine
from tokenspeed.runtime.sampling.sampling_params import SamplingParams

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden_vectors.json"
#: Entries from the Aug12/Aug22/Aug3 git snapshots: not producible by the 0.1.1 package.
CARRIED_OVER = ("output_v10_aug12", "output_v9_aug3", "ready_response_aug22", "ready_response_aug3")
IN_ADDR = "tcp://127.0.0.1:30501"
OUT_ADDR = "tcp://127.0.0.1:30502"

Entry = dict[str, Any]  # frames (hex list), hex, decoded


def _entry(frames: list[bytes], payload_index: int = -1) -> Entry:
    payload = frames[payload_index]
    return {
        "frames": [f.hex() for f in frames],
        "hex": payload.hex(),
        "decoded": msgspec.msgpack.decode(payload),
    }


# ------------------------------------------------------------------ handshake


def registration_response() -> zmq_wire.WireEngineCoreReadyResponse:
    """Illustrative 0.1.1 registration for dp rank 1 of 2 (the values of the committed entry)."""
    return zmq_wire.WireEngineCoreReadyResponse(
        max_model_len=32768,
        num_gpu_blocks=4096,
        prefix_granularity=64,
        dtype=zmq_wire.wire_dtype("torch.bfloat16"),
        vllm_version="tokenspeed-0.1.1",
        world_size=2,
        data_parallel_size=2,
        tensor_parallel_size=1,
        decode_context_parallel_size=1,
        data_parallel_rank=1,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        instance_id="Qwen/Qwen3-8B",
        kv_cache_size_tokens=262144,
    )


def capture_handshake() -> dict[str, Entry]:
    """HELLO, READY and the registration frame as the engine's handshake sends them."""
    ctx = zmq.Context()
    try:
        hs, inp, out = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER), ctx.socket(zmq.PULL)
        hs.bind("inproc://hs")
        inp.bind("inproc://in")
        out.bind("inproc://out")
        result: dict[str, Any] = {}

        def engine() -> None:
            result["sockets"] = connect_msgpack_engine(
                ctx,
                "inproc://hs",
                1,
                registration_response(),
                1000,
                enable_output_logprobs=True,
                supports_prompt_logprobs=False,
            )

        thread = threading.Thread(target=engine, daemon=True)
        thread.start()
        ident, hello = _recv(hs)
        init = msgspec.msgpack.encode(
            {"addresses": {"inputs": ["inproc://in"], "outputs": ["inproc://out"]}}
        )
        hs.send_multipart([ident, init])
        _, ready = _recv(hs)
        reg_ident, registration = _recv(inp)
        thread.join(10)
        assert ident == reg_ident == b"\x01\x00", (ident, reg_ident)
        for sock in result["sockets"]:
            sock.close()
        return {
            "hello": _entry([hello]),
            "ready": _entry([ready]),
            "ready_response": _entry([registration]),
        }
    finally:
        ctx.destroy(linger=0)


def _recv(sock: zmq.Socket, timeout_ms: int = 10_000) -> list[bytes]:
    if not sock.poll(timeout_ms):
        raise TimeoutError("engine sent nothing")
    return sock.recv_multipart()


def init_entries() -> dict[str, Entry]:
    """INIT as the engine's struct encodes it, and the minimal map its decoder accepts."""
    full = zmq_wire.encode(
        zmq_wire.WireHandshakeInitMessage(
            addresses=zmq_wire.WireHandshakeAddresses(inputs=[IN_ADDR], outputs=[OUT_ADDR])
        )
    )
    minimal = msgspec.msgpack.encode({"addresses": {"inputs": [IN_ADDR], "outputs": [OUT_ADDR]}})
    for payload in (full, minimal):
        decoded = zmq_wire.decode_init(payload)
        assert decoded.addresses.inputs == [IN_ADDR] and decoded.addresses.outputs == [OUT_ADDR]
    return {"init_full": _entry([full]), "init_minimal": _entry([minimal])}


# ------------------------------------------------------------------------ ADD


def wire_sampling(**values: Any) -> SamplingParams:
    """A ``SamplingParams`` holding exactly the API-level values a frontend sends.

    Construction runs ``__post_init__`` (``top_k=-1`` → ``1<<30``, stop ids to
    a set); the frontend sends the raw values, so put them back before encoding.
    """
    sp = SamplingParams(**values)
    for f in msgspec.structs.fields(SamplingParams):
        raw = values.get(f.name, f.default)
        if raw is not msgspec.NODEFAULT:
            setattr(sp, f.name, raw)
    return sp


def _defaults(cls: type[msgspec.Struct]) -> list[Any]:
    return [f.default for f in msgspec.structs.fields(cls)]


def _strip_defaults(values: list[Any], defaults: list[Any], keep: int) -> list[Any]:
    """Drop trailing elements equal to their field defaults (never below ``keep``)."""
    end = len(values)
    while end > keep and values[end - 1] == defaults[end - 1]:
        end -= 1
    return values[:end]


def add_frames(rid: str, sp: SamplingParams, **fields: Any) -> tuple[list[bytes], list[bytes]]:
    """(full, short) ADD frames for one request, both checked with the engine decoder."""
    req = TokenizedGenerateReqInput(rid=rid, input_ids=[1, 2, 3], sampling_params=sp, **fields)
    full = [zmq_wire.REQ_TYPE_ADD, *MsgpackEncoder().encode(req)]
    array = msgspec.msgpack.decode(full[1])
    # Outer: tag + fields; sampling_params (index 5) is required, so keep at least 6.
    outer_defaults = ["<tag>", *_defaults(TokenizedGenerateReqInput)]
    short = _strip_defaults(array, outer_defaults, keep=6)
    short[5] = _strip_defaults(array[5], _defaults(SamplingParams), keep=0)
    short_frames = [zmq_wire.REQ_TYPE_ADD, msgspec.msgpack.encode(short)]
    [a] = zmq_wire.decode_request_frames(full)
    [b] = zmq_wire.decode_request_frames(short_frames)
    assert a == b, f"short form of {rid} decodes differently"
    assert a.validation_error is None
    return full, short_frames


def add_entries() -> dict[str, Entry]:
    """The ADD vectors (0.1.1 layout) and the ABORT vector."""
    minimal_full, minimal_short = add_frames("r1", wire_sampling(), stream=True)
    sampling = wire_sampling(
        temperature=0.7, top_p=0.9, max_new_tokens=16, stop_token_ids=[2], seed=42
    )
    sampling_full, sampling_short = add_frames("r2", sampling, stream=True)
    dp_full, _ = add_frames("r3", wire_sampling(max_new_tokens=8), data_parallel_rank=1)
    stop_full, _ = add_frames("r4", wire_sampling(max_new_tokens=32, stop=["\n\n"]), stream=True)
    abort = [zmq_wire.REQ_TYPE_ABORT, msgspec.msgpack.encode(["r1", "r2"])]
    assert [r.rid for r in zmq_wire.decode_request_frames(abort)] == ["r1", "r2"]
    return {
        "add_minimal_full": _entry(minimal_full),
        "add_minimal_short": _entry(minimal_short),
        "add_sampling": _entry(sampling_full),
        "add_sampling_short": _entry(sampling_short),
        "add_dp_rank": _entry(dp_full),
        "add_stop_string": _entry(stop_full),
        "abort": _entry(abort),
    }


# --------------------------------------------------------------------- output


def capture_outputs() -> dict[str, Entry]:
    """Output frames as the engine's ``MsgpackSendSocket`` pushes them."""
    ctx = zmq.Context()
    try:
        pull = ctx.socket(zmq.PULL)
        pull.bind("inproc://out")

        def send(
            engine_index: int, tail: tuple[int, int, int, int], rows: list[OutputRow]
        ) -> Entry:
            push = ctx.socket(zmq.PUSH)
            push.connect("inproc://out")
            sender = MsgpackSendSocket(push, engine_index=engine_index)
            sender.set_load_snapshot(*tail)
            sender.send_pyobj(build_batch(rows, generated_time=0.0))
            entry = _entry(_recv(pull))
            sender.close()
            return entry

        stop = FINISH_MATCHED_TOKEN(matched=2).to_json()
        v14 = send(
            0,
            (2, 1, 10, 1000),
            [OutputRow("r1", [42], None, 3, 4), OutputRow("r2", [7, 2], stop, 3, 2)],
        )
        length = FINISH_LENGTH(length=16).to_json()
        lp_row = OutputRow("r9", [11, 12], length, 3, 16, 2, [-0.25, -1.5], [11, 12])
        logprobs = send(3, (1, 0, 5, 1000), [lp_row])
        abort = FINISH_ABORT("Invalid request: top_p must be in (0, 1], got 0.0.").to_json()
        validation = send(0, (0, 0, 0, 1000), [OutputRow("bad1", [], abort, 3, 0)])

        push = ctx.socket(zmq.PUSH)
        push.connect("inproc://out")
        dead_sender = MsgpackSendSocket(push)
        dead_sender.send_engine_dead()
        [raw] = _recv(pull)
        dead_sender.close()
        dead = {
            "frames": [raw.hex()],
            "hex": raw.hex(),
            "decoded": f"raw bytes {raw!r} (not msgpack)",
        }
        return {
            "output_v14": v14,
            "output_v14_logprobs_length": logprobs,
            "output_validation_abort": validation,
            "engine_core_dead": dead,
        }
    finally:
        ctx.destroy(linger=0)


# ----------------------------------------------------------------------- file

GENERATORS: tuple[Callable[[], dict[str, Entry]], ...] = (
    capture_handshake,
    init_entries,
    add_entries,
    capture_outputs,
)


def regenerate(committed: dict[str, Any]) -> dict[str, Any]:
    """The golden document with every 0.1.1 entry rebuilt; order and prose kept."""
    fresh: dict[str, Entry] = {}
    for generate in GENERATORS:
        fresh.update(generate())
    out: dict[str, Any] = {"_meta": committed["_meta"]}
    for name, old in committed.items():
        if name == "_meta":
            continue
        if name in CARRIED_OVER:
            out[name] = old
            continue
        if name not in fresh:
            raise KeyError(f"no generator for golden entry {name!r}")
        out[name] = {
            "description": old["description"],
            "direction": old["direction"],
            **fresh[name],
        }
    missing = set(fresh) - set(out)
    if missing:
        raise KeyError(f"generated entries absent from the committed file: {sorted(missing)}")
    return out


def render(doc: dict[str, Any]) -> str:
    """The committed file's exact JSON layout (indent 1, ASCII, no trailing newline)."""
    return json.dumps(doc, indent=1)


def main(argv: list[str] | None = None) -> int:
    """Regenerate ``--src`` (default: the committed file) into ``--out`` (default: same)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", type=Path, default=GOLDEN)
    p.add_argument("--out", type=Path, default=GOLDEN)
    args = p.parse_args(argv)
    committed = json.loads(args.src.read_text(encoding="utf-8"))
    args.out.write_text(render(regenerate(committed)), encoding="utf-8")
    kept = ", ".join(CARRIED_OVER)
    print(f"regen-golden: wrote {args.out} (carried over unchanged: {kept})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
