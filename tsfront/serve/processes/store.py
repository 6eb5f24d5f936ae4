"""The stored responses of ``/v1/responses``: a bounded map shared by a server's workers.

`Memory` is the map: (owner, response id) → an opaque blob (the response object and the
conversation it ends, as `tsfront.serve.responses.endpoints` encodes them), bounded by a count and
by the bytes of its blobs. Every operation names the owner, the handle of the API key that made
the request (`tsfront.serve.edge.gate`; one shared owner without keys): an object is found, replaced
and deleted only under the owner that put it, so another key's request finds nothing, exactly
as for an id never stored. Past a bound, the owner holding the most (entries or bytes, the
bound passed) loses its least recently used object: with one owner this is plain LRU; with
several, one owner's puts evict another's objects only while that other holds more. A blob
larger than the byte bound is not kept.

``tsfront serve`` runs one `Memory` in a store process of its own (`StoreProcess`, started
by the master: ``python -m tsfront.serve.processes.store``) that serves it on an abstract unix
socket (a name, no file: nothing is left when it stops) to the same user only (``SO_PEERCRED``); the
workers talk to it with `StoreClient`, one connection each, every operation under a timeout,
so a store that is slow or gone costs a request at most `STORE_TIMEOUT_S` and a 503
(`StoreUnavailable`), never a wedged worker loop. The process dies with the master
(PR_SET_PDEATHSIG); the master replaces one that exits (empty, on the same address, which
the workers' clients connect to again by themselves); a restart loses what it held. An
embedded `ServeApp` (no master) keeps an in-process `LocalStore` instead.

Frames are a 4-byte big-endian length and a msgpack array: ``[op, owner, id, blob]`` asked
(op ``get``, ``put``, ``delete``), ``[ok, blob]`` answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
from collections import OrderedDict
from typing import Any

import msgspec

from tsfront.process.child import python_module
from tsfront.process.sigint import hold_sigint, ignore_sigint
from tsfront.process.title import set_title

__all__ = [
    "STORE_TIMEOUT_S",
    "LocalStore",
    "Memory",
    "StoreClient",
    "StoreProcess",
    "StoreUnavailable",
]

#: Seconds one store operation may take before the request gets a 503.
STORE_TIMEOUT_S = 2.0
#: Default bounds (``--responses-store-items``, ``--responses-store-bytes``).
DEFAULT_ITEMS = 10_000
DEFAULT_BYTES = 256 * 1024 * 1024
_HEADER = struct.Struct(">I")
#: A frame larger than this is a broken peer: the connection is closed.
_MAX_FRAME = 1 << 30
_ENCODE = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder(list)
_PR_SET_PDEATHSIG = 1


class StoreUnavailable(Exception):
    """The store did not answer (down, or slower than `STORE_TIMEOUT_S`)."""


class Memory:
    """Each owner's objects (id → bytes), bounded together by ``items`` entries and ``size``
    bytes of values; past a bound the largest holder's least recently used object goes."""

    def __init__(self, items: int = DEFAULT_ITEMS, size: int = DEFAULT_BYTES) -> None:
        self.items = items
        self.size = size
        self.bytes = 0
        self.count = 0
        # owner → its objects, least recently used first; owner → the bytes they hold.
        self._owners: dict[str, OrderedDict[str, bytes]] = {}
        self._held: dict[str, int] = {}

    def __len__(self) -> int:
        return self.count

    def get(self, owner: str, key: str) -> bytes | None:
        objects = self._owners.get(owner)
        if objects is None:
            return None
        value = objects.get(key)
        if value is not None:
            objects.move_to_end(key)
        return value

    def put(self, owner: str, key: str, value: bytes) -> bool:
        """Keep ``value`` (False: not kept, as larger than the byte bound alone, or evicted at
        once because its owner would otherwise hold the most of a full store)."""
        self.delete(owner, key)
        if len(value) > self.size or self.items < 1:
            return False
        self._owners.setdefault(owner, OrderedDict())[key] = value
        self._held[owner] = self._held.get(owner, 0) + len(value)
        self.count += 1
        self.bytes += len(value)
        while self.count > self.items or self.bytes > self.size:
            self._evict(by_bytes=self.bytes > self.size)
        objects = self._owners.get(owner)
        return objects is not None and key in objects

    def delete(self, owner: str, key: str) -> bool:
        objects = self._owners.get(owner)
        value = None if objects is None else objects.pop(key, None)
        if value is None:
            return False
        self._forget(owner, len(value))
        return True

    def apply(self, op: str, owner: str, key: str, value: bytes | None) -> list[Any]:
        """One framed operation → its answer ``[ok, blob]``."""
        if op == "get":
            found = self.get(owner, key)
            return [found is not None, found]
        if op == "put" and value is not None:
            return [self.put(owner, key, value), None]
        if op == "delete":
            return [self.delete(owner, key), None]
        return [False, None]

    def _evict(self, *, by_bytes: bool) -> None:
        # The owner holding the most of the bound that is passed loses its oldest object.
        held = self._held if by_bytes else {o: len(objs) for o, objs in self._owners.items()}
        owner = max(held, key=held.__getitem__)
        _, value = self._owners[owner].popitem(last=False)
        self._forget(owner, len(value))

    def _forget(self, owner: str, size: int) -> None:
        self.count -= 1
        self.bytes -= size
        self._held[owner] -= size
        if not self._owners[owner]:
            del self._owners[owner], self._held[owner]


