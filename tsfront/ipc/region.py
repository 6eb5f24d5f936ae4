"""The shared-memory region: creation by the I/O process, mapping by workers.

The region is an anonymous memfd (no name in /dev/shm, so nothing can outlive its last
holder), passed to each worker over its control socket. Its layout comes from
`tsfront._native.layout`; the slot rings are read and written only by native code. This
module also gives numpy views of the engine table, which the I/O process alone writes:
advisory, naturally aligned single-word values (liveness and load) that need no ordering.
After the native layout, from the next page, comes the metrics area (`tsfront.metrics.layout`:
one block per worker place and one for the I/O process), read and written through `words`.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from tsfront import _native
from tsfront.ipc.codes import (
    E_IN_FLIGHT,
    E_INDEX,
    E_KV_ACTIVE,
    E_KV_TOTAL,
    E_LOAD_MS_HI,
    E_LOAD_MS_LO,
    E_REQUESTS_HI,
    E_REQUESTS_LO,
    E_RUNNING,
    E_STATE,
    E_WAITING,
    ENGINE_ABSENT,
    ENGINE_DEAD,
    ENGINE_HANDSHAKING,
    ENGINE_LIVE,
    ENGINE_STALLED,
    ENGINE_WORDS,
    FIN_DEADLINE,
    FIN_DUPLICATE,
    FIN_ENGINE_DEAD,
    FIN_ENGINE_STALLED,
    FIN_IO_STOPPING,
    FIN_NO_ENGINE,
    FIN_PREFILL_ABORTED,
    FIN_PREFILL_DEAD,
    FIN_PREFILL_SEND_TIMEOUT,
    FIN_RID_ABORTED,
    FIN_SEND_TIMEOUT,
    SERVING_STATES,
)
from tsfront.metrics.layout import MetricsLayout

# Counters the I/O process publishes at header offset 64 (u64 each), in this order.
METRICS = (
    "frames",
    "rows",
    "tokens",
    "unknown_rows",
    "spilled_tokens",
    "wakes",
    "in_flight",
    "spilling_slots",
    "notify_overflows",
)
METRICS_OFFSET = 64

# Counters of the I/O loop itself (Python side), u64 each at header offset 2048, in this order
# (the native counters above use offsets 64..; the header is 4 KiB):
#   handler_errors      frames or events whose handler raised something unexpected (the frame
#                       was dropped, the loop kept serving; each is logged, rate-limited)
#   output_disconnects  connections lost on the engines' output ports
#   stale_disconnects   of those, connections of an engine's earlier process (never a death)
#   reused_rids         ADDs refused because the rid was aborted on that engine < 300 s ago
#   orphan_aborts       rids of a predecessor I/O process, still decoding on an engine this one
#                       took over, aborted there (once each; see tsfront.io.adoption)
#   ring_submissions, zmq_submissions, bad_ring_records, ring_wakeups: see below
#   stall_probes        probes the I/O process sent to stalled engines (tsfront.io.probes)
#   stall_failures      times an engine stayed stalled for stall_fail_timeout (its requests
#                       then end with EngineStalled; each request counts in the workers')
#   turns               turns of the I/O loop (each wait and what it woke for)
#   native_turns        of those, the turns made wholly in native code (tsfront._native.Turn:
#                       the rings' wake-ups and the ADDs it places; docs/DESIGN.md, "The native
#                       turn")
IO_METRICS = (
    "handler_errors",
    "output_disconnects",
    "stale_disconnects",
    "reused_rids",
    # Prefix affinity (tsfront.io.affinity): placements load took from the longest match, and
    # ADDs whose worker-sent block hashes were not usable (hashed by the I/O process instead).
    "affinity_fallbacks",
    "affinity_rehashed",
    "orphan_aborts",
    # Submissions (tsfront.io.loop): records taken from the workers' submission rings,
    # submissions that came over ZMQ (too large for a ring, or behind one that did), ring
    # contents dropped as corrupt, and the turns a worker's doorbell woke the parked I/O
    # process (at most one per worker loop turn; DESIGN.md, "The submission rings").
    "ring_submissions",
    "zmq_submissions",
    "bad_ring_records",
    "ring_wakeups",
    "stall_probes",
    "stall_failures",
    "turns",
    "native_turns",
)
IO_METRICS_OFFSET = 2048

FINISH_REASONS: dict[int, str] = {
    _native.FIN_STOP: "stop",
    _native.FIN_LENGTH: "length",
    _native.FIN_ABORT: "abort",
    _native.FIN_OTHER: "other",
}


@dataclass(frozen=True)
class Geometry:
    """The numbers that fix a region's layout (``submit_ring_bytes``: each worker's
    submission ring, 0 for none)."""

    num_workers: int
    slots_per_worker: int
    ring_capacity: int
    max_engines: int
    submit_ring_bytes: int = 0

    def layout(self) -> dict[str, int]:
        """Offsets and sizes, from the native module (the single source of truth)."""
        return _native.layout(
            num_workers=self.num_workers,
            slots_per_worker=self.slots_per_worker,
            ring_capacity=self.ring_capacity,
            max_engines=self.max_engines,
            submit_ring_bytes=self.submit_ring_bytes,
        )


class Region:
    """A mapping of the shared region (the I/O process's or a worker's)."""

    def __init__(self, fd: int, geometry: Geometry) -> None:
        self.fd = fd
        self.geometry = geometry
        self.layout = geometry.layout()
        self.metrics_layout = MetricsLayout.after(
            self.layout["total_bytes"], geometry.num_workers, geometry.max_engines
        )
        self.size = self.metrics_layout.total_bytes
        self._views: list[memoryview] = []
        self.map = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        off = self.layout["engines_off"]
        self.engines = np.frombuffer(
            self.map, dtype="<u4", count=geometry.max_engines * ENGINE_WORDS, offset=off
        ).reshape(geometry.max_engines, ENGINE_WORDS)
        #: The same table as u32 words (row r's word k at ``r * ENGINE_WORDS + k``): an item
        #: read is a Python int, with no array view or scalar per read (the engines' states
        #: are read per request). Released by `close`.
        self.engine_words = memoryview(self.map)[
            off : off + geometry.max_engines * ENGINE_WORDS * 4
        ].cast("I")
        self._views.append(self.engine_words)
        self.io_metrics = np.frombuffer(
            self.map, dtype="<u8", count=len(IO_METRICS), offset=IO_METRICS_OFFSET
        )

    @classmethod
    def create(cls, geometry: Geometry) -> Region:
        """Make a fresh region (I/O process side)."""
        size = MetricsLayout.after(
            geometry.layout()["total_bytes"], geometry.num_workers, geometry.max_engines
        ).total_bytes
        fd = os.memfd_create("tsfront-slots", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            return cls(fd, geometry)
        except BaseException:
            os.close(fd)
            raise

    def metrics(self) -> dict[str, int]:
        """The I/O process's counters (see `METRICS` and `IO_METRICS`), as last published."""
        words = np.frombuffer(self.map, dtype="<u8", count=len(METRICS), offset=METRICS_OFFSET)
        values = dict(zip(METRICS, (int(v) for v in words), strict=True))
        del words
        values.update(zip(IO_METRICS, (int(v) for v in self.io_metrics), strict=True))
        return values

    def words(self, offset: int, count: int) -> memoryview:
        """``count`` u64 words at byte ``offset`` (8-byte aligned): item reads and writes are
        single 8-byte loads and stores. Released by `close`."""
        view = memoryview(self.map)[offset : offset + 8 * count].cast("Q")
        self._views.append(view)
        return view

    def read_words(self, offset: int, count: int) -> list[int]:
        """A copy of ``count`` u64 words at byte ``offset``, each read once by one 8-byte load."""
        with (
            memoryview(self.map) as whole,
            whole[offset : offset + 8 * count] as part,
            part.cast("Q") as words,
        ):
            return words.tolist()

    def engine_load_ms(self, row: int) -> int:
        """Monotonic milliseconds at which engine ``row``'s load tail was last seen (0: never)."""
        e = self.engines[row]
        return int(e[E_LOAD_MS_LO]) | (int(e[E_LOAD_MS_HI]) << 32)

    def close(self) -> None:
        """Unmap and close the fd (views must be dropped first)."""
        # Closed: the views are gone, and a use after close fails on None.
        self.engines = None  # type: ignore[assignment]
        self.io_metrics = None  # type: ignore[assignment]
        for view in self._views:
            view.release()
        self._views.clear()
        try:
            self.map.close()
        except BufferError:
            # A native Writer/Reader still holds the buffer; the mapping goes with it.
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# The ipc names above are re-exported: the region's readers take them from here.
__all__ = [
    "ENGINE_ABSENT",
    "ENGINE_DEAD",
    "ENGINE_HANDSHAKING",
    "ENGINE_LIVE",
    "ENGINE_STALLED",
    "ENGINE_WORDS",
    "E_INDEX",
    "E_IN_FLIGHT",
    "E_KV_ACTIVE",
    "E_KV_TOTAL",
    "E_LOAD_MS_HI",
    "E_LOAD_MS_LO",
    "E_REQUESTS_HI",
    "E_REQUESTS_LO",
    "E_RUNNING",
    "E_STATE",
    "E_WAITING",
    "FIN_DEADLINE",
    "FIN_DUPLICATE",
    "FIN_ENGINE_DEAD",
    "FIN_ENGINE_STALLED",
    "FIN_IO_STOPPING",
    "FIN_NO_ENGINE",
    "FIN_PREFILL_ABORTED",
    "FIN_PREFILL_DEAD",
    "FIN_PREFILL_SEND_TIMEOUT",
    "FIN_RID_ABORTED",
    "FIN_SEND_TIMEOUT",
    "IO_METRICS",
    "IO_METRICS_OFFSET",
    "METRICS",
    "METRICS_OFFSET",
    "SERVING_STATES",
    "Geometry",
    "Region",
]
