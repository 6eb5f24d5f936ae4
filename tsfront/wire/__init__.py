"""``tsfront.wire``: the TokenSpeed engine wire (ZeroMQ + msgpack), as pure codecs with no I/O.

Byte-compatible with tokenspeed 0.1.1 (and the Aug3/Aug12/Aug22 forms the engine has shipped):

* :mod:`~tsfront.wire.frames` — type bytes (``ADD``/``ABORT``), 2-byte engine identities, the
  ``ENGINE_CORE_DEAD`` sentinel;
* :mod:`~tsfront.wire.sampling` — the nested ``SamplingParams`` array;
* :mod:`~tsfront.wire.request` — ADD (``TokenizedGenerateReqInput``) and ABORT payloads;
* :mod:`~tsfront.wire.output` — ``BatchTokenIDOutSlim`` frames (9, 10, 14-element forms);
* :mod:`~tsfront.wire.handshake` — HELLO/READY, INIT and the registration map;
* :mod:`~tsfront.wire.validate` — refusing requests the engine would abort, drop or die on.

Every decoder raises :class:`tsfront.errors.WireDecodeError` on bad bytes, and nothing else.
"""

from tsfront.wire.frames import ABORT, ADD, ENGINE_CORE_DEAD, engine_identity, identity_index
from tsfront.wire.handshake import (
    EngineRegistration,
    HandshakeAddresses,
    HandshakeInit,
    ReadyMessage,
    decode_init,
    decode_ready_message,
    decode_registration,
    encode_hello,
    encode_init,
    encode_ready,
    encode_registration,
)
from tsfront.wire.output import (
    ENGINE_DEAD,
    BatchTokenIDOutSlim,
    EngineCoreDead,
    decode_output,
    encode_output,
)
from tsfront.wire.request import (
    SessionParams,
    TokenizedGenerateReqInput,
    decode_abort,
    decode_add,
    encode_abort,
    encode_add,
)
from tsfront.wire.sampling import SamplingParams
from tsfront.wire.validate import validate_request

__all__ = [
    "ABORT",
    "ADD",
    "ENGINE_CORE_DEAD",
    "ENGINE_DEAD",
    "BatchTokenIDOutSlim",
    "EngineCoreDead",
    "EngineRegistration",
    "HandshakeAddresses",
    "HandshakeInit",
    "ReadyMessage",
    "SamplingParams",
    "SessionParams",
    "TokenizedGenerateReqInput",
    "decode_abort",
    "decode_add",
    "decode_init",
    "decode_output",
    "decode_ready_message",
    "decode_registration",
    "encode_abort",
    "encode_add",
    "encode_hello",
    "encode_init",
    "encode_output",
    "encode_ready",
    "encode_registration",
    "engine_identity",
    "identity_index",
    "validate_request",
]
