"""Benchmarks of the native hot path, in-process (no sockets): `Writer.ingest` + `Reader.poll`
per frame, and msgspec's `decode_output` on the same frame for comparison.

The end-to-end suite (processes, sockets, CPU from /proc) is ``tsfront bench``; these are its
two native building blocks, for quick regressions.
Run: ``.venv/bin/python -m pytest tsfront/bench/micro``.
"""

from __future__ import annotations

import mmap

import pytest

from tsfront import _native
from tsfront.bench.replay import build_frames, make_rids
from tsfront.wire import decode_output

RING = 256


@pytest.fixture(scope="module", params=[64, 256, 1024], ids=lambda b: f"B{b}")
def bound(request):
    rows = request.param
    lay = _native.layout(num_workers=1, slots_per_worker=rows, ring_capacity=RING, max_engines=1)
    mem = mmap.mmap(-1, lay["total_bytes"])
    writer = _native.Writer(mem, 1, rows, RING, 1)
    reader = _native.Reader(mem, 0, 1, rows, RING, 1)
    rids = make_rids("core", rows)
    for i, rid in enumerate(rids):
        writer.bind(rid.encode(), i, i + 1, False, 18, 0)
        reader.expect(i, i + 1)
    frame = build_frames(rids, 0).running[0]
    yield rows, writer, reader, frame
    del writer, reader


def test_ingest_and_poll(benchmark, bound) -> None:
    rows, writer, reader, frame = bound

    def step():
        writer.ingest(frame)
        return reader.poll()

    out = benchmark(step)
    assert len(out) == rows


def test_decode_output_same_frame(benchmark, bound) -> None:
    rows, _w, _r, frame = bound
    batch = benchmark(decode_output, frame)
    assert len(batch.rids) == rows
