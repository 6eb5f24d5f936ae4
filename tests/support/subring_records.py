"""The records of the submission-ring hammer test (test_native_subring.py), made and checked.

Record ``seq`` is a function of ``seq`` alone, so the producer process
(`tests/support/subring_writer.py`) and the consumer make and check the same bytes without
sharing anything but the ring: every seventh record is an ABORT, the others ADDs, one in three
of them with block hashes; every part starts with the 8-byte ``seq`` and its lengths come from
a hash of ``seq`` (0 .. 1/4 of the ring's largest record each, some exactly at the limit).
"""

from __future__ import annotations

import random
import struct

SEQ = struct.Struct("<Q")
POOL = random.Random(20).randbytes(1 << 16)


def lengths(seq: int, max_record: int) -> tuple[int, int, int]:
    """The three parts' extra lengths of record ``seq`` (beyond its 8-byte seq each)."""
    h = (seq * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    room = max_record - 24 - 3 * 8  # the record head and the three seqs
    if seq % 97 == 0:
        return room, 0, 0  # exactly the largest record the ring takes
    quarter = room // 4
    return (h >> 8) % quarter, (h >> 24) % quarter, (h >> 40) % quarter


def record(seq: int, max_record: int) -> tuple[int, bytes, bytes | None, bytes | None]:
    """(kind, a, b, c) of record ``seq``: kind 65 ADD or 88 ABORT, as `Intake.take` gives."""
    la, lb, lc = lengths(seq, max_record)
    tag = SEQ.pack(seq)
    at = seq % 4096
    a = tag + POOL[at : at + la]
    if seq % 7 == 0:
        return 88, a, None, None
    b = tag + POOL[at + 1 : at + 1 + lb]
    c = tag + POOL[at + 2 : at + 2 + lc] if seq % 3 == 0 else None
    return 65, a, b, c
