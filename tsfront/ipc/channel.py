"""The control channel between the I/O process and each worker.

One AF_UNIX stream connection per worker, on an abstract-namespace address (nothing on disk to
clean up). It carries a handful of msgpack maps, each behind a 4-byte little-endian length, and
the two file descriptors the design passes (the worker's eventfd one way, the slot region's
memfd the other) as SCM_RIGHTS. Its end-of-file is how each side learns that the other died:
the kernel closes it for a crashed process, so no heartbeat is needed on this hop.

The messages themselves (msgspec Structs tagged by ``op``) and their framing are
`tsfront.ipc.control`'s; this module is the socket side.
"""

from __future__ import annotations

import array
import os
import socket
from typing import Any

from tsfront.ipc.control import MAX_MESSAGE, ControlError, Unframer, frame

ADDRESS_PREFIX = "unix:@"


def socket_name(address: str) -> bytes:
    """The abstract socket name behind an ``unix:@NAME`` address."""
    if not address.startswith(ADDRESS_PREFIX) or len(address) <= len(ADDRESS_PREFIX):
        raise ValueError(f"{address!r} is not a tsfront I/O address (expected 'unix:@NAME')")
    return b"\0" + address[len(ADDRESS_PREFIX) :].encode()


def pack(message: object) -> bytes:
    """One framed control message (see `tsfront.ipc.control.frame`)."""
    return frame(message)


def send(sock: socket.socket, message: object, fds: list[int] | None = None) -> None:
    """Send one message (blocking), with file descriptors attached if given."""
    data = pack(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)


class MessageReader:
    """Reassembles framed messages of one direction (``kind``: `tsfront.ipc.control.ToIO` or
    `ToWorker`) and received fds from a non-blocking stream socket."""

    def __init__(self, sock: socket.socket, kind: Any) -> None:
        self.sock = sock
        self._unframer = Unframer(kind)
        self.buffer = bytearray()
        self.fds: list[int] = []
        self.eof = False

    def feed(self) -> list[Any]:
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

    def _split(self) -> list[Any]:
        return self._unframer.split(self.buffer)

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


__all__ = [
    "ADDRESS_PREFIX",
    "MAX_MESSAGE",
    "ControlError",
    "MessageReader",
    "pack",
    "send",
    "socket_name",
]
