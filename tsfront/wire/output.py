"""Output frames, engine → frontend: ``BatchTokenIDOutSlim`` batches and the death sentinel.

Three engine generations put three array lengths on the wire (tag + fields): 9 (Aug3: the 8
columns), 10 (Aug12: + ``engine_index``), 14 (0.1.1: + the 4-int load tail). One typed decoder
reads all of them, defaulting the missing trailing fields to 0 and ignoring extra trailing
elements a future engine may append. :func:`decode_output` refuses what the native decoder
(``native/frame.c``) refuses: integers outside their type's range (token and logprob ids int32,
counts and the load tail u32, ``engine_index`` u16), more than 1,048,576 rows, and a row whose
logprob lists are neither empty nor as long as its tokens. It does one msgspec decode (the
ranges are checked inside it), seven ``len()`` calls, and a pass over the rows only when a
frame carries logprobs.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from tsfront.errors import WireDecodeError
from tsfront.wire.frames import ENGINE_CORE_DEAD

__all__ = ["ENGINE_DEAD", "BatchTokenIDOutSlim", "EngineCoreDead", "decode_output", "encode_output"]

_TAG: Final = "BatchTokenIDOutSlim"

# Most rows one frame may carry (the native decoder's limit, FRAME_MAX_ROWS).
_MAX_ROWS: Final = 1 << 20
# Ranges checked by the typed decoder, as the native one checks them.
_I32 = Annotated[int, msgspec.Meta(ge=-(1 << 31), le=(1 << 31) - 1)]
_U32 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 32) - 1)]
_U16 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 16) - 1)]


class BatchTokenIDOutSlim(msgspec.Struct, tag=_TAG, array_like=True):
    """One output frame: parallel per-request columns (all of ``len(rids)``) plus engine info.

    ``output_ids`` are deltas since the previous frame for that rid; ``completion_tokens`` and
    ``cached_tokens`` are cumulative; ``finished_reasons[i]`` is ``""`` while running, else
    ``"stop"`` / ``"length"`` / ``"abort"``. The load tail (``num_running`` ..
    ``kv_total_pages``) is all zeros from engines older than 0.1.1 (``kv_total_pages == 0``
    means "no load info"). Decoding checks each integer's range: token and logprob ids int32,
    counts and the load tail u32, ``engine_index`` u16 (an engine identity).
    """

    rids: Annotated[list[str], msgspec.Meta(max_length=_MAX_ROWS)]
    output_ids: list[list[_I32]]
    finished_reasons: list[str]
    prompt_tokens: list[_U32]
    completion_tokens: list[_U32]
    cached_tokens: list[_U32]
    output_token_logprobs_val: list[list[float]]
    output_token_logprobs_idx: list[list[_I32]]
    engine_index: _U16 = 0
    num_running: _U32 = 0
    num_waiting: _U32 = 0
    kv_active_pages: _U32 = 0
    kv_total_pages: _U32 = 0


class EngineCoreDead:
    """The ``ENGINE_CORE_DEAD`` sentinel: some engine feeding this output socket has died.

    The frame carries no identity; attribute it by output address. Use the singleton
    :data:`ENGINE_DEAD` and compare with ``is``.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "ENGINE_DEAD"


ENGINE_DEAD: Final = EngineCoreDead()
"""The value :func:`decode_output` returns for the ``ENGINE_CORE_DEAD`` frame."""

_DEAD_LEN: Final = len(ENGINE_CORE_DEAD)
_DECODER: Final = msgspec.msgpack.Decoder(BatchTokenIDOutSlim)
_ENCODER: Final = msgspec.msgpack.Encoder()


def decode_output(frame: bytes | memoryview) -> BatchTokenIDOutSlim | EngineCoreDead:
    """Decode one output frame into a batch, or :data:`ENGINE_DEAD` for the raw sentinel.

    Raises:
        WireDecodeError: not msgpack, wrong tag, a missing column, a type mismatch, an integer
            out of its range, more than 1,048,576 rows, a ragged batch (a column whose length
            differs from ``len(rids)``; the error names it), or a row whose logprob lists are
            neither empty nor as long as its ``output_ids`` (the error names the row).
    """
    # The sentinel is not msgpack (0x45 would parse as fixint 69 + trailing bytes): compare
    # the raw bytes first.
    if len(frame) == _DEAD_LEN and frame == ENGINE_CORE_DEAD:
        return ENGINE_DEAD
    try:
        batch = _DECODER.decode(frame)
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise WireDecodeError(f"malformed output frame: {exc}") from exc
    n = len(batch.rids)
    # Seven straight len() checks: a ragged batch would misattribute tokens to rids.
    if len(batch.output_ids) != n:
        _ragged("output_ids", len(batch.output_ids), n)
    if len(batch.finished_reasons) != n:
        _ragged("finished_reasons", len(batch.finished_reasons), n)
    if len(batch.prompt_tokens) != n:
        _ragged("prompt_tokens", len(batch.prompt_tokens), n)
    if len(batch.completion_tokens) != n:
        _ragged("completion_tokens", len(batch.completion_tokens), n)
    if len(batch.cached_tokens) != n:
        _ragged("cached_tokens", len(batch.cached_tokens), n)
    if len(batch.output_token_logprobs_val) != n:
        _ragged("output_token_logprobs_val", len(batch.output_token_logprobs_val), n)
    if len(batch.output_token_logprobs_idx) != n:
        _ragged("output_token_logprobs_idx", len(batch.output_token_logprobs_idx), n)
    values, indices = batch.output_token_logprobs_val, batch.output_token_logprobs_idx
    if any(values) or any(indices):
        # A logprob list that does not match its row's tokens would misattribute logprobs.
        # Fast path (every row with logprobs); else find the row that breaks the rule.
        lengths = list(map(len, values))
        if lengths == list(map(len, indices)) and lengths == list(map(len, batch.output_ids)):
            return batch
        for i, (ids, v, x) in enumerate(zip(batch.output_ids, values, indices, strict=True)):
            if len(x) != len(v) or (v and len(v) != len(ids)):
                raise WireDecodeError(
                    f"ragged logprobs in row {i}: {len(v)} values and {len(x)} ids for "
                    f"{len(ids)} output_ids (each must be empty or as long as output_ids)"
                )
    return batch


def _ragged(column: str, got: int, rids: int) -> None:
    raise WireDecodeError(f"ragged output frame: column {column} has {got} rows, rids has {rids}")


def encode_output(batch: BatchTokenIDOutSlim, *, form: int = 14) -> bytes:
    """Encode ``batch`` as an engine of a given generation would (for simulated engines).

    ``form`` is the array length: 9 (Aug3, no ``engine_index``), 10 (Aug12..Aug22, with
    ``engine_index``), 14 (0.1.1, with the load tail), or more (nils appended, simulating a
    future engine). 11..13 (a truncated tail, which no engine sends) are accepted too. The
    bytes equal the engine's for the same content (golden ``output_v9_aug3``,
    ``output_v10_aug12``, ``output_v14``).

    Raises:
        ValueError: ``form`` is below 9.
    """
    if form == 14:
        return _ENCODER.encode(batch)
    if type(form) is not int or form < 9:
        raise ValueError(f"output form must be an int >= 9, got {form!r}")
    # A tuple of the same values encodes to the same bytes as the struct, truncated or padded.
    items = (_TAG, *msgspec.structs.astuple(batch))
    if form < 14:
        return _ENCODER.encode(items[:form])
    return _ENCODER.encode(items + (None,) * (form - 14))
