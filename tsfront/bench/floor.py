"""The send floor: the CPU one streamed event costs the kernel of the server that writes it.

A server that streams one token per event writes once per token per stream; every such
server (``tsfront serve``, SMG) pays that write whatever its language. On loopback the
receiver's TCP path and its wake-up run inside the writer's ``send``, so the figure is what
a ``send`` of one event costs the writing process. It is measured the way ``bench serve``
loads a server: ``connections`` clients, each getting one event of ``event_bytes`` per
``step_ms`` burst, the clients in another process draining their sockets; the sender's own
thread CPU (user + system) over the events sent. ``bench serve`` reports it beside the
servers' figures, measured in the same run, so that a target can be read against it.
"""

from __future__ import annotations

import multiprocessing
import resource
import selectors
import socket
import time
from multiprocessing.connection import Connection

__all__ = ["drain_connections", "measure_floor"]


def drain_connections(port: int, connections: int, total: int, ready: Connection) -> None:
    """A reader process's body: open ``connections`` to ``port``, say so on ``ready``, then read
    whatever arrives until ``total`` bytes came or a connection is closed."""
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(connections):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        socks.append(s)
    ready.send(True)
    got = 0
    while got < total:
        for key, _ in sel.select(timeout=10):
            try:
                # Only sockets are registered; typeshed's SelectorKey.fileobj is not generic.
                data = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            if not data:
                return
            got += len(data)
    for s in socks:
        s.close()


def measure_floor(
    connections: int = 64, events: int = 32_000, step_ms: float = 2.0, event_bytes: int = 190
) -> dict:
    """CPU µs per event ``send`` to a loopback client; ``{"us_per_event", "sys_us_per_event",
    "connections", "event_bytes", "events"}``. The user/system split is the kernel's
    tick-sampled one (coarse); the sum is exact."""
    payload = b"x" * event_bytes
    rounds = max(1, events // connections)
    events = rounds * connections
    ctx = multiprocessing.get_context("spawn")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(connections)
        ours, theirs = ctx.Pipe()
        reader = ctx.Process(
            target=drain_connections,
            args=(listener.getsockname()[1], connections, events * event_bytes, theirs),
            daemon=True,
        )
        reader.start()
        conns = []
        try:
            for _ in range(connections):
                conn, _ = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns.append(conn)
            if not ours.poll(30):
                raise RuntimeError("the floor's reader did not connect")
            ours.recv()
            step = step_ms / 1000
            before = resource.getrusage(resource.RUSAGE_THREAD)
            next_burst = time.monotonic()
            for _ in range(rounds):
                for conn in conns:
                    conn.sendall(payload)
                next_burst += step
                pause = next_burst - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # pacing the load, as the engines' steps do
            after = resource.getrusage(resource.RUSAGE_THREAD)
            reader.join(60)
        finally:
            for conn in conns:
                conn.close()
            if reader.is_alive():
                reader.kill()
                reader.join()
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    return {
        "us_per_event": (user + system) / events * 1e6,
        "sys_us_per_event": system / events * 1e6,
        "connections": connections,
        "event_bytes": event_bytes,
        "events": events,
    }
