"""Handshake messages: HELLO / READY, INIT, and the engine's registration frame.

Unlike the data plane these are msgpack MAPS with named keys (msgspec's default struct
encoding). Decoders go by name and ignore unknown keys, so engines that add keys keep working;
every optional key has a default so engines that send fewer keys work too.

Sequence (engine side dials): engine sends HELLO on the handshake socket → frontend answers
INIT (its input and output addresses) → engine sends READY → engine connects its input DEALER
and sends one registration frame → engine connects its output PUSH.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from tsfront.errors import WireDecodeError

__all__ = [
    "EngineRegistration",
    "HandshakeAddresses",
    "HandshakeInit",
    "ReadyMessage",
    "decode_init",
    "decode_ready_message",
    "decode_registration",
    "encode_hello",
    "encode_init",
    "encode_ready",
    "encode_registration",
]

_DECODE_ERRORS = (msgspec.DecodeError, TypeError, ValueError)


class ReadyMessage(msgspec.Struct):
    """The engine's HELLO and READY status frames (``status`` is ``"HELLO"`` or ``"READY"``)."""

    status: str | None = None
    local: bool | None = None
    headless: bool | None = None
    parallel_config_hash: str | None = None


class HandshakeAddresses(msgspec.Struct):
    """INIT's ``addresses``: the engine connects to ``inputs[0]`` and ``outputs[0]`` only."""

    inputs: list[str] = []
    outputs: list[str] = []
    coordinator_input: str | None = None
    coordinator_output: str | None = None
    frontend_stats_publish_address: str | None = None


class HandshakeInit(msgspec.Struct):
    """The INIT map the frontend sends in reply to HELLO (``addresses`` is required)."""

    addresses: HandshakeAddresses
    parallel_config: dict[Any, Any] = {}


class EngineRegistration(msgspec.Struct):
    """The registration frame an engine sends first on its input DEALER (19 keys in 0.1.1).

    Aug3 engines sent ``block_size`` instead of ``prefix_granularity`` and no
    ``multimodal_encoder_dtype``; :func:`decode_registration` maps ``block_size`` onto
    ``prefix_granularity``, so this object always exposes the latter. ``max_model_len`` is the
    model context length, not the cache-limited one: combine it with ``kv_cache_size_tokens``.
    ``max_num_seqs`` is global; the per-rank cap is ``max_num_seqs // data_parallel_size``.
    """

    max_model_len: int = 0
    num_gpu_blocks: int = 0
    prefix_granularity: int = 0
    dp_stats_address: str | None = None
    dtype: str = "bfloat16"
    multimodal_encoder_dtype: str | None = None
    vllm_version: str = ""
    world_size: int = 1
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    data_parallel_rank: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    instance_id: str = ""
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_events_config: dict[Any, Any] | None = None


class _RegistrationWire(EngineRegistration):
    # Decode-only view that also accepts the pre-Aug14 key; never encoded.
    block_size: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_READY_DECODER = msgspec.msgpack.Decoder(ReadyMessage)
_INIT_DECODER = msgspec.msgpack.Decoder(HandshakeInit)
_REGISTRATION_DECODER = msgspec.msgpack.Decoder(_RegistrationWire)
_HELLO = _ENCODER.encode(ReadyMessage(status="HELLO", local=True, headless=True))
_READY = _ENCODER.encode(ReadyMessage(status="READY", local=True, headless=True))


def encode_hello() -> bytes:
    """The HELLO frame an engine sends first (for simulated engines); identical to 0.1.1's."""
    return _HELLO


def encode_ready() -> bytes:
    """The READY frame an engine sends after INIT (for simulated engines)."""
    return _READY


def decode_ready_message(frame: bytes | memoryview) -> ReadyMessage:
    """Decode a HELLO or READY frame.

    Raises:
        WireDecodeError: not a msgpack map of the expected value types.
    """
    try:
        return _READY_DECODER.decode(frame)
    except _DECODE_ERRORS as exc:
        raise WireDecodeError(f"malformed HELLO/READY frame: {exc}") from exc


def encode_init(inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
    """Encode the smallest INIT the engine accepts: ``{"addresses": {"inputs", "outputs"}}``.

    Raises:
        ValueError: ``inputs`` or ``outputs`` is empty (the engine would die after READY).
        TypeError: an address is not a str.
    """
    inputs, outputs = list(inputs), list(outputs)
    if not inputs or not outputs:
        raise ValueError("INIT needs at least one input and one output address")
    for address in (*inputs, *outputs):
        if type(address) is not str:
            raise TypeError(f"addresses must be str, got {type(address).__name__}")
    return _ENCODER.encode({"addresses": {"inputs": inputs, "outputs": outputs}})


def decode_init(frame: bytes | memoryview) -> HandshakeInit:
    """Decode an INIT frame (engine side, for simulated engines).

    Raises:
        WireDecodeError: not a map, ``addresses`` missing, or a value of the wrong type.
    """
    try:
        return _INIT_DECODER.decode(frame)
    except _DECODE_ERRORS as exc:
        raise WireDecodeError(f"malformed INIT frame: {exc}") from exc


def decode_registration(frame: bytes | memoryview) -> EngineRegistration:
    """Decode an engine's registration frame, accepting Aug3's ``block_size`` key.

    Raises:
        WireDecodeError: not a map, or a known key with a value of the wrong type.
    """
    try:
        wire = _REGISTRATION_DECODER.decode(frame)
    except _DECODE_ERRORS as exc:
        raise WireDecodeError(f"malformed registration frame: {exc}") from exc
    fields = msgspec.structs.asdict(wire)
    block_size = fields.pop("block_size")
    # Only an engine that sent no prefix_granularity key leaves it at its 0 default.
    if block_size is not None and fields["prefix_granularity"] == 0:
        fields["prefix_granularity"] = block_size
    return EngineRegistration(**fields)


def encode_registration(reg: EngineRegistration, *, legacy_block_size: bool = False) -> bytes:
    """Encode a registration frame (for simulated engines).

    The default is the 19-key 0.1.1/Aug22 map. ``legacy_block_size=True`` writes the Aug3
    18-key map: ``block_size`` in place of ``prefix_granularity`` and no
    ``multimodal_encoder_dtype``.
    """
    if not legacy_block_size:
        return _ENCODER.encode(reg)
    legacy: dict[str, Any] = {}
    for key, value in msgspec.structs.asdict(reg).items():
        if key == "prefix_granularity":
            legacy["block_size"] = value
        elif key != "multimodal_encoder_dtype":
            legacy[key] = value
    return _ENCODER.encode(legacy)
