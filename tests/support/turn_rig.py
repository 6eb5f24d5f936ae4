"""An in-process rig around `tsfront._native.Turn` (test_native_turn.py): a region with W worker
places and their submission rings, the I/O core's accounts the turn works on (records, attached
workers, probes, counts, `Engine` objects, a `Router`), and one input lane per engine on a
socketpair whose other end is the engine (`EngineEnd`: the ZMTP messages the turn wrote).

Records are ADDs whose header the core accepts (`add_header`): slot, a ticket of the worker's
attach, a pin, a deadline; `turn_writer.py` makes the same ones in a process of its own.
"""

from __future__ import annotations

import select
import socket
import struct

from support.submit_region import SubmitRegion
from tsfront import _native
from tsfront.config import LoadBalance
from tsfront.io.engines import STEPPING, Engine, EngineState
from tsfront.io.loop import NATIVE_COUNTS, NATIVE_POLICY
from tsfront.io.routing import Router
from tsfront.ipc.region import IO_METRICS
from tsfront.ipc.submit import ABORT_ENTRY, SUBMIT_HEADER, ticket_base
from tsfront.wire import ADD


def serial_of(worker: int) -> int:
    """The attach serial the rig gives worker place ``worker``."""
    return worker + 1


def ticket(worker: int, n: int) -> int:
    """Worker ``worker``'s ``n``-th ticket (of its attach's range)."""
    return ticket_base(serial_of(worker)) + n + 1


def add_header(
    local: int, tick: int, rid: bytes, pin: int = -1, expires: float = 0.0, logprobs: int = 0
) -> bytes:
    """An ADD record's first part: the submit header, then the rid."""
    return SUBMIT_HEADER.pack(local, tick, pin, logprobs, expires, 0) + rid


def abort_entries(*pairs: tuple[int, int]) -> bytes:
    """An ABORT record: (local slot, ticket) entries."""
    return b"".join(ABORT_ENTRY.pack(local, tick) for local, tick in pairs)


class Worker:
    """An attached worker as the core keeps it (the turn reads ``serial``)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.serial = serial_of(number)


class EngineEnd:
    """The engine's end of one lane: the ZMTP messages ``[kind, payload]`` the lane wrote."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def messages(self) -> list[tuple[bytes, bytes]]:
        """Every whole message that arrived so far (never blocks)."""
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                break
            if not data:
                break
            self.buf += data
        out: list[tuple[bytes, bytes]] = []
        buf, pos = self.buf, 0
        while (message := self._message(pos)) is not None:
            parts, pos = message
            assert len(parts) == 2, f"a message of {len(parts)} frames"
            out.append((parts[0], parts[1]))
        del buf[:pos]  # a message not whole yet stays for the next call
        return out

    def _message(self, pos: int) -> tuple[list[bytes], int] | None:
        """The whole message at ``pos`` (its frames, where it ends), or None."""
        buf, parts = self.buf, []
        while True:
            if len(buf) - pos < 2:
                return None
            flags = buf[pos]
            if flags & 2:
                if len(buf) - pos < 9:
                    return None
                size, head = int.from_bytes(buf[pos + 1 : pos + 9], "big"), 9
            else:
                size, head = buf[pos + 1], 2
            if len(buf) - pos < head + size:
                return None
            parts.append(bytes(buf[pos + head : pos + head + size]))
            pos += head + size
            if not flags & 1:
                return parts, pos


class TurnRig(SubmitRegion):
    """A Turn over W worker places and E engines (see the module's doc)."""

    def __init__(
        self,
        workers: int = 1,
        engines: int = 1,
        *,
        spw: int = 64,
        ring: int = 65536,
        policy: LoadBalance = LoadBalance.LEAST_IN_FLIGHT,
        depth: int = 4096,
        enabled: bool = True,
    ) -> None:
        super().__init__((workers, spw, 16, engines), ring, "tsfront-turn-test")
        self.epoll = select.epoll()
        self.epoll.register(self.efd, select.EPOLLIN)
        self.spw = spw
        self.attached = {w: Worker(w) for w in range(workers)}
        self.engines = [Engine(row=i, index=i, state=EngineState.LIVE) for i in range(engines)]
        self.router = Router(policy, 2.0)
        self.lanes = _native.InputLanes(8, depth)
        self.ends: list[EngineEnd] = []
        self.socks: list[socket.socket] = []
        for i, e in enumerate(self.engines):
            ours, theirs = socket.socketpair()
            ours.setblocking(False)
            theirs.setblocking(False)
            self.socks.append(ours)
            self.ends.append(EngineEnd(theirs))
            self.lanes.open(i, ours.fileno(), e.identity)
        self.records: dict = {}
        self.probes: dict = {}
        self.counts = dict.fromkeys(IO_METRICS, 0)
        self.turn = _native.Turn(
            self.writer,
            self.intake,
            self.lanes,
            self.epoll.fileno(),
            self.efd,
            self.records,
            self.attached,
            self.probes,
            self.counts,
            tuple((name, IO_METRICS.index(name)) for name in NATIVE_COUNTS),
            self.engines,
            self.router,
            NATIVE_POLICY.get(policy, 4),
            2.0,
            EngineState.LIVE,
            STEPPING,
            ADD,
            spw,
            enabled,
        )

    def row_words(self, row: int) -> tuple[int, ...]:
        """Engine row ``row`` of the engine table (its 16 words)."""
        at = self.layout["engines_off"] + row * _native.ENGINE_BYTES
        return struct.unpack_from("<16I", self.map, at)

    def io_count(self, name: str) -> int:
        """An I/O counter's published word."""
        return struct.unpack_from("<Q", self.map, 2048 + 8 * IO_METRICS.index(name))[0]

    def drain_lanes(self) -> list[list[tuple[bytes, bytes]]]:
        """Every message each engine got so far, whatever the kernel had held back."""
        got: list[list[tuple[bytes, bytes]]] = [[] for _ in self.ends]
        while True:
            for i, end in enumerate(self.ends):
                got[i] += end.messages()
            pending = [i for i in range(len(self.ends)) if self.lanes.pending(i)]
            if not pending:
                return got
            for i in pending:
                self.lanes.write(i)

    def close(self) -> None:
        del self.turn
        for s in self.socks:
            s.close()
        for end in self.ends:
            end.sock.close()
        self.epoll.close()
        super().close()
