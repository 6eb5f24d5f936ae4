"""ZeroMQ framing of the TokenSpeed wire: type bytes, engine identities, the death sentinel.

A request travels as ``[identity, type, payload]`` on the frontend's input ROUTER (the engine's
DEALER sees ``[type, payload]``); outputs arrive on the PULL socket as one msgpack frame, or as
the raw ``ENGINE_CORE_DEAD`` sentinel. This module owns only those constants and the 2-byte
identity codec; payload codecs live in :mod:`tsfront.wire.request` and
:mod:`tsfront.wire.output`.
"""

from __future__ import annotations

from tsfront.errors import WireDecodeError

__all__ = ["ABORT", "ADD", "ENGINE_CORE_DEAD", "engine_identity", "identity_index"]

ADD: bytes = b"\x00"
"""Type frame of a request carrying one ``TokenizedGenerateReqInput`` payload."""

ABORT: bytes = b"\x01"
"""Type frame of a request carrying a msgpack array of rids to abort."""

ENGINE_CORE_DEAD: bytes = b"ENGINE_CORE_DEAD"
"""Raw (not msgpack) output frame an engine sends best-effort when it shuts down or crashes."""

_MAX_INDEX = 0xFFFF


def engine_identity(index: int) -> bytes:
    """Return the ZMQ routing identity of engine ``index``: a 2-byte little-endian u16.

    Raises:
        TypeError: ``index`` is not an int.
        ValueError: ``index`` is outside ``0..65535``.
    """
    # bool is an int subclass, but an identity of True is always a caller bug.
    if type(index) is not int:
        raise TypeError(f"engine index must be an int, got {type(index).__name__}")
    if not 0 <= index <= _MAX_INDEX:
        raise ValueError(f"engine index must be in 0..65535, got {index}")
    return index.to_bytes(2, "little")


def identity_index(identity: bytes | bytearray | memoryview) -> int:
    """Return the engine index encoded in a 2-byte routing identity.

    Raises:
        WireDecodeError: ``identity`` is not a 2-byte buffer.
    """
    if not isinstance(identity, bytes | bytearray | memoryview):
        raise WireDecodeError(f"engine identity must be bytes, got {type(identity).__name__}")
    if len(identity) != 2 or (type(identity) is memoryview and identity.nbytes != 2):
        raise WireDecodeError(f"engine identity must be 2 bytes, got {bytes(identity)!r}")
    return int.from_bytes(identity, "little")
