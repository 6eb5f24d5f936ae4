"""The baselines, each a process body driven over a `multiprocessing` pipe.

Every one binds a PULL (TCP loopback, like tsfront's output sockets), tells the driver its
address, receives the same pre-encoded frames from a replay pusher, and reports when it has
seen ``frames`` of them. The driver reads the process's CPU from /proc around the run.

* ``recv`` — the floor: a pyzmq PULL receiving and discarding;
* ``recv_port`` — the floor of tsfront's own receive path: a `tsfront.io.outputs.OutputPort`
  (ZMTP read on the caller's thread, no libzmq) polled, read and taken from, discarding;
* ``decode`` — the floor plus :func:`tsfront.wire.decode_output` on each frame;
* ``recv_lat`` — the floor, reading the first row's send stamp: the ZMQ hop's latency;
* ``forward`` — per-batch forwarding (SGLang's multi-tokenizer shape): decode each batch,
  split it per worker by rid, re-encode each share, send it over a ZMQ ipc PUSH per worker;
  ``forward_sink`` is such a worker (receives and decodes its shares);
* ``single`` — one asyncio process doing the I/O and consuming every stream with one task
  per stream (decode, route by rid, deliver a chunk, wake the awaiting task).

And the floor of a request submitted alone (`submit_floor_main`, `wake_sink_main`): a Python
process asleep in epoll, woken by another process's write, that reads the wake-up and sends
one ADD-sized message over TCP loopback to a process asleep in ``recv``: what any I/O process
in Python pays for a lone request before it does anything of its own.
"""

from __future__ import annotations

import asyncio
import collections
import os
import select
import socket
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import cast

import zmq

from tsfront.bench.replay import STAMP_MASK
from tsfront.io.outputs import OutputPort
from tsfront.wire import BatchTokenIDOutSlim, decode_output, encode_output

# The benchmark's engines send output batches only, never the ENGINE_DEAD sentinel: the same
# decoder, typed for that (nothing added per frame).
_decode_batch = cast("Callable[[bytes], BatchTokenIDOutSlim]", decode_output)


def _bind_pull(ctx: zmq.Context) -> tuple[zmq.Socket, str]:
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind("tcp://127.0.0.1:*")
    return pull, pull.getsockopt_string(zmq.LAST_ENDPOINT)


def receiver_main(conn: Connection, mode: str, options: dict) -> None:
    """Process body of the ``recv``, ``decode``, ``recv_lat``, ``forward`` and sink modes."""
    if mode == "recv_port":
        _port_main(conn)
        return
    ctx = zmq.Context(1)
    if mode == "forward_sink":
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, 0)
        pull.setsockopt(zmq.LINGER, 0)
        pull.connect(options["address"])
        address = options["address"]
    else:
        pull, address = _bind_pull(ctx)
    pushes = []
    if mode == "forward":
        for w in range(options["workers"]):
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.SNDHWM, 0)
            push.setsockopt(zmq.LINGER, 1000)
            push.bind(f"ipc://@tsfront-bench-fwd-{options['token']}-{w}")
            pushes.append(push)
    conn.send(("ready", address))
    recv = pull.recv
    try:
        while True:
            cmd, *args = conn.recv()
            if cmd == "exit":
                break
            frames = args[0]
            lat: list[int] = []
            if mode == "recv":
                for _ in range(frames):
                    recv()
            elif mode == "decode":
                for _ in range(frames):
                    decode_output(recv())
            elif mode == "recv_lat":
                off = options["offset"]
                for _ in range(frames):
                    f = recv()
                    now = time.monotonic_ns() // 100
                    stamp = int.from_bytes(f[off : off + 4], "big")
                    lat.append(((now - stamp) & STAMP_MASK) * 100)
            elif mode == "forward":
                _forward(recv, pushes, options["owner"], frames)
            elif mode == "forward_sink":
                rows = 0
                while rows < frames:  # counted in rows: a sink gets shares, not frames
                    rows += len(_decode_batch(recv()).rids)
            conn.send(("done", lat))
    finally:
        pull.close()
        for p in pushes:
            p.close()
        ctx.term()


def _port_main(conn: Connection) -> None:
    """``recv_port``: frames counted as `OutputPort` gives them, as the I/O loop reads it."""
    port = OutputPort("tcp://127.0.0.1:0", 1.0, 2.0)
    poller = select.poll()
    poller.register(port.listener.fileno(), select.POLLIN)
    conn.send(("ready", port.address))
    try:
        while True:
            cmd, *args = conn.recv()
            if cmd == "exit":
                break
            got = 0
            while got < args[0]:
                for fd, _ in poller.poll(1000):
                    if fd == port.listener.fileno():
                        for new in port.accept(time.monotonic()):
                            poller.register(new, select.POLLIN)
                    elif not port.read(fd, time.monotonic()):
                        poller.unregister(fd)
                while (item := port.take()) is not None:
                    got += type(item) is bytes
            conn.send(("done", []))
    finally:
        port.close()


