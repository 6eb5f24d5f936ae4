"""Request payloads, frontend → engine: the ADD payload (``TokenizedGenerateReqInput``) and the
ABORT payload (an array of rids).

Encoding choice for ADD: :func:`encode_add` writes the FULL 0.1.1 layout, a 25-element tagged
array (``dc 00 19``, then the tag string, then 24 fields in declaration order, every default
spelled out), exactly as the engine's own struct encodes it. That makes our bytes identical to
the engine's for the same request (golden ``add_minimal_full``), and older engines (24-field
layout) ignore the trailing ``data_parallel_rank``. For ``rid="r1", input_ids=[1, 2, 3],
stream=True`` and default sampling params the payload is::

    dc0019b9546f6b656e697a656447656e6572617465526571496e707574a27231c0c093010203dc001dc0c0c0
    cb3ff0000000000000cb3ff0000000000000ffcb0000000000000000cb0000000000000000cb000000000000
    0000cb3ff000000000000000c0c0c0c0c2c3c3c2c0c0c0c0c0c001c000c2c2ff00c0c3c0c0c0c2cb00000000
    00000000c0c0c0c0c0c0c0c0c0

(``dc0019`` array of 25, ``b9...`` the tag, ``a27231`` the rid, ``c0 c0`` two nils, ``93010203``
the ids, ``dc001d`` the 29-element ``SamplingParams``, then the 19 remaining defaults.)

:func:`decode_add` is the engine side (for simulated engines): like the engine it accepts any
prefix of at least 6 elements and ignores extra trailing elements. It does not run the
engine's post-decode normalisation (seed from rid, greedy rewrite); a simulator does that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from tsfront.errors import WireDecodeError
from tsfront.wire.sampling import SamplingParams

__all__ = [
    "ENGINE_ABORT_MEMORY_S",
    "SessionParams",
    "TokenizedGenerateReqInput",
    "decode_abort",
    "decode_add",
    "encode_abort",
    "encode_add",
]

#: Seconds an engine remembers a rid it was told to abort while it did not hold it; an ADD
#: reusing that rid within this window is dropped without any output (CONTRACT §4.5).
ENGINE_ABORT_MEMORY_S: float = 300.0

# The only ext type the engine accepts (CUSTOM_TYPE_RAW_VIEW: a tensor's raw bytes).
_EXT_RAW_VIEW = 3


class SessionParams(msgspec.Struct, array_like=True, kw_only=True):
    """Continual-prompting session, ``[id, rid, offset, replace]``; unsupported, send ``None``.

    Any non-nil ``id`` makes the engine abort the request.
    """

    id: str | None = None
    rid: str | None = None
    offset: int | None = None
    replace: bool | None = None


class TokenizedGenerateReqInput(
    msgspec.Struct, tag="TokenizedGenerateReqInput", array_like=True, kw_only=True
):
    """One tokenized generate request: the ADD payload, tag + 24 positional fields (0.1.1).

    Only ``rid``, ``input_ids``, ``sampling_params`` and ``stream`` matter to a text-only
    client; the rest exist so the layout (and byte-for-byte encoding) matches the engine.
    Multimodal fields are typed loosely: they round-trip but are not interpreted.
    """

    rid: str
    http_worker_ipc: str | None = None
    input_text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None
    stream: bool = False
    input_embeds: list[Any] | None = None
    session_params: SessionParams | None = None
    custom_logit_processor: str | None = None
    return_hidden_states: bool = False
    created_time: float = 0.0
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    input_multi_ids: list[list[int]] | None = None
    input_extra_infos: list[dict[Any, Any]] | None = None
    input_ids_unpadded: list[int] | None = None
    multimodal_inputs: Any | None = None
    validation_error: str | None = None
    # 0.1.1 only; the engine decodes but never reads it (routing is by ROUTER identity).
    data_parallel_rank: int | None = None


def _ext_hook(code: int, data: memoryview) -> msgspec.msgpack.Ext:
    # Mirror the engine: any ext type other than raw-view tensors makes it drop the message.
    if code != _EXT_RAW_VIEW:
        raise WireDecodeError(f"msgpack ext type {code} is not accepted (only {_EXT_RAW_VIEW})")
    return msgspec.msgpack.Ext(code, bytes(data))


_ENCODER = msgspec.msgpack.Encoder()
_ADD_DECODER = msgspec.msgpack.Decoder(TokenizedGenerateReqInput, ext_hook=_ext_hook)
_ABORT_DECODER = msgspec.msgpack.Decoder(list[str])


def encode_add(req: TokenizedGenerateReqInput) -> bytes:
    """Encode ``req`` as an ADD payload frame (send after the :data:`ADD` type frame).

    The full 25-element array, byte-identical to the engine's own encoding. No validation
    happens here; call :func:`tsfront.wire.validate_request` first.
    """
    return _ENCODER.encode(req)


#: The three nil bootstrap fields (``bootstrap_host``, ``bootstrap_port``, ``bootstrap_room``)
#: of an ADD encoded for disaggregated serving, which the I/O process fills in.
BOOTSTRAP_PLACEHOLDER = b"\xc0\xc0\xc0"
_AFTER_BOOTSTRAP = TokenizedGenerateReqInput.__struct_fields__[
    TokenizedGenerateReqInput.__struct_fields__.index("bootstrap_room") + 1 :
]


def bootstrap_offset(req: TokenizedGenerateReqInput, payload: bytes) -> int:
    """The byte offset of the bootstrap fields in ``payload`` (``encode_add(req)``, whose
    bootstrap fields are all None): the I/O process fills them in without re-encoding the
    prompt. msgpack is context-free, so the fields after them encode alone as they do inside.
    """
    tail = sum(len(_ENCODER.encode(getattr(req, name))) for name in _AFTER_BOOTSTRAP)
    at = len(payload) - tail - len(BOOTSTRAP_PLACEHOLDER)
    if payload[at : at + len(BOOTSTRAP_PLACEHOLDER)] != BOOTSTRAP_PLACEHOLDER:
        raise ValueError("the request's bootstrap fields are not all None")
    return at


def decode_add(payload: bytes | memoryview) -> TokenizedGenerateReqInput:
    """Decode an ADD payload as the engine does (prefix forms and longer arrays accepted).

    Raises:
        WireDecodeError: anything the engine would drop as malformed (bad msgpack, wrong tag,
            fewer than 6 elements, a type mismatch, a nil rid, trailing bytes, a foreign ext).
    """
    try:
        return _ADD_DECODER.decode(payload)
    except WireDecodeError:
        raise
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise WireDecodeError(f"malformed ADD payload: {exc}") from exc


def encode_abort(rids: Sequence[str]) -> bytes:
    """Encode an ABORT payload: a msgpack array of rids (any number, including none).

    Raises:
        TypeError: a rid is not a str (the engine would drop the whole ABORT).
    """
    rids = list(rids)
    for rid in rids:
        if type(rid) is not str:
            raise TypeError(f"abort rids must be str, got {type(rid).__name__}: {rid!r}")
    return _ENCODER.encode(rids)


def decode_abort(payload: bytes | memoryview) -> list[str]:
    """Decode an ABORT payload into its rids.

    Raises:
        WireDecodeError: the payload is not a msgpack array of str.
    """
    try:
        return _ABORT_DECODER.decode(payload)
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise WireDecodeError(f"malformed ABORT payload: {exc}") from exc