class LocalStore:
    """The store of one process (an embedded `ServeApp`): a `Memory` behind `StoreClient`'s
    interface."""

    def __init__(self, items: int = DEFAULT_ITEMS, size: int = DEFAULT_BYTES) -> None:
        self.memory = Memory(items, size)

    async def get(self, owner: str, key: str) -> bytes | None:
        return self.memory.get(owner, key)

    async def put(self, owner: str, key: str, value: bytes) -> bool:
        return self.memory.put(owner, key, value)

    async def delete(self, owner: str, key: str) -> bool:
        return self.memory.delete(owner, key)

    async def close(self) -> None:
        return None


class StoreClient:
    """A worker's connection to the store process at ``address`` (made on first use, made
    again after a failure); operations run one at a time, each within ``timeout`` seconds."""

    def __init__(self, address: str, timeout: float = STORE_TIMEOUT_S) -> None:
        self.address = address
        self.timeout = timeout
        self._lock = asyncio.Lock()
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self, owner: str, key: str) -> bytes | None:
        ok, blob = await self._ask("get", owner, key, None)
        return blob if ok else None

    async def put(self, owner: str, key: str, value: bytes) -> bool:
        ok, _ = await self._ask("put", owner, key, value)
        return bool(ok)

    async def delete(self, owner: str, key: str) -> bool:
        ok, _ = await self._ask("delete", owner, key, None)
        return bool(ok)

    async def close(self) -> None:
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn[1].close()

    async def _ask(self, op: str, owner: str, key: str, value: bytes | None) -> list[Any]:
        try:
            async with asyncio.timeout(self.timeout):
                async with self._lock:
                    try:
                        return await self._exchange([op, owner, key, value])
                    except BaseException:
                        self._drop()  # a half-read answer would be the next one's
                        raise
        except (OSError, TimeoutError, EOFError, ValueError, msgspec.DecodeError) as exc:
            raise StoreUnavailable(
                f"the responses store did not answer ({type(exc).__name__}: {exc})"
            ) from None

    async def _exchange(self, ask: list[Any]) -> list[Any]:
        if self._conn is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, self.address)
            except BaseException:
                sock.close()
                raise
            self._conn = await asyncio.open_unix_connection(sock=sock)
        reader, writer = self._conn
        frame = _ENCODE.encode(ask)
        writer.write(_HEADER.pack(len(frame)) + frame)
        await writer.drain()
        answer = await _read_frame(reader)
        if answer is None:
            raise EOFError("the store closed the connection")
        return answer


