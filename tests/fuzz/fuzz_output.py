"""atheris target: the output decoder a peer reaches first (native `Writer.ingest`), plus the
pure-Python `decode_output` and the handshake decoders on the same bytes.

Run: ``.venv/bin/python tests/fuzz/fuzz_output.py -max_total_time=20`` (libFuzzer flags).
Anything but a result or `WireDecodeError` is a finding; a crash in native code is one too.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from tsfront import _native
    from tsfront.errors import WireDecodeError
    from tsfront.ipc.region import Geometry, Region
    from tsfront.wire import decode_output, decode_ready_message, decode_registration

GEOMETRY = Geometry(num_workers=2, slots_per_worker=4, ring_capacity=16, max_engines=2)
REGION = Region.create(GEOMETRY)
WRITER = _native.Writer(REGION.map, 2, 4, 16, 2)
RIDS = ["r0", "r1", "r2", "r3"]


def one(data: bytes) -> None:
    for slot, rid in enumerate(RIDS):
        WRITER.unbind(slot)
        WRITER.bind(rid.encode(), slot, slot + 1, bool(slot % 2), 18, 0)
    for decode in (WRITER.ingest, decode_output, decode_ready_message, decode_registration):
        try:
            decode(data)
        except WireDecodeError:
            pass
    WRITER.flush_spills()
    WRITER.wake()


def main() -> None:
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
