"""A region with submission rings in one process, for the tests of what drains them: the
layout for a geometry, its memfd and mapping, the I/O side's `Writer` and `Intake` (every
worker's ring opened), and the rings' eventfd; `submitter` makes a worker's side on it."""

from __future__ import annotations

import mmap
import os

from tsfront import _native


class SubmitRegion:
    """``geometry``: (workers, slots per worker, ring capacity, engines); ``ring``: the bytes
    of each worker's submission ring."""

    def __init__(self, geometry: tuple[int, int, int, int], ring: int, name: str) -> None:
        self.geometry = geometry
        self.ring = ring
        self.layout = _native.layout(*geometry, submit_ring_bytes=ring)
        self.memfd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(self.memfd, self.layout["total_bytes"])
        self.map = mmap.mmap(self.memfd, self.layout["total_bytes"], mmap.MAP_SHARED)
        self.writer = _native.Writer(self.map, *geometry, submit_ring_bytes=ring)
        self.intake = _native.Intake(self.map, *geometry, ring)
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        for w in range(geometry[0]):
            self.intake.open(w)

    def submitter(self, worker: int = 0) -> _native.Submitter:
        return _native.Submitter(self.map, worker, *self.geometry, self.ring, self.efd)

    def close(self) -> None:
        del self.writer, self.intake
        try:
            self.map.close()
        except BufferError:
            pass  # a failed test's traceback still holds a view: the process frees it
        os.close(self.memfd)
        os.close(self.efd)