def _forward(
    recv: Callable[[], bytes], pushes: list[zmq.Socket], owner: dict[str, int], frames: int
) -> None:
    """Decode, split per worker, re-encode, send: what a per-batch forwarding I/O does."""
    nw = len(pushes)
    for _ in range(frames):
        batch = _decode_batch(recv())
        shares: list[list[int]] = [[] for _ in range(nw)]
        for i, rid in enumerate(batch.rids):
            shares[owner[rid]].append(i)
        for w, idx in enumerate(shares):
            if not idx:
                continue
            share = BatchTokenIDOutSlim(
                rids=[batch.rids[i] for i in idx],
                output_ids=[batch.output_ids[i] for i in idx],
                finished_reasons=[batch.finished_reasons[i] for i in idx],
                prompt_tokens=[batch.prompt_tokens[i] for i in idx],
                completion_tokens=[batch.completion_tokens[i] for i in idx],
                cached_tokens=[batch.cached_tokens[i] for i in idx],
                output_token_logprobs_val=[batch.output_token_logprobs_val[i] for i in idx],
                output_token_logprobs_idx=[batch.output_token_logprobs_idx[i] for i in idx],
                engine_index=batch.engine_index,
                num_running=batch.num_running,
                num_waiting=batch.num_waiting,
                kv_active_pages=batch.kv_active_pages,
                kv_total_pages=batch.kv_total_pages,
            )
            pushes[w].send(encode_output(share))


# ----------------------------------------------------------------------------- single process


class _Chunk:
    __slots__ = ("completion_tokens", "finish_reason", "output_ids", "rid")

    def __init__(
        self, rid: str, output_ids: list[int], finish_reason: str | None, completion_tokens: int
    ) -> None:
        self.rid = rid
        self.output_ids = output_ids
        self.finish_reason = finish_reason
        self.completion_tokens = completion_tokens


class _Stream:
    """A minimal per-request stream: pending chunks plus the awaiting task's future."""

    __slots__ = ("done", "loop", "pending", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: collections.deque = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.done = False

    def deliver(self, chunk: _Chunk) -> None:
        self.pending.append(chunk)
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next(self) -> _Chunk | None:
        while True:
            if self.pending:
                return self.pending.popleft()
            if self.done:
                return None
            self.waiter = self.loop.create_future()
            await self.waiter
            self.waiter = None


def single_main(conn: Connection, rids: list[str], use_uvloop: bool) -> None:
    """Process body of the single-process baseline."""
    if use_uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(_single(conn, rids))


async def _single(conn: Connection, rids: list[str]) -> None:
    loop = asyncio.get_running_loop()
    ctx = zmq.Context(1)
    pull, address = _bind_pull(ctx)
    conn.send(("ready", address))
    commands: asyncio.Queue = asyncio.Queue()
    loop.add_reader(conn.fileno(), lambda: commands.put_nowait(conn.recv()))
    os.set_blocking(conn.fileno(), True)  # uvloop made it non-blocking; big replies
    fd = cast(int, pull.getsockopt(zmq.FD))  # ZMQ_FD is an int option
    try:
        while True:
            cmd, *_args = await commands.get()
            if cmd == "exit":
                break
            streams = {rid: _Stream(loop) for rid in rids}
            counts = [0, 0]

            def on_readable(streams: dict[str, _Stream] = streams) -> None:
                while True:
                    try:
                        frame = pull.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        return
                    b = _decode_batch(frame)
                    for rid, ids, fin, comp in zip(
                        b.rids, b.output_ids, b.finished_reasons, b.completion_tokens
                    ):
                        s = streams.get(rid)
                        if s is None:
                            continue
                        s.deliver(_Chunk(rid, ids, fin or None, comp))
                        if fin:
                            s.done = True

            async def consume(s: _Stream, counts: list[int] = counts) -> None:
                while True:
                    c = await s.next()
                    if c is None:
                        return
                    counts[0] += 1
                    counts[1] += len(c.output_ids)
                    if c.finish_reason is not None:
                        return

            tasks = [asyncio.ensure_future(consume(s)) for s in streams.values()]
            loop.add_reader(fd, on_readable)
            on_readable()
            conn.send(("armed",))
            await asyncio.gather(*tasks)
            loop.remove_reader(fd)
            conn.send(("done", counts))
    finally:
        pull.close()
        ctx.term()


#: The floor's message: about an ADD of the heap session's requests.
SUBMIT_FLOOR_BYTES = 256


def wake_sink_main(conn: Connection) -> None:
    """The floor's engine: accepts one TCP connection, reads until it has ``n`` messages'
    bytes (asleep in ``recv`` between them), says so."""
    listener = socket.create_server(("127.0.0.1", 0))
    conn.send(("ready", listener.getsockname()[1]))
    try:
        while True:
            cmd, *args = conn.recv()
            if cmd == "exit":
                break
            peer, _ = listener.accept()
            want, got = args[0] * SUBMIT_FLOOR_BYTES, 0
            with peer:
                while got < want:
                    data = peer.recv(1 << 16)
                    if not data:
                        break
                    got += len(data)
            conn.send(("got", got))
    finally:
        listener.close()


def submit_floor_main(conn: Connection, sink_port: int) -> None:
    """The floor of a lone request: asleep in epoll on a UNIX socket another process writes a
    byte to per request; each byte read, one message sent to the sink."""
    name = f"\0tsfront-bench-floor-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen(1)
    conn.send(("ready", name))
    try:
        while True:
            cmd, *args = conn.recv()
            if cmd == "exit":
                break
            n = args[0]
            waker, _ = listener.accept()
            engine = socket.create_connection(("127.0.0.1", sink_port))
            engine.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            poll = select.epoll()
            poll.register(waker.fileno(), select.EPOLLIN)
            message = b"x" * SUBMIT_FLOOR_BYTES
            served = 0
            conn.send(("serving",))  # set up: the driver's measurement starts now
            try:
                while served < n:
                    poll.poll(5.0)
                    data = waker.recv(4096)
                    if not data:
                        break
                    for _ in data:
                        engine.send(message)
                    served += len(data)
            finally:
                poll.close()
                waker.close()
                engine.close()
            conn.send(("served", served))
    finally:
        listener.close()
