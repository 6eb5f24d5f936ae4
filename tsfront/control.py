"""The control channel between the I/O process and each worker.

One AF_UNIX stream connection per worker, on an abstract-namespace address (nothing on disk to
clean up). It carries a handful of msgpack maps, each behind a 4-byte little-endian length, and
the two file descriptors the design passes (the worker's eventfd one way, the slot region's
memfd the other) as SCM_RIGHTS. Its end-of-file is how each side learns that the other died:
the kernel closes it for a crashed process, so no heartbeat is needed on this hop.

Messages (``op`` key):
    worker → I/O: ``attach`` {pid} + [eventfd]
    I/O → worker: ``attached`` {worker, serial, ticket_base, geometry, submit, config,
                  addresses} + [memfd]
    I/O → worker: ``engines`` {engines: [registration maps]} once every engine registered,
                  ``engine`` {engine: map} when an engine re-registers after a restart,
                  ``failed`` {kind, error} if the handshake cannot complete.
"""

from __future__ import annotations

import array
import os
import socket
import struct

import msgspec

_LEN = struct.Struct("<I")
MAX_MESSAGE = 16 << 20
ADDRESS_PREFIX = "unix:@"

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict)


class ControlError(Exception):
    """The control peer sent something that is not a control message."""


def socket_name(address: str) -> bytes:
    """The abstract socket name behind an ``unix:@NAME`` address."""
    if not address.startswith(ADDRESS_PREFIX) or len(address) <= len(ADDRESS_PREFIX):
        raise ValueError(f"{address!r} is not a tsfront I/O address (expected 'unix:@NAME')")
    return b"\0" + address[len(ADDRESS_PREFIX) :].encode()


def pack(message: dict) -> bytes:
    """One framed control message."""
    body = _encoder.encode(message)
    return _LEN.pack(len(body)) + body


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    """Send one message (blocking), with file descriptors attached if given."""
    data = pack(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)


class MessageReader:
    """Reassembles framed messages (and received fds) from a non-blocking stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.fds: list[int] = []
        self.eof = False

    def feed(self) -> list[dict]:
        """Read what is available; return the complete messages. Sets `eof` on end of file."""
        while True:
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.eof = True
                break
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
                    self.fds.extend(fds)
            if not data:
                self.eof = True
                break
            self.buffer += data
            if len(data) < 65536:
                break
        return self._split()

    def _split(self) -> list[dict]:
        out = []
        while len(self.buffer) >= 4:
            (n,) = _LEN.unpack_from(self.buffer)
            if n > MAX_MESSAGE:
                raise ControlError(f"control message of {n} bytes is over the {MAX_MESSAGE} limit")
            if len(self.buffer) < 4 + n:
                break
            body = bytes(self.buffer[4 : 4 + n])
            del self.buffer[: 4 + n]
            try:
                message = _decoder.decode(body)
            except msgspec.DecodeError as exc:
                raise ControlError(f"undecodable control message: {exc}") from None
            if not isinstance(message.get("op"), str):
                raise ControlError("control message without an 'op'")
            out.append(message)
        return out

    def take_fds(self) -> list[int]:
        """The file descriptors received so far (the caller now owns them)."""
        fds, self.fds = self.fds, []
        return fds

    def close_fds(self) -> None:
        """Close any received fds nobody took."""
        for fd in self.take_fds():
            try:
                os.close(fd)
            except OSError:
                pass
