"""The control channel's messages: msgspec Structs tagged by their ``op`` key.

Each message is a msgpack map behind a 4-byte little-endian length (`frame`, `unframe`); the
socket that carries them, and the two file descriptors that ride on them (the worker's eventfd
with `Attach`, the region's memfd with `Attached`), are `tsfront.ipc.channel`'s. Nothing here reads
a message by string key: a map that is not one of these Structs (an unknown ``op``, a field of
the wrong type) is a `ControlError`.

worker → I/O: `Attach`.
I/O → worker: `Attached`; then `Engines` once the group is ready, `EngineUpdate` when an
engine registers again (a restart), `Failed` if the handshake cannot complete (or the attach
is refused).
"""

from __future__ import annotations

import struct
from typing import Any, Final

import msgspec

from tsfront.wire import EngineRegistration

LENGTH: Final = struct.Struct("<I")
MAX_MESSAGE: Final = 16 << 20


class ControlError(Exception):
    """The control peer sent something that is not a control message."""


class Attach(msgspec.Struct, tag_field="op", tag="attach"):
    """A worker asks for a place (its eventfd rides along)."""

    pid: int = 0


class Attached(msgspec.Struct, tag_field="op", tag="attached"):
    """The worker's place: its number, the attach's serial and ticket range, the region's
    geometry (the memfd rides along, and the I/O process's eventfd when the region has
    submission rings), the submit address, the config and every address."""

    worker: int
    serial: int
    ticket_base: int
    geometry: tuple[int, int, int, int, int]
    submit: str
    config: dict[str, Any]
    addresses: dict[str, Any]


class EngineEntry(msgspec.Struct):
    """One engine of the group as a worker learns it."""

    index: int
    rank: int
    role: str = "aggregated"
    output_address: str = ""
    registration: EngineRegistration | None = None


class Engines(msgspec.Struct, tag_field="op", tag="engines"):
    """The group is ready: every engine (registered or not)."""

    engines: list[EngineEntry]


class EngineUpdate(msgspec.Struct, tag_field="op", tag="engine"):
    """One engine registered again (a restarted rank, or one taken over)."""

    engine: EngineEntry


class Failed(msgspec.Struct, tag_field="op", tag="failed"):
    """The handshake failed (``kind`` "timeout") or the attach was refused ("refused")."""

    kind: str
    error: str


#: What the I/O process may send a worker.
ToWorker = Attached | Engines | EngineUpdate | Failed
#: What a worker may send the I/O process.
ToIO = Attach

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


def frame(message: object) -> bytes:
    """One framed control message (a Struct of this module; tests also frame raw maps)."""
    body = _encode(message)
    return LENGTH.pack(len(body)) + body


class Unframer:
    """Splits a byte stream into control messages of one direction."""

    def __init__(self, kind: Any) -> None:
        self._kind = kind

    def split(self, buffer: bytearray) -> list[Any]:
        """Take every complete message off the front of ``buffer``; raise `ControlError` on a
        length over `MAX_MESSAGE` or a body that is not a message of this direction."""
        out = []
        while len(buffer) >= LENGTH.size:
            (n,) = LENGTH.unpack_from(buffer)
            if n > MAX_MESSAGE:
                raise ControlError(f"control message of {n} bytes is over the {MAX_MESSAGE} limit")
            if len(buffer) < LENGTH.size + n:
                break
            body = bytes(buffer[LENGTH.size : LENGTH.size + n])
            del buffer[: LENGTH.size + n]
            try:
                # Decoded as a map first: a lone Struct type (one direction has one message)
                # would take a map without its tag, and a message is nothing without its op.
                raw = _decode(body)
                if not isinstance(raw, dict) or not isinstance(raw.get("op"), str):
                    raise ControlError("control message without an 'op'")
                out.append(msgspec.convert(raw, self._kind))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise ControlError(f"not a control message: {exc}") from None
        return out


__all__ = [
    "MAX_MESSAGE",
    "Attach",
    "Attached",
    "ControlError",
    "EngineEntry",
    "EngineUpdate",
    "Engines",
    "Failed",
    "ToIO",
    "ToWorker",
    "Unframer",
    "frame",
]