async def _read_frame(reader: asyncio.StreamReader) -> list[Any] | None:
    try:
        head = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError:
        return None
    (length,) = _HEADER.unpack(head)
    if length > _MAX_FRAME:
        raise ValueError(f"a frame of {length} bytes")
    message = _DECODE.decode(await reader.readexactly(length))
    if len(message) not in (2, 4):
        raise ValueError("a frame that is not [op, owner, id, blob] / [ok, blob]")
    return message


# ---------------------------------------------------------------------- the store process


def new_address() -> str:
    """A fresh abstract unix socket name (leading NUL: no file in the filesystem)."""
    return f"\0tsfront-responses-{os.getpid()}-{secrets.token_hex(6)}"


async def _serve_connection(
    memory: Memory, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    sock = writer.get_extra_info("socket")
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            return
        while True:
            message = await _read_frame(reader)
            if message is None or len(message) != 4:
                return
            op, owner, key, value = message
            if not (isinstance(op, str) and isinstance(owner, str) and isinstance(key, str)):
                return
            answer = _ENCODE.encode(memory.apply(op, owner, key, value))
            writer.write(_HEADER.pack(len(answer)) + answer)
            await writer.drain()
    except (OSError, ValueError, asyncio.IncompleteReadError, msgspec.DecodeError):
        return
    finally:
        writer.close()


async def _serve(address: str, items: int, size: int, ready: Any) -> None:
    memory = Memory(items, size)
    server = await asyncio.start_unix_server(
        lambda r, w: _serve_connection(memory, r, w), path=address
    )
    ready.write("ready\n")
    ready.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


def store_main(argv: list[str] | None = None) -> int:
    """Entry point of the store process (``python -m tsfront.serve.processes.store ADDRESS ITEMS
    BYTES PARENT``): serve `Memory` on ``ADDRESS`` until SIGTERM or the parent's death; prints
    ``ready`` once it serves."""
    address, items, size, parent = (argv if argv is not None else sys.argv[1:])[:4]
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):
        return 0  # the parent died before PR_SET_PDEATHSIG took: nothing to serve
    ignore_sigint()  # Ctrl-C goes to the master (held off by it while we started)
    set_title("store")
    asyncio.run(_serve(address.replace("@", "\0", 1), int(items), int(size), sys.stdout))
    return 0


class StoreProcess:
    """The store process of a ``tsfront serve`` master
    (``python -m tsfront.serve.processes.store``)."""

    def __init__(self, proc: subprocess.Popen[bytes], address: str, items: int, size: int):
        self.proc = proc
        self.address = address
        self._again = (items, size)

    @classmethod
    def start(
        cls, items: int, size: int, timeout: float = 30.0, address: str | None = None
    ) -> StoreProcess:
        """Start the process (on ``address``, else a fresh one) and wait until it serves."""
        address = address or new_address()
        hold = hold_sigint()
        try:
            proc = subprocess.Popen(
                python_module(
                    "tsfront.serve.processes.store",
                    address.replace("\0", "@", 1), str(items), str(size), str(os.getpid()),
                ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
            )  # fmt: skip
        finally:
            hold.release()
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], timeout)[0]
        line = proc.stdout.readline() if ready else b""
        proc.stdout.close()
        if line.strip() != b"ready":
            proc.kill()
            proc.wait()
            raise RuntimeError("the responses store process did not start")
        return cls(proc, address, items, size)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def restart(self) -> StoreProcess:
        """A new, empty store on the same address (this one exited: what it held is lost)."""
        self.stop()
        items, size = self._again
        return StoreProcess.start(items, size, address=self.address)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()


if __name__ == "__main__":
    raise SystemExit(store_main())
