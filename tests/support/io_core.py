"""The I/O core without its shell: an `IOCore` over a real region, its `Ports` recorded.

`RecordingPorts` is what the shell (`tsfront.io.loop.IOLoop`) is to the core, minus the
sockets: every send is a list entry the test reads; what ``send_add`` answers is
``add_status`` (`SENT`, `FULL`, `UNREACHABLE`); ``output[row]`` holds the frames still waiting
in an engine's PULL, which ``drain_output`` applies as the shell does (`IOCore.on_output_seen`
once, then ``Writer.ingest`` and `IOCore.on_output` for each). `core_rig` builds the core;
`bring_live` moves an engine to LIVE through the core's public events (HELLO, registration, its
output connection), never by assignment.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import zmq

from tsfront import ClientConfig, _native
from tsfront.io.core import SENT, IOCore
from tsfront.io.engines import Engine
from tsfront.ipc.control import ToWorker
from tsfront.ipc.region import Geometry, Region
from tsfront.metrics.recorder import IOStats
from tsfront.wire import EngineRegistration, encode_hello, encode_registration


class RecordingPorts:
    """The core's `Ports`, recording each call."""

    def __init__(self) -> None:
        self.core: IOCore | None = None  # set by core_rig (drain_output applies frames to it)
        self.add_status = SENT
        self.abort_taken = True
        self.adds: list[tuple[int, bytes]] = []  # (engine index, payload)
        self.aborts: list[tuple[int, bytes]] = []
        self.inits: list[tuple[int, bytes]] = []
        self.control: list[tuple[int, ToWorker]] = []
        self.warnings: list[str] = []  # kinds
        self.output: dict[int, list[bytes]] = {}  # row → frames waiting in its PULL

    def send_add(self, engine: Engine, payload: zmq.Frame | bytes) -> int:
        if self.add_status == SENT:
            data = payload.bytes if isinstance(payload, zmq.Frame) else bytes(payload)
            self.adds.append((engine.index, data))
        return self.add_status

    def send_abort(self, engine: Engine, payload: bytes) -> bool:
        if self.abort_taken:
            self.aborts.append((engine.index, payload))
        return self.abort_taken

    def send_init(self, engine: Engine, payload: bytes) -> bool:
        self.inits.append((engine.index, payload))
        return True

    def send_control(self, worker: int, message: ToWorker, fds: list[int] | None = None) -> bool:
        self.control.append((worker, message))
        return True

    def drain_output(self, engine: Engine, limit: int) -> None:
        core = self.core
        assert core is not None
        frames = self.output.get(engine.row, [])
        taken, self.output[engine.row] = frames[:limit], frames[limit:]
        if taken:
            core.on_output_seen(engine, time.monotonic())  # once a drain, as the shell does
        for frame in taken:
            result = core.writer.ingest(frame, engine.index)
            core.on_output(engine, result, frame)
            if result is None:
                return

    def warn(self, kind: str, message: str, *args: object, exc_info=None) -> None:
        self.warnings.append(kind)


@contextlib.contextmanager
def core_rig(config: ClientConfig | None = None, writer=None) -> Iterator[IOCore]:
    """An `IOCore` over a fresh region (its native writer unless ``writer`` is given), with
    `RecordingPorts` as ``core.ports``."""
    config = config or ClientConfig(handshake_address="tcp://127.0.0.1:0")
    pd = config.routing.prefill
    engines = config.num_engines + (pd.num_engines if pd is not None else 0)
    geometry = Geometry(
        num_workers=config.max_workers,
        slots_per_worker=config.slots_per_worker,
        ring_capacity=config.ring_capacity,
        max_engines=engines,
    )
    region = Region.create(geometry)
    if writer is None:
        writer = _native.Writer(
            region.map,
            config.max_workers,
            config.slots_per_worker,
            config.ring_capacity,
            engines,
        )
    ports = RecordingPorts()
    core = IOCore(config, ports, writer, region, IOStats(region))
    ports.core = core
    try:
        yield core
    finally:
        core.writer = None  # releases the region's buffer
        region.close()


def bring_live(core: IOCore, engine: Engine, fd: int = 7) -> None:
    """HELLO (answered with INIT), a registration and an accepted output connection ``fd``:
    the engine is LIVE, as the shell would have made it."""
    group = core.group_of(engine)
    core.on_hello(group, [engine.identity, encode_hello()])
    reg = encode_registration(EngineRegistration(max_model_len=4096))
    core.on_registration(group, [engine.identity, reg])
    core.on_connection(engine, zmq.EVENT_ACCEPTED, fd)
    assert engine.live, engine.state
